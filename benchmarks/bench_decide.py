"""How fast the predicate is: scalar decide() over request mixes, and decide_grid() throughput.

    python benchmarks/bench_decide.py [--profile h100-priors] [--rows 10000000]

decide() runs the model compiled for the profile and the request's shape
(xbench.core.tracing): the three ends of the intervals on every undominated fabric, every
call; after 1,000 calls of a shape, as C (xbench.core.native_code;
``XBENCH_PREDICATE=python`` times the Python form throughout, and the line after the mixes
says which ran); a grid of 100,000 rows or more runs as C too (its numpy form under
``XBENCH_PREDICATE=python``). It is timed over two mixes of requests: the README's grid
(``xbench decide --rows 1,8,64 --chunk 64:16384 --reuse 0,1,10,100``, 108 requests) and
the grid benchmark's random draw (rows 1-4096, chunks 64-16,384 tokens, reuse 0-99), each
with the best of the profile's fabrics and with its first fabric fixed, and the cost of
building a Request is printed beside them. Targets (issue 41): a scalar decide() costs at most 1 us; decide_grid()
evaluates at least 20 million decisions per second on one fabric. Prints the best of
several repeats (timeit-style: the minimum is the figure least disturbed by other load on
the machine) and the median.
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


def per_call(profile, requests, calls: int, repeats: int) -> list[float]:
    """Seconds a decide() call, over ``requests`` cycled ``calls`` times, per repeat."""
    todo = (requests * (calls // max(len(requests), 1) + 1))[:calls]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for req in todo:
            xbench.decide(profile, req)
        out.append((time.perf_counter() - t0) / len(todo))
    return out


def readme_grid(fabric: str | None) -> list:
    chunks = [64 * 2**k for k in range(9)]  # 64:16384 doubling, as decide expands it
    return [
        xbench.Request(rows=b, heads=128, chunk_tokens=c, reuse=r, fabric=fabric)
        for b in (1, 8, 64)
        for c in chunks
        for r in (0, 1, 10, 100)
    ]


def random_draw(fabric: str | None, n: int = 2000) -> list:
    rng = np.random.default_rng(0)
    return [
        xbench.Request(rows=int(b), heads=128, chunk_tokens=int(c), reuse=int(r), fabric=fabric)
        for b, c, r in zip(
            rng.integers(1, 4096, n), rng.integers(64, 16384, n), rng.integers(0, 100, n),
            strict=True,
        )
    ]  # fmt: skip


def report_mix(profile, label: str, requests, calls: int, repeats: int) -> None:
    whole = per_call(profile, requests, calls, repeats)
    print(
        f"{label:44s} mean {min(whole) * 1e6:5.2f} us (median of repeats "
        f"{statistics.median(whole) * 1e6:5.2f}) over {len(requests):,} requests "
        "(target <= 1 us per call)"
    )


def request_cost(repeats: int) -> list[float]:
    """Seconds to build one Request (what a caller pays before decide())."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b in range(50_000):
            xbench.Request(rows=b, heads=128, chunk_tokens=4096, reuse=1)
        out.append((time.perf_counter() - t0) / 50_000)
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
    decide_grid(profile, frame.head(10))  # warm-up: the model compiled for this shape, once
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
    best = f"best of {len(profile.fabrics)} fabrics ({len(profile.candidates)} undominated)"
    for mix, draw in (("README grid", readme_grid), ("random draw", random_draw)):
        for fabric, which in ((None, best), (first, f"fabric={first}")):
            report_mix(profile, f"decide(), {mix}, {which}", draw(fabric), 50_000, args.repeats)
    from xbench.core.native_code import is_native

    forms = sorted({"C" if is_native(f) else "Python" for f in profile._decide.values()})
    print(f"{'decide() ran as':44s} {' and '.join(forms)} ({len(profile._decide)} shapes)")
    built = request_cost(args.repeats)
    print(
        f"{'Request(...) built':44s} mean {min(built) * 1e6:5.2f} us (median of repeats "
        f"{statistics.median(built) * 1e6:5.2f})"
    )
    for fabric in (first, None):
        rates = grid(profile, args.rows, max(3, args.repeats), fabric)
        label = (
            f"decide_grid(), fabric={fabric}"
            if fabric
            else f"decide_grid(), best of {len(profile.fabrics)}"
        )
        print(
            f"{label:40s} best {max(rates) / 1e6:6.1f} M/s median {statistics.median(rates) / 1e6:6.1f} M/s (target >= 20 M decisions/s on one fabric, {args.rows:,} rows)"
        )


if __name__ == "__main__":
    main()
