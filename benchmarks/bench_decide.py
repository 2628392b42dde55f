"""How fast the predicate is: one scalar decide() call, and decide_grid() throughput.

    python benchmarks/bench_decide.py [--profile h100-priors] [--rows 10000000]

Targets (issue 4): a scalar decide() costs at most 2 us; decide_grid() evaluates at least
10 million decisions per second. Prints the best of several repeats (timeit-style: the
minimum is the figure least disturbed by other load on the machine) and the median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

import xbench
from xbench.core.grid import decide_grid
from xbench.resources import profile_path


def scalar(profile, request, calls: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            xbench.decide(profile, request)
        out.append((time.perf_counter() - t0) / calls)
    return out


def grid(profile, n: int, repeats: int, fabric: str | None) -> list[float]:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "rows": rng.integers(1, 4096, n),
            "chunk_tokens": rng.integers(64, 16384, n),
            "reuse": rng.integers(0, 100, n),
        }
    )
    if fabric:
        frame["fabric"] = pd.Categorical([fabric] * n)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        decide_grid(profile, frame)
        out.append(n / (time.perf_counter() - t0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", default="h100-priors", help="a profile file or a shipped name")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    profile = xbench.load_profile(profile_path(args.profile))
    first = profile.fabrics[0].name
    for label, req in (
        (
            f"decide(), fabric={first}",
            xbench.Request(rows=8, heads=128, chunk_tokens=2048, fabric=first),
        ),
        (
            f"decide(), best of {len(profile.fabrics)} ({len(profile.candidates)} undominated)",
            xbench.Request(rows=8, heads=128, chunk_tokens=2048),
        ),
    ):
        times = scalar(profile, req, 100_000, args.repeats)
        print(
            f"{label:40s} best {min(times) * 1e6:6.2f} us  median {statistics.median(times) * 1e6:6.2f} us   (target <= 2 us per call)"
        )
    for fabric in (first, None):
        rates = grid(profile, args.rows, max(2, args.repeats // 2), fabric)
        label = (
            f"decide_grid(), fabric={fabric}"
            if fabric
            else f"decide_grid(), best of {len(profile.fabrics)}"
        )
        print(
            f"{label:40s} best {max(rates) / 1e6:6.1f} M/s median {statistics.median(rates) / 1e6:6.1f} M/s (target >= 10 M decisions/s, {args.rows:,} rows)"
        )


if __name__ == "__main__":
    main()
