"""Side-by-side: xbench probe against OSU osu_latency / osu_bw on the same MPI and machine.

    python benchmarks/compare_osu.py [--osu-dir PATH] [--rounds 20] [--sizes 8B:16MiB]
                                     [--out figures.csv]

PATH holds osu_latency and osu_bw built with the MPI xbench runs on; by default the OSU
Micro-Benchmarks 7.4 source in ``../shared/reference`` (``--reference``) is built there
with this environment's ``mpicc`` when they are missing: ``osu-7.4`` inside the virtual
environment, one build per MPI. Each round launches each tool once per pattern, rotating
which goes first. OSU is given ``-m MAX`` (its ``-m [MIN:]MAX`` option): it runs its usual
sweep from its smallest size, as users run it, and stops where xbench does. Pass
``--osu-args ''`` for an OSU without ``-m``.

Why many short rounds rather than a few long ones: on a shared machine launches of the same
tool differ more than the samples inside one launch, so the figure of one launch is one
draw. The comparison is therefore between the two tools' medians over launches, with a 95 %
bootstrap interval over rounds (resampled in pairs, so a slow phase of the machine moves
both); the paired per-round ratio is printed too. The target is agreement within 5 % at
every size, latency and bandwidth; a size is judged on the interval: "agrees" when all of
it lies within 5 %, "outside" when all of it lies beyond, "inconclusive" when it crosses
the tolerance or there is none (under 3 rounds).

OSU is launched a second time each round and compared with its first launch the same way
(``--no-floor`` leaves it out): what the method reports when both sides are the same
program, the floor under any verdict. Where that floor's interval reaches past 5 % at a
size, the size's verdict says so: no difference smaller than the floor can be told there.

xbench takes each launch's figure as the median of its samples; OSU prints the aggregate of
its loop (total time over total iterations, total bytes over total time). Both xbench
figures are compared: its median, and the same aggregate over its measured samples (read
back from the run's Parquet samples), so a difference of statistic is told apart from a
difference of speed. Every round's figures are appended to ``--out`` as it finishes, so an
interrupted comparison keeps what it measured.

``--osu-ahead MIB`` launches OSU once more a round with that much memory mapped and written
before its buffers (a shim preloaded into it): a Python rank has about 48 MiB of its own
there, and on some machines large shared-memory messages (MPICH's single copy,
process_vm_readv) run markedly faster from buffers mapped after more memory, OSU's own too.
Its tables show that effect on OSU alone, and xbench against OSU placed like it.

``--variant NAME:VAR=VALUE[,VAR=VALUE]`` (repeatable) adds one more xbench launch per round
with those environment variables, in the same rotation, and prints its own tables: an A/B of
a setting against OSU and the default in the same sitting, e.g.
``--variant multiple:MPI4PY_RC_THREAD_LEVEL=multiple``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

from xbench.core.units import parse_size_list
from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import read_table

BIN = Path(sys.executable).parent
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
OSU_BINARIES = ("osu_latency", "osu_bw")
TOLERANCE = 0.05
PATTERNS = {"latency": ("osu_latency", "us one-way"), "bandwidth": ("osu_bw", "MB/s")}


# Built beside OSU for --osu-ahead: a constructor that maps and writes PRETOUCH_MB MiB before
# OSU's main, so its buffers are mapped after that much memory, as a Python rank's are
PRETOUCH_C = r"""
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
__attribute__((constructor)) static void pretouch(void) {
    const char *mb = getenv("PRETOUCH_MB");
    size_t n = mb ? (size_t)atol(mb) << 20 : 0;
    if (!n) return;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) memset(p, 1, n);
}
"""


def pretouch_library(dest: Path) -> Path:
    """The --osu-ahead shim in ``dest``, compiled with gcc when missing."""
    lib = dest / "pretouch.so"
    if not lib.exists():
        source = dest / "pretouch.c"
        source.write_text(PRETOUCH_C)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return lib


def run_osu(
    binary: Path, bind: str, osu_args: list[str], env: dict[str, str] | None = None
) -> dict[int, float]:
    # both launchers take the double dash (Open MPI only that)
    cmd = [str(BIN / "mpiexec"), "--bind-to", bind, "-n", "2", str(binary), *osu_args]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}
    ).stdout
    values = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            values[int(parts[0])] = float(parts[1])
    return values


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:VAR=VALUE[,VAR=VALUE]`` -> (NAME, {VAR: VALUE})."""
    name, sep, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
    if not sep or not name or name == "xbench" or name.startswith("osu") or not env:
        raise ValueError(f"--variant {text!r}: expected NAME:VAR=VALUE[,VAR=VALUE]")
    return name, env


