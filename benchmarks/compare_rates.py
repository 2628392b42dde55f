"""How often ``xbench compare`` cries wolf, and how often it catches a real 10 % slowdown,
measured on the launches of one stored probe run.

    python benchmarks/compare_rates.py [--store DIR] [--launches 72] [--sides 6,12,24,36]
                                       [--splits 100] [--slowdown 0.10] [--out rates.csv]

The first time, it stores one probe (latency, 8 B, 1 KB and 64 KiB, 2 local ranks) of
``--launches`` separate launches under ``--store`` (``xbench probe --np 2 -p latency
--sizes 8B,1KB,64KiB --runs 72``, about 3 s a launch); later calls reuse it. Each split
draws two disjoint sets of N launches (baseline and candidate) at random: the A/A comparison counts a split in which compare calls any case
slower or faster (a false alarm); the same split with every candidate sample made
``--slowdown`` slower (times multiplied, rates divided) counts each case called slower (a
catch). The splits reuse the store's launches, so they are re-splits of one sitting, not
independent sittings: the rates say how the test behaves on launch distributions of this
shape, and their intervals (Wilson, 95 %) cover the splits' sampling only. Beside them: the
launch-to-launch spread of each case (sd and a robust sd of the log launch medians) and the
launches a side compare's caption says would catch 5 %.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from xbench.compare import Gates, compare_frames
from xbench.compare.runs import case_frame, load_run
from xbench.compare.verdicts import higher_is_better, launches_for, robust_spread

BIN = Path(sys.executable).parent


def stored(store: Path, launches: int) -> Path:
    """The store's probe run, made first when it is not there."""
    run = store / "probe"
    if not (run / "run.json").exists():
        cmd = [str(BIN / "xbench"), "probe", "--np", "2", "-p", "latency"]
        cmd += ["--sizes", "8B,1KB,64KiB", "--runs", str(launches), "--out", str(run)]
        print(f"storing {launches} launches in {run} ...", flush=True)
        subprocess.run(cmd, check=True, capture_output=True)
    return run


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of a rate ``hits / n``."""
    ci = stats.binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def slowed(frame, factor: float):
    """The samples ``factor`` slower: times multiplied, rates divided."""
    out = frame.copy()
    rate = out.unit.map(higher_is_better)
    out["value"] = np.where(rate, out.value / factor, out.value * factor)
    return out


def detection(frame, side: int, splits: int, slowdown: float, seed: int) -> dict:
    """A/A false alarms (splits with any case called slower or faster) and catches of a
    ``slowdown`` (cases called slower) over ``splits`` disjoint draws of ``side`` launches."""
    rng = np.random.default_rng(seed)
    launches = np.sort(frame.launch.unique())
    gates = Gates(boot=300)
    alarms, caught, cases = 0, 0, 0
    for _ in range(splits):
        drawn = rng.permutation(launches)
        base = frame[frame.launch.isin(drawn[:side])]
        cand = frame[frame.launch.isin(drawn[side : 2 * side])]
        same = compare_frames(base, cand, gates)
        alarms += bool(same.verdict.isin(["slower", "faster"]).any())
        worse = compare_frames(base, slowed(cand, 1 + slowdown), gates)
        caught += int((worse.verdict == "slower").sum())
        cases += len(worse)
    return {"alarms": alarms, "caught": caught, "cases": cases}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, default=Path("results/compare-rates"))
    ap.add_argument("--launches", type=int, default=72, help="launches to store the first time")
    ap.add_argument("--sides", default="6,12,24,36", help="launches a side, comma-separated")
    ap.add_argument("--splits", type=int, default=100)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="CSV of the table")
    args = ap.parse_args()
    run = load_run(stored(args.store, args.launches))
    frame = case_frame(run)
    launches = frame.launch.nunique()
    sides = [int(s) for s in args.sides.split(",")]
    if any(2 * s > launches for s in sides) or args.splits < 1:
        ap.error(f"the store holds {launches} launches: each side may take at most {launches // 2}")
    print(f"{args.store}: {launches} launches, cases {sorted(frame.case.unique())}")
    gates = Gates()
    print(f"\n{'case':<34} {'median':>9} {'log sd':>7} {'robust sd':>9} {'caption':>8}")
    for case, group in frame.groupby("case"):
        medians = group.groupby("launch").value.median().to_numpy(float)
        sd, robust = float(np.log(medians).std(ddof=1)), robust_spread(medians, medians)
        need = launches_for(gates.threshold, robust, gates)
        print(
            f"{case:<34} {np.median(medians):>9.3f} {sd:>7.3f} {robust:>9.3f} "
            f"{need if need else '>1000':>8}"
        )
    print(
        f"\n{args.splits} splits a row, disjoint sides; slowdown {args.slowdown:.0%} on "
        "every candidate sample; 95 % Wilson intervals"
    )
    header = ["side", "a/a alarms", "a/a rate", "a/a 95% CI", "caught", "catch rate", "95% CI"]
    print(f"{header[0]:>5} {header[1]:>10} {header[3]:>13} {header[4]:>10} {header[6]:>13}")
    rows = []
    for side in sides:
        got = detection(frame, side, args.splits, args.slowdown, args.seed)
        a_low, a_high = wilson(got["alarms"], args.splits)
        c_low, c_high = wilson(got["caught"], got["cases"])
        rows.append(
            [side, got["alarms"], got["alarms"] / args.splits, f"{a_low:.3f}-{a_high:.3f}"]
            + [got["caught"], got["caught"] / got["cases"], f"{c_low:.3f}-{c_high:.3f}"]
        )
        print(
            f"{side:>5} {got['alarms']:>6}/{args.splits:<3} {a_low:>6.3f}-{a_high:<6.3f} "
            f"{got['caught']:>5}/{got['cases']:<4} {c_low:>6.3f}-{c_high:<6.3f}"
        )
    if args.out:
        with args.out.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
