"""Side-by-side: xbench probe against OSU osu_latency / osu_bw on the same MPI and machine.

    python benchmarks/compare_osu.py --osu-dir PATH [--rounds 20] [--sizes 64KiB:16MiB]
                                     [--out figures.csv]

PATH holds osu_latency and osu_bw built with the same MPI as xbench (for the mpich wheel:
``.venv/bin/mpicc``). Each round launches each tool once per pattern, alternating which goes
first. OSU is given ``-m MAX`` (its ``-m [MIN:]MAX`` option): it runs its usual sweep from its
smallest size, as users run it, and stops where xbench does. Pass ``--osu-args ''`` for an
OSU without ``-m``.

Why many short rounds rather than a few long ones: on a shared machine launches of the same
tool differ more than the samples inside one launch, so the figure of one launch is one
draw. The
comparison is therefore between the two tools' medians over launches, with a 95 % bootstrap
interval over rounds (resampled in pairs, so a slow phase of the machine moves both); the paired per-round ratio is printed
too. The verdict uses the issue's tolerances: latency within 10 % up to 1 KB, latency and
bandwidth within 5 % from 64 KB to 16 MB (no target for bandwidth below 64 KB); it is judged
on the interval: "agrees" when all of it lies within the tolerance, "outside" when all of it
lies beyond, "inconclusive" when it crosses the tolerance or there is none (under 3 rounds).
Each round rotates which tool goes first (with --variant and --osu-again, every launch
takes each place in turn). xbench
takes each launch's figure as the median of its samples; OSU prints the aggregate of its loop
(total time over total iterations, total bytes over total time). Both xbench figures are
compared: its median, and the same aggregate over its measured samples (read back from the
run's Parquet samples), so a difference of statistic is told apart from a difference of
speed. Every round's figures are appended to ``--out`` as it finishes, so an interrupted
comparison keeps what it measured.

``--variant NAME:VAR=VALUE[,VAR=VALUE]`` (repeatable) adds one more xbench launch per round
with those environment variables, in the same rotation, and prints its own tables: an A/B of
a setting against OSU and the default in the same sitting, e.g.
``--variant multiple:MPI4PY_RC_THREAD_LEVEL=multiple``. ``--osu-again`` launches OSU a
second time per round and compares it with its first launch in the same way: what the
method reports when both sides are the same program, the floor under any verdict.
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
PATTERNS = {"latency": ("osu_latency", "us one-way"), "bandwidth": ("osu_bw", "MB/s")}


def run_osu(binary: Path, bind: str, osu_args: list[str]) -> dict[int, float]:
    cmd = [str(BIN / "mpiexec"), "-bind-to", bind, "-n", "2", str(binary), *osu_args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
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


def tolerance(size: int, pattern: str = "latency") -> float | None:
    """The agreement the issue asks for at this size (None: no target there)."""
    if size <= 1000:
        return 0.10 if pattern == "latency" else None
    if 64_000 <= size <= 16 * 2**20:
        return 0.05
    return None


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


def verdict(size: int, row: dict, pattern: str = "latency") -> str:
    """Judged on the ratio's interval, not its point: agrees when the whole interval lies
    within the tolerance, outside when the whole interval lies beyond it, inconclusive when
    it crosses the tolerance or there is none (fewer than 3 rounds): more rounds decide."""
    tol = tolerance(size, pattern)
    if tol is None:
        return "-"
    low, high = row["ci_low"], row["ci_high"]
    if not (low == low and high == high):  # NaN: no interval
        return "inconclusive (no interval)"
    if 1 - tol <= low and high <= 1 + tol:
        return "agrees"
    if low > 1 + tol or high < 1 - tol:
        return "outside"
    return "inconclusive"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--osu-dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--sizes", default="64KiB:16MiB", help="xbench --sizes (powers of two)")
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
        "--osu-again",
        action="store_true",
        help="launch OSU a second time per round and compare it with the first (noise floor)",
    )
    args = ap.parse_args()
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as err:
        ap.error(str(err))
    tools = ["osu", "xbench", *variants, *(["osu_again"] if args.osu_again else [])]
    xbench_tools = [t for t in tools if not t.startswith("osu")]
    sizes = parse_size_list(args.sizes)
    osu_args = args.osu_args.split() if args.osu_args is not None else ["-m", str(max(sizes))]
    patterns = args.patterns.split(",")
    figures = {
        p: {
            "osu": [],
            "osu_again": [],
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
                    figs = {tool: run_osu(args.osu_dir / PATTERNS[pattern][0], args.bind, osu_args)}
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
                print_table(pattern, unit, what, args.rounds, runs["osu"], runs[mine], sizes)
        if args.osu_again:
            what = "OSU's second launch against its first (the method's own noise)"
            print_table(
                pattern, unit, what, args.rounds, runs["osu"], runs["osu_again"], sizes, "OSU again"
            )
    if writer:
        handle.close()
    return 0


def print_table(pattern, unit, what, rounds, osu_runs, mine_runs, sizes, other="xbench") -> None:
    """One table: per size, OSU's and the other launch's medians over launches, ratio, CI and
    verdict (the other column is xbench, or OSU again for the noise floor)."""
    print(f"\n{pattern} ({unit}), {what}, {rounds} rounds, medians over launches")
    print(
        f"{'size':>10} {'OSU':>10} {other:>10} {'ratio':>7} {'95% CI':>13} "
        f"{'paired med':>10} {'paired range':>13}  verdict"
    )
    for size in sorted(set(mine_runs[0]) & set(osu_runs[0]) & set(sizes)):
        row = compare([o[size] for o in osu_runs], [x[size] for x in mine_runs])
        print(
            f"{size:>10} {row['osu']:>10.2f} {row['xbench']:>10.2f} {row['ratio']:>7.3f} "
            f"{row['ci_low']:>6.3f}-{row['ci_high']:<6.3f} {row['paired_median']:>10.3f} "
            f"{row['paired_min']:>6.3f}-{row['paired_max']:<6.3f}  "
            f"{verdict(size, row, pattern)}"
        )


if __name__ == "__main__":
    sys.exit(main())