def run_xbench(
    pattern: str, sizes: str, bind: str, extra: list[str], env: dict[str, str] | None = None
) -> tuple[dict[int, float], dict[int, float]]:
    """One xbench launch: (median per size as xbench prints it, OSU's aggregate per size)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(BIN / "xbench"), "probe", "--np", "2", "-p", pattern, "--sizes", sizes]
        cmd += ["--bind", bind, *extra, "--out", f"{tmp}/r", "--format", "json"]
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}
        )
        rows = json.loads(done.stdout)
        samples = read_table(f"{tmp}/r", PROBE_SAMPLES)
    medians = {row["size_bytes"]: row["median"] for row in rows}
    return medians, aggregate(samples[samples.pattern == pattern], pattern)


def aggregate(samples, pattern: str) -> dict[int, float]:
    """OSU's statistic over the measured samples of each size: whole loop, not per sample.

    Latency: total time over total iterations (the iteration-weighted mean). Bandwidth:
    total bytes over total time (the iteration-weighted harmonic mean).
    """
    measured = samples[~samples.warmup]
    out = {}
    for size, group in measured.groupby("size_bytes"):
        iters, value = group.iterations.to_numpy(float), group.value.to_numpy(float)
        if pattern == "bandwidth":
            out[int(size)] = float(iters.sum() / (iters / value).sum())
        else:
            out[int(size)] = float((iters * value).sum() / iters.sum())
    return out


def build_osu(dest: Path, reference: Path = REFERENCE) -> Path:
    """OSU's binaries in ``dest``, built from ``reference``'s source with this environment's
    mpicc when any is missing (about a minute on 2 cores). A one-line SystemExit when it
    cannot be."""
    if all((dest / name).exists() for name in OSU_BINARIES):
        return dest
    script = reference / "build-osu.sh"
    mpicc = BIN / "mpicc"
    if not script.exists():
        raise SystemExit(f"no OSU at {dest} and no source to build it ({script} is missing)")
    if not mpicc.exists():
        raise SystemExit(f"no OSU at {dest} and no mpicc in {BIN} to build it with")
    print(f"building OSU into {dest} with {mpicc}", file=sys.stderr)
    done = subprocess.run(
        ["bash", str(script), str(dest), str(mpicc)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"OSU's build failed: {done.stderr.strip()[-500:]}")
    return dest


def tolerance(size: int, pattern: str = "latency") -> float:
    """The agreement asked for, at every size and pattern."""
    return TOLERANCE


def compare(osu: list[float], xbench: list[float], seed: int = 0) -> dict:
    """xbench/OSU over paired rounds: ratio of medians, its 95 % bootstrap CI, paired ratios."""
    o, x = np.asarray(osu, dtype=float), np.asarray(xbench, dtype=float)
    ratio = float(np.median(x) / np.median(o))
    low = high = float("nan")  # no interval from fewer than 3 rounds
    if len(o) >= 3:
        ci = stats.bootstrap(
            (x, o),
            lambda xs, os_, axis=-1: np.median(xs, axis=axis) / np.median(os_, axis=axis),
            paired=True,
            vectorized=True,
            n_resamples=2000,
            method="percentile",
            random_state=np.random.default_rng(seed),
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    paired = x / o
    return {
        "osu": float(np.median(o)),
        "xbench": float(np.median(x)),
        "ratio": ratio,
        "ci_low": low,
        "ci_high": high,
        "paired_median": float(np.median(paired)),
        "paired_min": float(paired.min()),
        "paired_max": float(paired.max()),
    }


def verdict(size: int, row: dict, pattern: str = "latency", floor: dict | None = None) -> str:
    """Judged on the ratio's interval, not its point: agrees when the whole interval lies
    within the tolerance, outside when the whole interval lies beyond it, inconclusive when
    it crosses the tolerance or there is none (fewer than 3 rounds): more rounds decide.
    ``floor``: OSU against itself at this size; where its interval reaches past the
    tolerance, the verdict says so."""
    tol = tolerance(size, pattern)
    low, high = row["ci_low"], row["ci_high"]
    if not (low == low and high == high):  # NaN: no interval
        said = "inconclusive (no interval)"
    elif 1 - tol <= low and high <= 1 + tol:
        said = "agrees"
    elif low > 1 + tol or high < 1 - tol:
        said = "outside"
    else:
        said = "inconclusive"
    known = floor is not None and floor["ci_low"] == floor["ci_low"]  # NaN: no interval
    if known and not (1 - tol <= floor["ci_low"] and floor["ci_high"] <= 1 + tol):
        said += f" (floor {floor['ci_low']:.3f}-{floor['ci_high']:.3f} wider than {tol:.0%})"
    return said


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--osu-dir", type=Path, default=BIN.parent / "osu-7.4", help="where OSU is (built)"
    )
    ap.add_argument("--reference", type=Path, default=REFERENCE, help="OSU's source folder")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sizes", default="8B:16MiB", help="xbench --sizes (powers of two)")
    ap.add_argument("--patterns", default="latency,bandwidth")
    ap.add_argument("--bind", default="core", help="mpiexec -bind-to for both tools")
    ap.add_argument(
        "--osu-args", default=None, help="arguments for OSU (default: -m MAX of --sizes)"
    )
    ap.add_argument("--xbench-args", default="", help="extra xbench probe options")
    ap.add_argument("--out", type=Path, help="CSV of every round's figures, appended per round")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:VAR=VALUE[,VAR=VALUE]: one more xbench launch per round with this environment",
    )
    ap.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out OSU's second launch a round (the floor: OSU against itself)",
    )
    ap.add_argument(
        "--osu-ahead",
        type=int,
        default=0,
        metavar="MIB",
        help="launch OSU once more a round with MIB MiB mapped and written before its "
        "buffers (a Python rank's footprint at that point is about 48): the placement effect",
    )
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    build_osu(args.osu_dir, args.reference)
    args.osu_again = not args.no_floor
    ahead_env = None
    if args.osu_ahead:
        ahead_env = {
            "LD_PRELOAD": str(pretouch_library(args.osu_dir)),
            "PRETOUCH_MB": str(args.osu_ahead),
        }
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as err:
        ap.error(str(err))
    tools = ["osu", "xbench", *variants, *(["osu_again"] if args.osu_again else [])]
    tools += ["osu_ahead"] if args.osu_ahead else []
    xbench_tools = [t for t in tools if not t.startswith("osu")]
    sizes = parse_size_list(args.sizes)
    osu_args = args.osu_args.split() if args.osu_args is not None else ["-m", str(max(sizes))]
    patterns = args.patterns.split(",")
    figures = {
        p: {
            "osu": [],
            "osu_again": [],
            "osu_ahead": [],
            **{k: [] for t in xbench_tools for k in (t, f"{t}_aggregate")},
        }
        for p in patterns
    }
    writer = None
    if args.out:
        fresh = not args.out.exists()
        handle = args.out.open("a", newline="")
        writer = csv.writer(handle)
        if fresh:
            writer.writerow(["round", "pattern", "tool", "size_bytes", "value"])
    for r in range(args.rounds):
        for pattern in patterns:
            order = tools[r % len(tools) :] + tools[: r % len(tools)]
            for tool in order:
                if tool.startswith("osu"):
                    binary = args.osu_dir / PATTERNS[pattern][0]
                    env = ahead_env if tool == "osu_ahead" else None
                    figs = {tool: run_osu(binary, args.bind, osu_args, env)}
                else:
                    median, agg = run_xbench(
                        pattern, args.sizes, args.bind, args.xbench_args.split(), variants.get(tool)
                    )
                    figs = {tool: median, f"{tool}_aggregate": agg}
                for name, fig in figs.items():
                    figures[pattern][name].append(fig)
                    if writer:
                        writer.writerows([r, pattern, name, s, v] for s, v in sorted(fig.items()))
                if writer:
                    handle.flush()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for pattern in patterns:
        unit = PATTERNS[pattern][1]
        runs = figures[pattern]
        for tool in xbench_tools:
            label = "xbench" if tool == "xbench" else f"xbench [{tool}]"
            for mine, what in (
                (tool, f"{label}'s median of samples"),
                (f"{tool}_aggregate", f"{label}'s aggregate over samples (OSU's statistic)"),
            ):
                print_table(
                    pattern,
                    unit,
                    what,
                    args.rounds,
                    runs["osu"],
                    runs[mine],
                    sizes,
                    floor_runs=runs["osu_again"] if args.osu_again else None,
                )
        if args.osu_ahead:
            what = f"OSU with {args.osu_ahead} MiB written ahead of its buffers, against OSU"
            print_table(
                pattern, unit, what, args.rounds, runs["osu"], runs["osu_ahead"], sizes, "OSU ahead"
            )
            what = f"xbench's aggregate against OSU with {args.osu_ahead} MiB written ahead"
            print_table(
                pattern, unit, what, args.rounds, runs["osu_ahead"], runs["xbench_aggregate"], sizes
            )
        if args.osu_again:
            what = "OSU's second launch against its first (the method's own noise)"
            print_table(
                pattern, unit, what, args.rounds, runs["osu"], runs["osu_again"], sizes, "OSU again"
            )
    if writer:
        handle.close()
    return 0


def print_table(
    pattern, unit, what, rounds, osu_runs, mine_runs, sizes, other="xbench", floor_runs=None
) -> None:
    """One table: per size, OSU's and the other launch's medians over launches, ratio, CI and
    verdict (the other column is xbench, or OSU again for the noise floor); ``floor_runs``:
    OSU's second launches, whose interval against its first bounds what a verdict can tell."""
    print(f"\n{pattern} ({unit}), {what}, {rounds} rounds, medians over launches")
    print(
        f"{'size':>10} {'OSU':>10} {other:>10} {'ratio':>7} {'95% CI':>13} "
        f"{'paired med':>10} {'paired range':>13}  verdict"
    )
    for size in sorted(set(mine_runs[0]) & set(osu_runs[0]) & set(sizes)):
        row = compare([o[size] for o in osu_runs], [x[size] for x in mine_runs])
        floor = None
        if floor_runs:
            floor = compare([o[size] for o in osu_runs], [x[size] for x in floor_runs])
        print(
            f"{size:>10} {row['osu']:>10.2f} {row['xbench']:>10.2f} {row['ratio']:>7.3f} "
            f"{row['ci_low']:>6.3f}-{row['ci_high']:<6.3f} {row['paired_median']:>10.3f} "
            f"{row['paired_min']:>6.3f}-{row['paired_max']:<6.3f}  "
            f"{verdict(size, row, pattern, floor)}"
        )


if __name__ == "__main__":
    sys.exit(main())
