"""The conditions a profile was fitted under, and where another run's differ.

A fitted profile holds for the machine and software it was measured on: the CPU (model and
the flags that pick kernels), the CPU attention path, torch threads, the kernel sweep's
process layout, the MPI library and thread level, the GPU and its driver. ``xbench fit``
records them (from the runs' metadata) in the profile's ``provenance.conditions``;
``validate`` and ``decide`` compare them with where they run and warn in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from xbench.ranks import clean_library


def _hosts(meta: dict) -> str | None:
    hosts = meta.get("hosts") or ([meta["hostname"]] if meta.get("hostname") else None)
    return ",".join(sorted(set(hosts))) if hosts else None


def _gpus(meta: dict, key: str) -> str | None:
    gpus = meta.get("gpus") or []
    return ",".join(sorted({str(g.get(key)) for g in gpus})) or None


def _condition(key: str) -> Callable[[dict], object]:
    return lambda meta: (meta.get("conditions") or {}).get(key)


class MetaField(NamedTuple):
    """One thing a run's metadata records that figures depend on."""

    name: str
    in_profile: bool  # a fitted profile records it; validate and decide warn where it differs
    # its value for compare and check, read from run.json (two runs must agree on it, unless
    # --allow names it); None: not compared between runs
    compared: Callable[[dict], object] | None


# Every such field, once, in the order messages name them. A new one is one line here.
REGISTRY: tuple[MetaField, ...] = (
    MetaField("host", False, _hosts),
    MetaField("cpu_model", True, lambda m: m.get("cpu_model")),
    MetaField("cpu_flags", True, None),
    MetaField("cpu_attention", True, _condition("cpu_attention")),
    MetaField("torch_threads", True, None),
    MetaField("kernel_layout", True, None),
    MetaField("kernel_context", True, None),
    MetaField("allocator", True, None),
    MetaField("mpi_library", True, lambda m: clean_library(m.get("mpi_library"))),
    MetaField("mpi_thread_level", True, lambda m: m.get("mpi_thread_level")),
    MetaField("gpu", True, lambda m: _gpus(m, "name")),
    MetaField("driver", True, lambda m: _gpus(m, "driver")),
    MetaField("torch", False, lambda m: m.get("torch")),
    MetaField("backend", False, lambda m: m.get("backend")),
)
# A profile's conditions; a key either side lacks (or holds None) is not compared.
FIELDS = tuple(f.name for f in REGISTRY if f.in_profile)
# What two runs must agree on to be compared (xbench compare, check)
COMPARED_FIELDS = {f.name: f.compared for f in REGISTRY if f.compared is not None}


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


def timed_on_cpu(fitted: dict) -> bool:
    """Whether a profile's kernels were timed on a CPU: its conditions name a CPU attention
    path and no GPU."""
    return bool(fitted.get("cpu_attention") and not fitted.get("gpu"))


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
