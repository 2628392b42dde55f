"""How the simulator's predicate does against the better static policy, over random workloads.

    python benchmarks/simulate_predicate.py [--profile h100-priors] [--seeds 1:9] [--per-seed 40]
        [--max-rate 1e5] [--fabric F] [--cpu-move]

Each workload draws instances (2-8), chunks (4-256), chunk length (512-8,192 tokens), rows
(1 or 4), a Poisson rate (10^2 up to --max-rate per second), Zipf popularity (0-1.5), a
requester cache (0-64 chunks), a fabric and a length (500-5,000 requests) from its seed. For
each, the predicate's mean latency against the better of always-route and always-fetch on
the same trace. Split by whether the better static policy kept every instance under 80 %
busy, prints the ties (workloads where the predicate chose as that policy did: they say
nothing of its choices) and, over the others, how many it was better and worse on, the
50th / 90th / 99th percentiles of its excess and the extremes. Issue 21's property, as the
tests state it over seeds (not chosen ones): better on most, 90 % within 3 %, the tail
stated. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import sys

from xbench.core.profile import load_profile
from xbench.resources import profile_path
from xbench.simulate import BUSY, FABRICS, gain_tail, predicate_gains, random_workloads


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", default="h100-priors")
    ap.add_argument("--seeds", default="1:9", help="first:end (end excluded)")
    ap.add_argument("--per-seed", type=int, default=40)
    ap.add_argument("--max-rate", type=float, default=1e5)
    ap.add_argument("--fabric", default=None, help="one fabric for all (default: any of five)")
    ap.add_argument("--cpu-move", action="store_true", help="T_move on the compute (CPU)")
    args = ap.parse_args()
    profile = load_profile(profile_path(args.profile))
    first, end = (int(x) for x in args.seeds.split(":"))
    fabrics = [args.fabric] if args.fabric else list(FABRICS)
    groups: dict[str, list[float]] = {"stable": [], "busy": []}
    for seed in range(first, end):
        workloads = random_workloads(
            seed,
            args.per_seed,
            max_rate=args.max_rate,
            fabrics=fabrics,
            move_on_compute=args.cpu_move,
        )
        for gain, busy in predicate_gains(profile, workloads):
            groups["busy" if busy else "stable"].append(gain)
    print(f"profile {profile.name}, seeds {args.seeds}, {args.per_seed} workloads per seed")
    for name, gains in groups.items():
        if not gains:
            continue
        t = gain_tail(gains)
        head = (
            f"{name:>6} (better static policy {'>=' if name == 'busy' else '<'} "
            f"{100 * BUSY:.0f} % busy): {t['workloads']} workloads, {t['ties']} ties"
        )
        if not t["compared"]:
            print(f"{head}, none compared")
            continue
        print(
            f"{head}; of the {t['compared']} others, better on {t['better']}, worse on "
            f"{t['worse']}; excess p50 {100 * t['p50']:+.1f} %, p90 {100 * t['p90']:+.1f} %, "
            f"p99 {100 * t['p99']:+.1f} %, worst {100 * t['worst']:+.1f} %, "
            f"best {100 * t['best']:+.1f} %"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
