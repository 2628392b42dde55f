"""How fast ``xbench simulate`` replays a workload: one million requests of agentic-codebase.

    python benchmarks/simulate_speed.py [--requests 1000000] [--policy predicate] [--repeats 3]

One fabric, one policy, one process (the simulation is single-threaded Python over numpy
draws). Target (issue 21): at most 10 s on one core of the development VM. Prints the time of
each repeat and the best, with requests per second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from xbench.core.profile import load_profile
from xbench.core.scenario import load_workload
from xbench.resources import profile_path
from xbench.simulate import Workload, make_trace, simulate


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--policy", default="predicate")
    ap.add_argument("--fabric", default="ib")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = load_workload(
        Path(__file__).resolve().parents[1] / "scenarios" / "agentic-codebase.toml"
    )
    profile = load_profile(profile_path("h100-priors"))
    w = Workload(**spec["fields"], fabric=args.fabric)
    times = []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        trace = make_trace(w, args.requests, seed=i)
        result = simulate(profile, w, trace, args.policy)
        times.append(time.perf_counter() - t0)
        print(
            f"repeat {i + 1}: {times[-1]:.2f} s for {args.requests:,} requests "
            f"({args.requests / times[-1]:,.0f} req/s; mean latency {1e6 * result.latency.mean():.1f} us)",
            flush=True,
        )
    print(f"best {min(times):.2f} s (range {min(times):.2f}-{max(times):.2f} s; target <= 10 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
