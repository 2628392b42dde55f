"""The simulator's outputs on fixed seeds of every shipped decode scenario (its golden file)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from xbench.core.costmodel import Coef
from xbench.core.profile import load_profile
from xbench.core.scenario import load_workload
from xbench.resources import profile_path
from xbench.simulate import Workload, make_trace, simulate

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "simulate-golden.json"
REQUESTS = 1500


def _profiles():
    cpu = load_profile(ROOT / "tests" / "data" / "vm-cpu-profile.toml")
    waited = replace(
        cpu,
        device=replace(
            cpu.device,
            merge_wait_t0=Coef(3e-5, 3e-5, 3e-5, "s"),
            merge_wait_per_row_partial=Coef(1e-9, 1e-9, 1e-9, "s/row-partial"),
            merge_wait_tau=Coef(2e-4, 2e-4, 2e-4, "s"),
        ),
    )
    return load_profile(profile_path("h100-priors")), cpu, waited


def outputs() -> dict:
    """Per scenario, fabric, profile, options, seed and policy: the result's figures."""
    priors, cpu, waited = _profiles()
    out = {}
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        spec = load_workload(path)
        if spec["kind"] != "decode":
            continue
        runs = [
            (f, "priors", priors, Workload(**spec["fields"], fabric=f), {}) for f in spec["fabrics"]
        ]
        on_cpu = replace(Workload(**spec["fields"], fabric="shm"), move_on_compute=True)
        runs.append(("shm", "cpu", cpu, on_cpu, {"message_cost": 3e-6}))
        runs.append(
            (
                "shm",
                "cpu-waits",
                waited,
                on_cpu,
                {"message_cost": 1e-6, "spread": [[1.0, 1.3, 0.8], [1.1, 0.9]]},
            )
        )
        for fabric, name, profile, w, options in runs:
            for seed in (0, 1):
                trace = make_trace(w, REQUESTS, seed)
                for policy in ("route", "fetch", "local", "predicate"):
                    if policy == "local" and profile.device.recompute_per_token is None:
                        continue
                    r = simulate(profile, w, trace, policy, **options)
                    key = f"{path.stem} {fabric} {name} seed {seed} {policy}"
                    out[key] = {
                        "latency_sum": float(np.sum(r.latency)),
                        "latency_max": float(np.max(r.latency)),
                        "paths": np.bincount(r.path, minlength=4).tolist(),
                        "makespan": r.makespan,
                        "compute_busy": float(np.sum(r.compute_busy)),
                        "link_busy": float(np.sum(r.link_busy)),
                        "bytes_moved": r.bytes_moved,
                        "batches": r.batches,
                        "batched_rows": r.batched_rows,
                    }
    return out


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(outputs(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
