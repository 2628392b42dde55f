"""Everything one GPU can tell about xbench, in one command with a time budget.

    python benchmarks/gpu_check.py OUT_DIR [--budget 480]

Runs, in order of what matters most if time runs out, each step in its own process under its
own time limit (never past the budget), each step's output in ``OUT_DIR/STEP.log``:

1. ``env``: versions, the GPU, its clocks and power, ``xbench env``.
2. ``sweep``: the ceilings (copy, matmul) and every attention backend that runs here against
   plain torch in a CUDA graph, rows 1 / 8 / 64 x 1K-64K tokens dense and top-2048 sparse
   (``gpu_kernels.py``).
3. ``device-fit``: ``xbench kernel`` on CUDA over what ``xbench fit`` needs (attention,
   merge, gather and splice at rows 1 / 8 / 64 x 1K-64K tokens), then ``xbench fit`` of it
   onto the priors' fabrics: ``OUT_DIR/device-fit.toml`` holds this device's measured terms
   with their intervals and provenance (issue 42: the shipped profile's device terms).
4. ``gluon``: the gluon backend (warp-specialized split kernels, candidates), one kernel
   after the other: its bits on the GPU (``tests/test_gluon_kernels.py -k KERNEL``), then,
   where they hold, its times beside the triton backend's at rows 1 / 64 x 8K-64K dense
   (``gpu_kernels.py``), and its one-row time split into a fixed cost and a cost a tile,
   as ``profile`` does; each part under its own limit (``GLUON_LIMITS``), so a kernel that
   deadlocks costs that limit and the other is still run. The summary then says of each
   kernel whether docs/gpu-check.md's rule keeps it.
5. ``tiles``: the preferred tile without and with its page lookahead at one, eight and 64
   rows x 32K tokens, split counts timed one by one, the combine launched after the split
   kernel and dependent on it (``triton_tiles.py --pdl off on``): the kernel's candidates.
6. ``profile``: the triton backend's kernels one by one (torch.profiler), to see what the
   split kernel, the combine and the index preparation each cost; then, at one row over 64
   splits, the split kernel's fixed cost a call and its cost a tile.
7. ``pytest-gpu``: ``pytest -m gpu`` (among them, each kernel candidate's bits).
8. ``device-probe``: ``cuda/probe_device_main.cu`` built with nvcc against NVSHMEM's wheel
   and run: device-initiated put, put-with-signal ping-pong and block-wide put bandwidth on
   one PE (to itself, every byte checked), and the peer loops on GPU 0 (and between GPUs
   0 and 1 where the machine has two).
9. ``nvshmem``: nvshmem4py on one PE through the calls the nvshmem transport makes
   (put-with-signal, non-blocking put, quiet), 8 B and 256 MiB, bytes checked; then
   ``--initiator device``'s transport on that PE (its kernels' cubin built with nvcc,
   loaded and initialised by NVSHMEM, each kernel launched as the probe does), 8 B-256 MiB.
10. ``validate``: route, fetch and local on the GPU, two ranks sharing it, messages staged
   through host buffers, compute replayed from CUDA graphs, checked against one-instance
   attention (predictions: this run's ``device-fit.toml``, else the profile shipped for
   this kind of GPU, else the priors).
11. ``refusals``: what ``xbench probe`` says to GPU transports it cannot run on one GPU.
12. ``triton-tests``: the triton backend's numerics on this GPU's tensor cores, shape by shape.

Writes ``OUT_DIR/summary.md`` (each step's status and its figures) and prints it. Steps that
cannot run here (no nvcc, no NVSHMEM wheel, one GPU) say why in their log and the summary.
``--steps`` runs a subset; ``--device cpu`` runs the script's own plumbing on tiny shapes
under the Triton interpreter (what the test suite does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PRIORS = ROOT / "profiles" / "h100-priors.toml"
PY = sys.executable

# what `tiles` times: the preferred tile (the full scan of tiles chose it on every
# H200 run) without and with its page lookahead (triton_mla.GPU_TILES[:2]), at one, eight and
# 64 rows x 32K tokens, each count of several splits with the combine launched after the
# split kernel and dependent on it (triton_mla.COMBINE_PDL): the two candidates no GPU has
# timed yet; a dense selection as its page table (token indices built in the call are
# slower). `triton_tiles.py --tiles ...` scans other tiles
TILES = "64,64,8,2,1,0 64,64,8,2,1,1"
# the gluon step, a kernel at a time: the line its tests start under in gluon.log, and the
# seconds its tests, its timing beside triton's and its one-row costs may each take
GLUON_TESTS = "== gluon {}: tests"
GLUON_LIMITS = (90, 90, 45)


def shipped_profile_for(gpu_name: str) -> Path:
    """The profile shipped for this kind of GPU (``profiles/h200.toml`` for an H200, where
    it holds that device's measured terms), else the priors: what validate predicts with
    when this run fitted no terms of its own (``--steps`` without ``device-fit``)."""
    for kind in ("H200", "H100"):
        shipped = ROOT / "profiles" / f"{kind.lower()}.toml"
        if kind in gpu_name.upper().split() and shipped.exists():
            return shipped
    return PRIORS


def gpu_name() -> str:
    """The first GPU's name as nvidia-smi gives it ("" where there is none)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else ""


def steps(out: Path, cpu: bool) -> list[tuple[str, int, str]]:
    """Each step: (name, limit in seconds, shell command); the most important first."""
    q = shlex.quote
    xb = f"{q(PY)} -m xbench.cli.app"
    # validate on this device: route, fetch and local checked, the priors predicting
    validate_device, validate_chunks, validate_heads = (
        ("cpu", "128", 4) if cpu else ("cuda", "1024,8192", 128)
    )
    # the device terms' fit: every kernel the fit reads, over rows and doubling lengths (on a
    # CPU, tiny and without the idle and merge-wait cases a CPU adds by default)
    fit_shapes = (
        "--device cpu --threads 1 --heads 4 --rows 1,4 --chunk 64:256 --samples 2 "
        "--min-sample-time 1ms --idle none --merge-wait none --no-ceilings"
        if cpu
        else "--device cuda --rows 1,8,64 --chunk 1024:65536 --samples 3"
    )
    kernel_run, fitted = q(str(out / "device-kernel")), q(str(out / "device-fit.toml"))
    device_fit = (
        f"{xb} kernel {fit_shapes} --out {kernel_run} && "
        f"{xb} fit {kernel_run} --base {q(str(PRIORS))} --out {fitted}"
    )
    if cpu:  # tiny shapes, the interpreter: the plumbing, not figures
        shapes = "--device cpu --rows 1 --tokens 64 --topk 32 --heads 16"
        sweep = f"{q(PY)} {HERE}/gpu_kernels.py {shapes} --backends triton,torch --samples 1 --min-sample-time 0 --out {q(str(out / 'gpu-kernels'))}"
        tiles = f"{q(PY)} {HERE}/triton_tiles.py {shapes} --tiles 16,16,4,1,1 --pdl off on --samples 1 --min-sample-time 0 --out {q(str(out / 'tiles.json'))}"
        gluon_shapes = (
            "--device cpu --rows 1 --tokens 64 --topk 0 --heads 16 --samples 1 --min-sample-time 0"
        )
    else:
        sweep = (
            f"{q(PY)} {HERE}/gpu_kernels.py --samples 3 --out {q(str(out / 'gpu-kernels'))} "
            "--backends triton,torch,flashmla,flashinfer,plain-torch-graph"
        )
        tiles = (
            f"{q(PY)} {HERE}/triton_tiles.py --rows 1,8,64 --tokens 32768 --samples 3 "
            f"--tiles {TILES} --dense-indices pages --pdl off on "
            f"--out {q(str(out / 'tiles.json'))}"
        )
        gluon_shapes = "--rows 1,64 --tokens 8192,32768,65536 --topk 0 --samples 3"
    # the warp-specialized kernels (candidates), one after the other: each one's bits, then,
    # where they hold, its times beside the triton kernel's (the same sitting), dense at the
    # shapes of issue 44's targets (sparse calls run triton's kernel in both), then its
    # one-row time split as `profile` splits triton's. Each part under a limit of its own, so
    # a kernel whose barriers deadlock costs that limit, not the step, and the other kernel
    # is still checked and timed; a step of its own, so no other step waits on them
    from xbench.kernels.gluon_backend import KERNEL_VARIABLE, KERNELS

    tests = f"{q(PY)} -m pytest -q -p no:cacheprovider {ROOT / 'tests' / 'test_gluon_kernels.py'}"
    gluon = "; ".join(
        f"echo '{GLUON_TESTS.format(kernel)}'; "
        f"timeout -k 5 {GLUON_LIMITS[0]} {tests} -k {kernel} && "
        f"{KERNEL_VARIABLE}={kernel} timeout -k 5 {GLUON_LIMITS[1]} {q(PY)} "
        f"{HERE}/gpu_kernels.py {gluon_shapes} --backends gluon,triton "
        f"--out {q(str(out / f'gluon-kernels-{kernel}'))} && "
        f"{KERNEL_VARIABLE}={kernel} timeout -k 5 {GLUON_LIMITS[2]} {q(PY)} "
        f"{HERE}/gpu_check.py --step gluon-costs {q(str(out))}" + (" --device cpu" if cpu else "")
        for kernel in KERNELS
    )
    return [
        (
            "env",
            40,
            "nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE | head -80; "
            f'{q(PY)} -c \'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, torch.version.cuda); print("triton", triton.__version__)\'; '
            f"{xb} env",
        ),
        ("sweep", 170, sweep),
        ("device-fit", 150, device_fit),
        # the kernels that might meet the one-row target (the gluon backend's), the triton
        # kernel's smaller candidates (the combine's launch, the page lookahead) and where
        # the one-row call's time goes, then their bits on the tensor cores, before what
        # has run
        ("gluon", 240, gluon),
        ("tiles", 200, tiles),
        (
            "profile",
            75,
            f"{q(PY)} {HERE}/gpu_check.py --step profile {q(str(out))}"
            + (" --device cpu" if cpu else ""),
        ),
        (
            "pytest-gpu",
            150,
            f"{q(PY)} -m pytest -q -m gpu -p no:cacheprovider {ROOT / 'tests'} "
            f"--ignore {ROOT / 'tests' / 'test_gluon_kernels.py'}",  # the gluon step's
        ),
        ("device-probe", 60, f"{q(PY)} {HERE}/gpu_check.py --step device-probe {q(str(out))}"),
        ("nvshmem", 75, f"{q(PY)} {HERE}/gpu_check.py --step nvshmem {q(str(out))}"),
        (
            "validate",
            90,
            # against this run's own device terms where device-fit wrote them (the compute
            # phases checked against what this GPU measured), else those shipped for this
            # kind of GPU, else the priors
            f"P={q(str(out / 'device-fit.toml'))}; "
            f'[ -f "$P" ] || P={q(str(PRIORS if cpu else shipped_profile_for(gpu_name())))}; '
            f'{xb} validate --device {validate_device} --profile "$P" '
            f"--fabric nvlink --rows 1,16 --chunk {validate_chunks} --heads {validate_heads} "
            f"--samples 3 --rounds 1 --out {q(str(out / 'validate'))}",
        ),
        (
            "refusals",
            40,
            "i=0; for t in 'mpi --device cuda' nccl nvshmem 'nvshmem --initiator device'; do "
            "i=$((i+1)); "
            f'echo "== xbench probe --np 2 --transport $t"; '
            f"{xb} probe --np 2 --transport $t --sizes 8B:1KiB --out {q(str(out / 'refused'))}-$i; "
            'echo "exit $?"; done',
        ),
        # Last: pytest-gpu already checks the triton backend against torch on the tensor
        # cores; this file's many small shapes each compile and tune (a few of its tests
        # fit in 120 s on an H200), so it takes what the budget has left.
        (
            "triton-tests",
            150,
            f"{q(PY)} -m pytest -q -p no:cacheprovider --durations=0 "
            f"{ROOT / 'tests' / 'test_triton_kernels.py'}",
        ),
    ]


def run_steps(out: Path, budget: float, wanted: set[str] | None, cpu: bool) -> list[dict]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRITON_PRINT_AUTOTUNING": "1"}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if cpu:
        env["TRITON_INTERPRET"] = "1"
    start = time.monotonic()
    done = []
    for name, limit, command in steps(out, cpu):
        if wanted and name not in wanted:
            continue
        left = budget - (time.monotonic() - start)
        if left < 5:
            done.append({"step": name, "status": "not run (budget spent)", "seconds": 0})
            continue
        allowed = min(limit, left)
        log = out / f"{name}.log"
        t0 = time.monotonic()
        with log.open("w") as fh:
            fh.write(f"$ {command}\n")
            fh.flush()
            proc = subprocess.Popen(
                command, shell=True, stdout=fh, stderr=subprocess.STDOUT, env=env,
                cwd=ROOT, start_new_session=True,
            )  # fmt: skip
            try:
                rc = proc.wait(timeout=allowed)
                status = "ok" if rc == 0 else f"exit {rc}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                status = f"stopped at its limit ({allowed:.0f} s)"
        seconds = time.monotonic() - t0
        done.append({"step": name, "status": status, "seconds": round(seconds, 1)})
        print(f"{name:13} {status:28} {seconds:6.1f} s", flush=True)
    return done


def _tail(path: Path, start_marker: str | None = None, lines: int = 40) -> str:
    if not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()
    if start_marker:
        hits = [i for i, line in enumerate(text) if start_marker in line]
        if hits:
            return "\n".join(text[hits[-1] :][: lines * 2])
    return "\n".join(text[-lines:])


def _best_lines(log: str) -> list[str]:
    """triton_tiles.py's verdicts: each line from "best " on, with the indented lines it
    wrapped onto."""
    kept, in_best = [], False
    for line in log.splitlines():
        in_best = line.startswith("best ") or (in_best and line.startswith("    "))
        if in_best:
            kept.append(line)
    return kept


# pytest's closing count: "3 passed, 7 skipped in 2.8s", "4 skipped, 9 deselected in 1.2s"
PYTEST_CLOSING = re.compile(r"^(\d+ [a-z]+(, )?)+ in \d|^no tests ran in ")


def _is_pytest_verdict(line: str) -> bool:
    """A failure pytest names, or its closing count."""
    return line.startswith(("FAILED ", "ERROR ")) or bool(PYTEST_CLOSING.match(line))


def _gluon_headers() -> set[str]:
    """The lines each kernel's tests start under in the gluon step's log."""
    from xbench.kernels.gluon_backend import KERNELS

    return {GLUON_TESTS.format(k) for k in KERNELS}


def _gluon_tests(log: str) -> list[str]:
    """The gluon step's tests: each kernel's line they start under, then pytest's verdicts."""
    headers = _gluon_headers()
    return [line for line in log.splitlines() if line in headers or _is_pytest_verdict(line)]


def _tables(log: str) -> list[str]:
    """gpu_kernels.py's tables in a log: each from its "bound = max" line to its samples'."""
    kept, in_table = [], False
    for line in log.splitlines():
        in_table = in_table or "bound = max" in line
        if in_table:
            kept.append(line)
        in_table = in_table and not line.startswith("samples: ")
    return kept


def _gluon_costs(log: str) -> list[str]:
    """``gluon-costs``' lines: each kernel's name, its plan, its fixed cost and cost a tile
    and that tile's rate."""
    keep = ("== the gluon backend's", "plan: ", "split kernel: ", "the tile: ")
    return [line for line in log.splitlines() if line.startswith(keep)]


# issue 44's keep rule for a gluon kernel (docs/gpu-check.md): its tests pass and it is
# faster than triton's kernel with samples apart at each of these dense shapes (query rows,
# tokens); each shape's time is also held to the target share of the bound (1 row:
# 35 % of the copy bound, 64 rows: 40 % of the matmul rate)
KEEP_SHAPES = {(1, 32768): 0.35, (1, 65536): 0.35, (64, 8192): 0.40, (64, 32768): 0.40}


def failed_tests(log: str, kernel: str) -> int | None:
    """How many of ``kernel``'s tests failed, from its part of the gluon step's log (from
    the line they start under to the next kernel's); None where they did not finish (no
    closing count there: stopped at their limit, or never started)."""
    lines, header = log.splitlines(), GLUON_TESTS.format(kernel)
    if header not in lines:
        return None
    headers, verdicts = _gluon_headers(), []
    for line in lines[lines.index(header) + 1 :]:
        if line in headers:
            break
        if _is_pytest_verdict(line):
            verdicts.append(line)
    if not any(PYTEST_CLOSING.match(line) for line in verdicts):
        return None
    return sum(line.startswith(("FAILED ", "ERROR ")) for line in verdicts)


def keep_verdict(
    kernel: str, samples, baseline, shares: dict, failed: int | None
) -> tuple[list[str], float | None]:
    """Whether ``kernel`` meets the keep rule: (the verdict, then a line for each of
    KEEP_SHAPES: its median and triton's, faster or slower, samples apart or overlapping,
    its share of the bound; its medians' sum over KEEP_SHAPES where it is kept, else None).
    ``samples``: its dense attention samples (warm-ups left out), None where none were
    written; ``baseline``: triton's (None: not timed); ``shares``: (rows, tokens) -> its
    share of the bound."""
    if samples is None or samples.empty:
        return [f"verdict {kernel}: not timed, stays a candidate"], None
    other = sorted({p for p in samples.plan if not p.startswith(f"gluon {kernel} ")})
    if other:  # the backend ran triton's kernel: comparing would time triton against itself
        return [f"verdict {kernel}: its kernel did not run ({other[0]}): nothing to judge"], None
    if baseline is None or baseline.empty:
        return [f"verdict {kernel}: triton's kernel was not timed: nothing to judge"], None
    lines, short, total_us = [], [], 0.0
    for (rows, tokens), target in KEEP_SHAPES.items():
        own = samples[(samples.rows == rows) & (samples.chunk_tokens == tokens)]["value"]
        theirs = baseline[(baseline.rows == rows) & (baseline.chunk_tokens == tokens)]["value"]
        if own.empty or theirs.empty:
            lines.append(f"  {rows}x{tokens}: not timed{'' if own.empty else ' by triton'}")
            short.append(f"{rows}x{tokens}")
            continue
        apart = own.max() < theirs.min() or theirs.max() < own.min()
        faster = own.median() < theirs.median()
        total_us += own.median()
        share = shares.get((rows, tokens), math.nan)
        bound = "no bound measured" if math.isnan(share) else f"{share:.0%} of the bound"
        lines.append(
            f"  {rows}x{tokens}: {own.median():,.1f} us, triton {theirs.median():,.1f}: "
            f"{'faster' if faster else 'slower'}, samples {'apart' if apart else 'overlap'}; "
            f"{bound} (target {target:.0%})"
        )
        if not (faster and apart):
            short.append(f"{rows}x{tokens}")
    kept_us = None
    if failed is None:
        verdict = "stays a candidate: its tests did not finish"
    elif failed:
        verdict = f"stays a candidate: {failed} of its tests failed"
    elif short:
        verdict = f"stays a candidate: not faster with samples apart at {', '.join(short)}"
    else:
        verdict = "keep (docs/gpu-check.md: first in gluon_backend.KERNELS, auto on 9.x)"
        kept_us = total_us
    return [f"verdict {kernel}: {verdict}", *lines], kept_us


def gluon_samples(out: Path) -> tuple[dict, dict]:
    """The gluon step's dense attention samples (warm-ups left out), by kernel (its folder
    ``OUT/gluon-kernels-KERNEL``: the gluon backend's and triton's, timed in one run), and
    each kernel's share of the bound (rows, tokens) -> share, against its run's ceilings."""
    from xbench.kernels.gluon_backend import KERNELS
    from xbench.kernels.summary import summarize_kernels
    from xbench.results.store import read_table

    dense, shares = {}, {}
    for kernel in KERNELS:
        folder = out / f"gluon-kernels-{kernel}"
        if not folder.is_dir():
            continue
        samples = read_table(folder, "kernel_samples")
        for r in summarize_kernels(samples).itertuples():
            if r.kernel == "partial_attention" and not r.sparse and r.backend == "gluon":
                shares.setdefault(kernel, {})[r.rows, r.chunk_tokens] = r.bound_share
        dense[kernel] = samples[
            (samples.kernel == "partial_attention") & ~samples["sparse"] & ~samples.warmup
        ]
    return dense, shares


def gluon_verdicts(dense: dict, shares: dict, log: str) -> list[str]:
    """Each gluon kernel against the keep rule (``gluon_samples``' samples and shares: its
    run's, triton's from the same run; the step's log for its tests' verdicts), and which
    goes first where both are kept."""
    from xbench.kernels.gluon_backend import KERNELS

    lines, kept = [], {}
    for kernel in KERNELS:
        samples = dense.get(kernel)
        mine = None if samples is None else samples[samples.backend == "gluon"]
        baseline = None if samples is None else samples[samples.backend == "triton"]
        verdict, kept_us = keep_verdict(
            kernel, mine, baseline, shares.get(kernel, {}), failed_tests(log, kernel)
        )
        if kept_us is not None:
            kept[kernel] = kept_us
        lines += verdict
    if len(kept) > 1:  # the rule puts one first: the faster over its shapes
        lines.append(f"first: {min(kept, key=kept.get)} (the less time over the shapes above)")
    return lines


def _fill(line: str, width: int = 80) -> str:
    """A line of prose wrapped at words to ``width``, its continuations indented under it."""
    indent = " " * (len(line) - len(line.lstrip()) + 4)
    return textwrap.fill(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def summary(out: Path, done: list[dict]) -> str:
    parts = ["# gpu-check summary", "", "| step | status | seconds |", "|---|---|---|"]
    parts += [f"| {d['step']} | {d['status']} | {d['seconds']} |" for d in done]
    sections = {
        "sweep": ("bound = max", 60),
        "device-fit": (None, 60),
        "gluon": (None, 30),
        "tiles": ("best ", 30),
        "profile": (None, 60),
        "pytest-gpu": (None, 12),
        "device-probe": (None, 40),
        "nvshmem": (None, 30),
        "validate": (None, 30),
        "refusals": (None, 20),
        "triton-tests": (None, 12),
    }
    for name, (marker, lines) in sections.items():
        if not any(d["step"] == name and d["seconds"] for d in done):
            continue
        if name == "tiles":
            body = "\n".join(_best_lines((out / "tiles.log").read_text(errors="replace")))
        elif name == "gluon":  # each kernel's tests, times (triton's too), costs; verdicts
            log = (out / "gluon.log").read_text(errors="replace")
            try:  # a GPU run's summary is not lost to a verdict that could not be made
                verdicts = gluon_verdicts(*gluon_samples(out), log)
            except Exception as exc:  # noqa: BLE001
                verdicts = [f"verdicts: not made ({type(exc).__name__}: {exc})"]
            prose = [_fill(line) for line in [*_gluon_costs(log), *verdicts]]
            body = "\n".join([*_gluon_tests(log), *_tables(log), *prose])
        else:
            body = _tail(out / f"{name}.log", marker, lines)
        parts += ["", f"## {name}", "", "```", body, "```"]
    return "\n".join(parts) + "\n"


# ----- steps that are a few lines of Python of their own -----


def step_device_probe(out: Path) -> int:
    """Builds cuda/probe_device_main.cu with nvcc against NVSHMEM's wheel, runs it on one PE
    and once with the peer loops alone."""
    from xbench.errors import XbenchError
    from xbench.fabric import device_probe

    build = out / "build"
    build.mkdir(exist_ok=True)
    exe = build / "xbench-device-probe"
    home = device_probe.nvshmem_home()
    if home is None:
        print("device-probe: no NVSHMEM wheel (pip install nvidia-nvshmem-cu13): peer loops only")
    t0 = time.monotonic()
    try:
        device_probe.build(exe, ROOT / "cuda", with_nvshmem=home is not None)
    except XbenchError as exc:
        print(f"device-probe: {exc}")
        return 2
    print(f"nvcc: built in {time.monotonic() - t0:.1f} s", flush=True)
    rc = 0
    for args in ([], ["--peer-only"]) if home else ([],):
        print("$", exe, *args, flush=True)
        try:
            ran = subprocess.run([str(exe), *args], timeout=25)
            print(f"exit {ran.returncode}", flush=True)
            rc = rc or ran.returncode
        except subprocess.TimeoutExpired:
            print("stopped after 25 s", flush=True)
            rc = 124
    return rc


# One decode row over 64 splits (two 64-row tiles each: 128 programs, one wave of an H100's or
# H200's 132 SMs) with 1 to 16 tiles of 64 tokens a program: the split kernel's time is then
# a fixed cost a call plus a cost a tile, and the one-row target (docs/gpu-check.md) depends
# on which of the two is cut. An H200's sweep put the whole call near 22 us + 3.6 us a tile
ONE_ROW_TOKENS = (4096, 8192, 16384, 32768, 65536)
ONE_ROW_SPLITS = 64


def self_device_total() -> str:
    """A profile event's own device time, by its name in this torch: 2.4 renamed it from
    CUDA's (2.1 to 2.3 have only self_cuda_time_total, 2.4 on self_device_time_total)."""
    from torch.autograd.profiler_util import FunctionEventAvg

    new = "self_device_time_total"
    return new if hasattr(FunctionEventAvg(), new) else "self_cuda_time_total"


def kernel_device_us(prof, names=("split_kernel", "combine_kernel")) -> dict[str, float]:
    """Each named kernel's mean device time a launch in a torch profile, in us (none where
    nothing ran on a device)."""
    found, total = {}, self_device_total()
    for event in prof.key_averages():
        for name in names:
            if name in event.key and event.count and getattr(event, total) > 0:
                found[name] = getattr(event, total) / event.count
    return found


def fixed_and_per_tile(
    tokens_a_program: list[int], us: list[float], tile: int = 64
) -> tuple[float, float]:
    """(fixed us a call, us a ``tile`` tokens): the least-squares line through (tokens a
    program, us)."""
    import numpy as np

    slope, fixed = np.polyfit(np.asarray(tokens_a_program, float), np.asarray(us, float), 1)
    return float(fixed), float(slope * tile)


def tile_rate(per_tile_us: float, rows: int, tokens: int = 64) -> float:
    """TFLOP/s of one program that spends ``per_tile_us`` on a tile of ``rows`` query rows
    x ``tokens`` tokens of DeepSeek-V3.2's absorbed MLA (its score and its P V): times the
    SM count, what the device would compute were every SM that fast (FlashMLA publishes
    about 660 TFLOP/s compute-bound on an H800's 132 SMs)."""
    from xbench.core.models import get_model

    flops = rows * tokens * get_model("deepseek-v3.2").flops_per_row_token()
    return flops / per_tile_us / 1e6


def tile_rate_line(per_tile_us: float, rows: int, sms: int) -> str:
    """The tile's rate a program and over ``sms`` SMs, beside FlashMLA's published figure:
    whether the tile or the fixed cost is what the one-row target must cut (the tile near
    1.7 us is about FlashMLA's rate)."""
    rate = tile_rate(per_tile_us, rows)
    return (
        f"the tile: {rate:.2f} TFLOP/s a program, {rate * sms:.0f} over {sms} SMs "
        "(FlashMLA: 660 on an H800)"
    )


def _profiled(call, cuda: bool, calls: int = 10, warm: int = 3):
    """A torch profile of ``calls`` calls, after ``warm`` that tune and warm."""
    import torch

    for _ in range(warm):
        call()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
    return prof


def _attention_call(backend, device: str, rows: int, tokens: int, sparse: bool, **kwargs):
    """(case, a call of ``backend``'s attention on that case's inputs); ``kwargs`` go to
    the call (``splits``, and the triton backend's ``tile``)."""
    from xbench.core.models import get_model
    from xbench.kernels.bench import make_inputs, plan_cases

    model = get_model("deepseek-v3.2")
    cpu = device == "cpu"
    (case,) = plan_cases(
        model, ["partial_attention"], [rows], [tokens], "bf16", sparse, 16 if cpu else None, 64
    )
    x = make_inputs(case, device, seed=0)

    def call(x=x, v_dim=case.v_dim):
        return backend.partial_attention(
            x["q"], x["cache"], x["indices"], model.softmax_scale, v_dim, **kwargs
        )

    return case, call


def _one_row_costs(backend, device: str, rows: int, **kwargs) -> None:
    """One row over a fixed count of splits at growing lengths: the split kernel's device
    time a call, and the line through it: its fixed cost a call and its cost a tile of 64
    tokens a program of ``rows`` query rows (on a GPU), with that tile's compute rate. On a
    CPU, a few 16-token tiles a program under the interpreter: the plumbing."""
    cpu = device == "cpu"
    lengths, splits = ((32, 64), 2) if cpu else (ONE_ROW_TOKENS, ONE_ROW_SPLITS)
    calls, warm = (1, 0) if cpu else (10, 3)  # the interpreter takes seconds a call
    print(f"\n== one row, {splits} splits: the split kernel's fixed cost and cost a tile")
    print(f"{'tokens':>8} {'a program':>9} {'split us':>9} {'combine us':>10}")
    per_program, split_us = [], []
    for tokens in lengths:
        _, call = _attention_call(backend, device, 1, tokens, False, splits=splits, **kwargs)
        times = kernel_device_us(_profiled(call, not cpu, calls=calls, warm=warm))
        split, combine = times.get("split_kernel"), times.get("combine_kernel")
        print(
            f"{tokens:>8} {tokens // splits:>9} {split or float('nan'):>9.1f} "
            f"{combine or float('nan'):>10.1f}",
            flush=True,
        )
        if split:
            per_program.append(tokens // splits)
            split_us.append(split)
    print(f"plan: {backend.last_plan}")
    if len(per_program) >= 2:
        fixed, per_tile = fixed_and_per_tile(per_program, split_us)
        print(f"split kernel: {fixed:.1f} us a call + {per_tile:.2f} us a 64-token tile")
        import torch  # device times come from a GPU only

        sms = torch.cuda.get_device_properties(0).multi_processor_count
        print(tile_rate_line(per_tile, rows, sms))
    else:
        print("split kernel: no device times here (a CPU profile has no kernels)")


def step_profile(out: Path, device: str) -> int:
    """The triton backend's kernels at a few shapes, one by one (torch.profiler); then the
    split kernel at one row split into its fixed cost and its cost a tile."""
    from xbench.kernels.backend import get_backend
    from xbench.kernels.triton_mla import GPU_TILES

    backend = get_backend("triton")
    cpu = device == "cpu"
    shapes = [(1, 64, False)] if cpu else [(1, 32768, False), (64, 8192, False), (8, 2048, True)]
    sort = "self_cpu_time_total" if cpu else self_device_total()
    for rows, tokens, sparse in shapes:
        case, call = _attention_call(backend, device, rows, tokens, sparse)
        prof = _profiled(call, not cpu)
        print(f"\n== {case.label}: 10 calls", flush=True)
        print(prof.key_averages().table(sort_by=sort, row_limit=12, max_name_column_width=48))
    # the preferred tile (the tuner may take another at some lengths, and another count of
    # programs)
    _one_row_costs(backend, device, GPU_TILES[0][0], tile=None if cpu else GPU_TILES[0])
    return 0


def step_gluon_costs(out: Path, device: str) -> int:
    """Each of the gluon backend's split kernels at one row, as ``profile`` splits the
    triton kernel's time: its fixed cost a call and its cost a tile (the one-row target
    needs the tile near 1.7 us; triton's took 3.6 on an H200)."""
    from xbench.kernels.backend import get_backend
    from xbench.kernels.gluon_backend import KERNEL_VARIABLE, KERNELS, TILE

    backend = get_backend("gluon")
    # the kernel XBENCH_GLUON_KERNEL names (the gluon step's way, one kernel a process), else each
    for kernel in [os.environ[KERNEL_VARIABLE]] if os.environ.get(KERNEL_VARIABLE) else KERNELS:
        os.environ[KERNEL_VARIABLE] = kernel
        print(f"\n== the gluon backend's {kernel} kernel", flush=True)
        _one_row_costs(backend, device, TILE[0])
    return 0


def step_nvshmem(out: Path) -> int:
    """nvshmem4py on one PE through the transport's own calls: every byte checked."""
    try:
        import nvshmem.core
        import torch
        from cuda.core import Device
        from nvshmem import bindings
    except ImportError as exc:
        print(f"nvshmem: not importable ({exc}); carry nvshmem4py-cu13")
        return 3
    from xbench.fabric.nvshmem import CMP_GE, SIGNAL_SET, allocate_symmetric, release_symmetric

    dev = Device(0)
    dev.set_current()
    torch.cuda.set_device(0)
    uid = nvshmem.core.get_unique_id()
    nvshmem.core.init(device=dev, uid=uid, rank=0, nranks=1, initializer_method="uid")
    sizes = [8, 256 << 20]
    world = allocate_symmetric(nvshmem.core, bindings, sizes + sizes)
    dsts, srcs, signal = world["buffers"][:2], world["buffers"][2:], world["signal"]
    stream = torch.cuda.current_stream().cuda_stream
    rc = 0
    for n, dst, src in zip(sizes, dsts, srcs, strict=True):
        src.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda"))
        dst.zero_()
        signal.zero_()
        torch.cuda.synchronize()
        for kind in ("putmem_signal_on_stream", "putmem_nbi_on_stream"):
            dst.zero_()
            torch.cuda.synchronize()
            iters = 200 if n <= 8 else 5
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(1, iters + 1):
                if kind == "putmem_signal_on_stream":
                    bindings.putmem_signal_on_stream(
                        dst.data_ptr(),
                        src.data_ptr(),
                        n,
                        signal.data_ptr(),
                        i,
                        SIGNAL_SET,
                        0,
                        stream,
                    )
                    bindings.signal_wait_until_on_stream(signal.data_ptr(), CMP_GE, i, stream)
                else:
                    bindings.putmem_nbi_on_stream(dst.data_ptr(), src.data_ptr(), n, 0, stream)
            bindings.quiet_on_stream(stream)
            end.record()
            torch.cuda.synchronize()
            ok = bool(torch.equal(dst, src))
            us = start.elapsed_time(end) * 1e3 / iters
            print(json.dumps({"call": kind, "bytes": n, "iters": iters, "us": round(us, 3),
                              "gb_per_s": round(n / us / 1e3, 3), "bytes_checked": ok}), flush=True)  # fmt: skip
            rc = rc or (0 if ok else 1)
    rc = _device_initiated_on_one_pe(nvshmem.core, bindings) or rc
    release_symmetric(world)
    return rc


def _device_initiated_on_one_pe(core, bindings) -> int:
    """``--initiator device``'s transport itself, its one PE its own peer: the kernels' cubin
    built and loaded, NVSHMEM's state put in it, each kernel launched as xbench probe
    launches it (one launch a sample), every byte checked."""
    import torch

    from xbench.errors import XbenchError
    from xbench.fabric.device_probe import build_cubin
    from xbench.fabric.nvshmem import NvshmemTransport, allocate_symmetric, free_symmetric
    from xbench.fabric.nvshmem_device import (
        PUT_SCOPES,
        NvshmemDeviceTransport,
        arch_of,
        finalize_library,
        load_kernels,
    )
    from xbench.fabric.transport import Pair, host_buffer_sizes
    from xbench.probe.patterns import SweepSpec, buffer_plan
    from xbench.resources import cuda_dir

    t0 = time.monotonic()
    try:
        cubin = build_cubin(cuda_dir(), arch_of(torch, 0))
    except XbenchError as exc:
        print(f"device-initiated: {exc}", flush=True)
        return 2
    print(json.dumps({"cubin_bytes": len(cubin), "built_s": round(time.monotonic() - t0, 1)}))
    sizes = (8, 1152, 65536, 256 << 20)
    plan = buffer_plan(SweepSpec(patterns=("latency", "bandwidth"), sizes=sizes))
    world = NvshmemTransport._world = allocate_symmetric(core, bindings, host_buffer_sizes(plan))
    loaded = NvshmemDeviceTransport._loaded = load_kernels(bindings, cubin, 0)

    class OnePe:  # the pair's barrier, with nobody else to wait for
        @staticmethod
        def Barrier():
            torch.cuda.synchronize()

    rc = 0
    for scope in PUT_SCOPES:  # who issues each ping-pong put (--put-scope)
        loaded["put_scope"] = scope
        t = NvshmemDeviceTransport(Pair(OnePe(), 0, (0, 0), ("self", "self")), plan)
        t.connect()
        for n in sizes:
            runs = [("nvshmem_putsig_pingpong", 1000, 1)] if n <= 65536 else []
            if scope == list(PUT_SCOPES)[-1]:  # the stream's puts are block-wide, any scope
                runs.append(("nvshmem_put_bw", 5 if n > 1 << 20 else 200, 64 if n <= 65536 else 1))
            for kernel, iters, window in runs:
                t.rbuf[:n].zero_()
                torch.cuda.synchronize()
                if kernel == "nvshmem_putsig_pingpong":
                    seconds = t.exchange(n, n, iters)
                    figure = {"scope": scope, "us_oneway": round(seconds / iters / 2 * 1e6, 3)}
                else:
                    seconds = t.window(n, window, iters)
                    figure = {"gb_per_s": round(n * window * iters / seconds / 1e9, 2)}
                ok = bool(torch.equal(t.rbuf[:n], t.sbuf[:n]))
                print(json.dumps({"device-initiated": kernel, "bytes": n, "messages": iters * window,
                                  **figure, "bytes_checked": ok}), flush=True)  # fmt: skip
                rc = rc or (0 if ok else 1)
    torch.cuda.synchronize()
    finalize_library(bindings, loaded["module"])
    free_symmetric(world)  # NVSHMEM itself is finalized with the host part's buffers
    NvshmemDeviceTransport._loaded, NvshmemTransport._world = {}, {}
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out", type=Path, help="folder for every log and figure (created)")
    ap.add_argument("--budget", type=float, default=480, help="seconds for all steps together")
    ap.add_argument("--steps", default=None, help="comma list of steps to run (default: all)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--step", default=None, help=argparse.SUPPRESS)  # one step's own code
    args = ap.parse_args(argv)
    if args.step is None and args.out.exists() and any(args.out.iterdir()):
        ap.error(f"{args.out} is not empty: pass a new folder (nothing there is overwritten)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "device-probe":
        return step_device_probe(args.out)
    if args.step == "profile":
        return step_profile(args.out, args.device)
    if args.step == "gluon-costs":
        return step_gluon_costs(args.out, args.device)
    if args.step == "nvshmem":
        return step_nvshmem(args.out)
    wanted = set(args.steps.split(",")) if args.steps else None
    known = {name for name, _, _ in steps(args.out, False)}
    if wanted and wanted - known:
        ap.error(
            f"unknown step {', '.join(sorted(wanted - known))}; pick from {', '.join(sorted(known))}"
        )
    done = run_steps(args.out, args.budget, wanted, args.device == "cpu")
    text = summary(args.out, done)
    (args.out / "summary.md").write_text(text)
    (args.out / "steps.json").write_text(json.dumps(done, indent=1))
    print(text)
    return 0 if all(d["status"] == "ok" for d in done) else 1


if __name__ == "__main__":
    sys.exit(main())
