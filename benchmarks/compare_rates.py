"""How often ``xbench compare`` cries wolf, and how often it catches a real 10 % slowdown.

    python benchmarks/compare_rates.py [--store DIR] [--launches 24] [--per-run N] [--pairs 100]

The first time, it stores one short probe (latency, 8 B to 64 KiB, 2 local ranks) of
``--launches`` separate launches under ``--store`` (about 3 s a launch); later calls reuse it,
so the rates are quick to recompute. A stored "run" is ``--per-run`` launches drawn from
them (default: as many as ``compare``'s own bound asks for to see a 10 % change in one case,
or half the store where it holds fewer):

- A/A: two runs of disjoint launches, compared: any case called slower is a false alarm
  (target: no regression in at least 99 of 100 comparisons);
- 1.10x: a run against two other launches' run, disjoint from it, with every value scaled
  by 1.10, as a nightly run that really slowed differs from its baseline by the change and
  by launch-to-launch noise (a run against its own launches scaled has no noise between the
  sides, which no real comparison enjoys). Reported as the comparisons with any case flagged
  (target >= 95 of 100) and the share of the slowed cases flagged (target >= 80 %).

Both go through the same library call as ``xbench compare`` (``compare_frames`` with its
default gates), and again with the samples treated as independent, for contrast. Prints
the launch-to-launch spread and the launches a side that ``compare``'s bound asks for
(``xbench compare`` prints the same bound per case: its ``detects`` column).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from xbench.compare import Gates, compare_frames
from xbench.compare.runs import case_frame, load_run
from xbench.compare.verdicts import launches_for

BIN = Path(sys.executable).parent


def stored(store: Path, launches: int):
    run = store / "probe"
    if not (run / "run.json").exists():
        cmd = [str(BIN / "xbench"), "probe", "--np", "2", "-p", "latency", "--sizes", "8B:64KiB"]
        cmd += ["--samples", "5", "--runs", str(launches), "--out", str(run)]
        print(f"storing {launches} launches in {run} ...", flush=True)
        subprocess.run(cmd, check=True, capture_output=True)
    return case_frame(load_run(run))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, default=Path("results/compare-rates"))
    ap.add_argument("--launches", type=int, default=24)
    ap.add_argument(
        "--per-run", type=int, default=None, help="launches a side (default: the bound's)"
    )
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    frame = stored(args.store, args.launches)
    launches = np.unique(frame.launch)
    sd = frame.groupby(["case_key", "launch"]).value.median().pipe(np.log).groupby("case_key").std()
    need = launches_for(0.10, float(sd.median()), Gates())
    print(
        f"launch-to-launch spread here: sd of log launch medians {sd.min():.3f}-{sd.max():.3f} "
        f"(median {sd.median():.3f}) across cases; at the median, {need} launches a side give "
        f"Welch's test 80 % power against a 10 % change in one case (alpha 0.05, uncorrected)"
    )
    if args.per_run is None:
        args.per_run = min(need, len(launches) // 2)
        if args.per_run < need:
            print(
                f"the store holds {len(launches)} launches: {args.per_run} a side, fewer than "
                f"the {need} the bound asks for (store more with --launches)"
            )
    if len(launches) < 2 * args.per_run:
        sys.exit(
            f"need at least {2 * args.per_run} launches in {args.store}, found {len(launches)}"
        )
    for label, gates in (
        ("launch medians (xbench compare's test)", Gates()),
        ("samples as independent (for contrast)", Gates(min_launches=10**9)),
    ):
        print(f"-- {label}")
        rates(frame, launches, gates, args)
    return 0


def rates(frame, launches, gates, args) -> None:
    rng = np.random.default_rng(args.seed)
    false_alarm_runs = caught = cases_flagged = cases_total = slowed_flagged = slowed_total = 0
    for _ in range(args.pairs):
        picked = rng.choice(launches, 2 * args.per_run, replace=False)
        a = frame[frame.launch.isin(picked[: args.per_run])]
        b = frame[frame.launch.isin(picked[args.per_run :])]
        aa = compare_frames(a, b, gates)
        slower = (aa.verdict == "slower").sum()
        false_alarm_runs += bool(slower)
        cases_flagged += int(slower)
        cases_total += len(aa)
        # the slowed run: other launches than the baseline's, every value 1.10x
        flagged = compare_frames(a, b.assign(value=b.value * 1.10), gates).verdict == "slower"
        caught += bool(flagged.any())
        slowed_flagged += int(flagged.sum())
        slowed_total += len(flagged)
    print(
        f"A/A: {args.pairs - false_alarm_runs}/{args.pairs} comparisons with no regression "
        f"(target >= 99); cases called slower {cases_flagged}/{cases_total}"
    )
    print(
        f"1.10x of other launches: {caught}/{args.pairs} comparisons flagged slower (target "
        f">= 95); slowed cases flagged {slowed_flagged}/{slowed_total} "
        f"({100 * slowed_flagged / max(slowed_total, 1):.0f} %, target >= 80 %)"
    )
    print(
        f"({args.per_run} launches a side from {len(launches)} stored; threshold "
        f"{100 * gates.threshold:g} %, FDR {gates.alpha:g})"
    )


if __name__ == "__main__":
    sys.exit(main())
