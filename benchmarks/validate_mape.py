"""How well the fitted model predicts the real paths: fresh probe -> kernel -> fit -> validate.

    python benchmarks/validate_mape.py [--pipelines 3] [--rounds 3] [--keep DIR]

Each pipeline measures everything again (probe with offcache in ``--rounds`` launches,
kernel sweep in ``--rounds`` interleaved passes, fit, then validate in ``--rounds`` passes
with the ranks taking turns), so the figure includes the run-to-run drift a user meets, not
only the model's error. Target (issue 4): MAPE <= 7 % for MPI between 2 local ranks. Prints each
pipeline's MAPE, worst case and per-option MAPE, then the median over pipelines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from xbench.validate import validation_errors

BIN = Path(sys.executable).parent
PROBE = ["probe", "--np", "2", "-p", "latency,bandwidth,offcache", "--sizes", "8B:4MiB"]
PROBE += ["--samples", "4"]
KERNEL = ["kernel", "--threads", "1", "--heads", "16", "--rows", "1,4,16", "--chunk", "128:8192"]
KERNEL += ["--samples", "2"]


def xbench(*args) -> str:
    done = subprocess.run(
        [str(BIN / "xbench"), *map(str, args)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        sys.exit(f"xbench {args[0]} failed: {last}")
    return done.stdout


def pipeline(work: Path, rounds: int) -> list[dict]:
    xbench(*PROBE, "--runs", rounds, "--out", work / "probe")
    xbench(*KERNEL, "--rounds", rounds, "--out", work / "kernel")
    profile = work / "profile.toml"
    base = ["--base", "profiles/h100-priors.toml", "--out", profile]
    xbench("fit", work / "probe", work / "kernel", *base)
    validate = ["validate", "--profile", profile, "--rounds", rounds, "--out", work / "validate"]
    return json.loads(xbench(*validate, "--format", "json"))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pipelines", type=int, default=3)
    ap.add_argument(
        "--rounds", type=int, default=3, help="probe launches, kernel and validate passes"
    )
    ap.add_argument("--keep", type=Path, help="write the runs under this directory")
    args = ap.parse_args()
    mapes = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for i in range(args.pipelines):
            summary = pd.DataFrame(pipeline(root / f"pipeline-{i + 1}", args.rounds))
            errors = validation_errors(summary)  # the figures xbench validate prints
            mapes.append(100 * errors["mape"])
            options = ", ".join(f"{o} {100 * v:.1f} %" for o, v in errors["by_option"].items())
            print(
                f"pipeline {i + 1}: MAPE {mapes[-1]:.1f} % (worst {100 * errors['worst']:.1f} %, "
                f"{len(summary)} cases; {options})",
                flush=True,
            )
    print(
        f"median over {len(mapes)} pipelines: {statistics.median(mapes):.1f} % "
        f"(range {min(mapes):.1f}-{max(mapes):.1f} %; target <= 7 %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
