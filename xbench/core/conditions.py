"""The conditions a profile was fitted under, and where another run's differ.

A fitted profile holds for the machine and software it was measured on: the CPU (model and
the flags that pick kernels), the CPU attention path, torch threads, the kernel sweep's
process layout, the MPI library and thread level, the GPU and its driver. ``xbench fit``
records them (from the runs' metadata) in the profile's ``provenance.conditions``;
``validate`` and ``decide`` compare them with where they run and warn in one line.
"""

from __future__ import annotations

# In the order a warning names them; a key either side lacks (or holds None) is not compared.
FIELDS = (
    "cpu_model",
    "cpu_flags",
    "cpu_attention",
    "torch_threads",
    "kernel_layout",
    "kernel_context",
    "allocator",
    "mpi_library",
    "mpi_thread_level",
    "gpu",
    "driver",
)


def from_run_meta(meta: dict) -> dict:
    """The conditions a run's metadata (run.json) records."""
    found = {k: meta.get(k) for k in ("cpu_model", "cpu_flags", "mpi_library", "mpi_thread_level")}
    found.update(meta.get("conditions") or {})
    gpus = meta.get("gpus") or []
    if meta.get("device", "cpu") != "cpu" and gpus:
        found["gpu"], found["driver"] = gpus[0].get("name"), gpus[0].get("driver")
    return {k: found.get(k) for k in FIELDS if found.get(k) is not None}


def merged(metas: list[dict]) -> dict:
    """One set of conditions from several runs (a probe and a kernel sweep): the first run
    that records a field gives it; kernel runs first, since the compute terms depend on most."""
    ordered = sorted(metas, key=lambda m: m.get("command") != "kernel")
    out: dict = {}
    for meta in ordered:
        for key, value in from_run_meta(meta).items():
            out.setdefault(key, value)
    return out


def differences(fitted: dict, current: dict) -> list[tuple[str, object, object]]:
    """(field, fitted value, current value) for each field both sides know and differ on."""
    return [
        (k, fitted[k], current[k])
        for k in FIELDS
        if fitted.get(k) is not None and current.get(k) is not None and fitted[k] != current[k]
    ]


def describe(profile_name: str, diffs) -> str:
    """The one-line warning."""
    parts = "; ".join(f"{k} {fitted!s} there, {now!s} here" for k, fitted, now in diffs)
    return (
        f"profile {profile_name} was fitted under other conditions ({parts}); its figures may "
        "not hold here: refit with xbench probe + kernel + fit on this machine"
    )
