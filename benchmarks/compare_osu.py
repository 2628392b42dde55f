"""Side-by-side: xbench probe against OSU osu_latency / osu_bw on the same MPI and machine.

    python benchmarks/compare_osu.py --osu-dir PATH [--rounds 5] [--sizes 8B:16MiB]

PATH holds osu_latency and osu_bw built with the same MPI as xbench (for the mpich wheel:
``.venv/bin/mpicc``). Each round runs both tools back to back, alternating which goes
first. The comparison is paired: the ratio xbench / OSU is taken within each round, then
summarised by its median and range over rounds, because these machines switch between fast
and slow phases (the two vCPUs' placement) that a ratio of medians would mix. xbench takes
its figure as the median of its samples; OSU prints the mean over its loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent


def run_osu(binary: Path, bind: str) -> dict[int, float]:
    cmd = [str(BIN / "mpiexec"), "-bind-to", bind, "-n", "2", str(binary)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    values = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            values[int(parts[0])] = float(parts[1])
    return values


def run_xbench(pattern: str, sizes: str, bind: str, extra: list[str]) -> dict[int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(BIN / "xbench"),
            "probe",
            "--np",
            "2",
            "-p",
            pattern,
            "--sizes",
            sizes,
            "--bind",
            bind,
        ]
        cmd += [*extra, "--out", f"{tmp}/r", "--format", "json"]
        rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return {row["size_bytes"]: row["median"] for row in rows}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--osu-dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="8B:16MiB")
    ap.add_argument("--bind", default="core", help="mpiexec -bind-to for both tools")
    ap.add_argument(
        "--xbench-args",
        default="",
        help="extra xbench probe options, e.g. '--min-sample-time 50ms'",
    )
    args = ap.parse_args()
    results = {name: {"osu": [], "xbench": []} for name in ("latency", "bandwidth")}
    for r in range(args.rounds):
        for name, binary in (("latency", "osu_latency"), ("bandwidth", "osu_bw")):
            order = ["osu", "xbench"] if r % 2 == 0 else ["xbench", "osu"]
            for tool in order:
                if tool == "osu":
                    fig = run_osu(args.osu_dir / binary, args.bind)
                else:
                    fig = run_xbench(name, args.sizes, args.bind, args.xbench_args.split())
                results[name][tool].append(fig)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for name, unit in (("latency", "us one-way"), ("bandwidth", "MB/s")):
        print(f"\n{name} ({unit}), {args.rounds} paired rounds")
        print(f"{'size':>10} {'OSU':>10} {'xbench':>10} {'ratio med':>10} {'ratio range':>16}")
        sizes = sorted(set(results[name]["xbench"][0]) & set(results[name]["osu"][0]))
        for size in sizes:
            pairs = list(zip(results[name]["osu"], results[name]["xbench"], strict=True))
            ratios = [x[size] / o[size] for o, x in pairs]
            osu = statistics.median(o[size] for o, _ in pairs)
            xb = statistics.median(x[size] for _, x in pairs)
            print(
                f"{size:>10} {osu:>10.2f} {xb:>10.2f} {statistics.median(ratios):>10.3f} {min(ratios):>7.3f}-{max(ratios):<7.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
