"""``xbench simulate --validate``: the simulator against the same trace replayed for real.

A decode scenario's workload, scaled to two instances (two local ranks, each on its own
core), is simulated with the profile and replayed between the ranks (``replay``), policy by
policy, on one trace; the result is each policy's p50, p99, mean and throughput, simulated
and measured, with their errors. The profile must have been fitted here (CPU kernels, the
local fabric): the simulation then runs T_move on the compute, as the ranks do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from xbench.simulate.engine import PATHS, Workload, make_trace, simulate

REPLAYED = ("route", "fetch", "predicate")  # local recomputes: nothing real to run here
MAX_CHUNKS = 32  # two instances hold at most this many chunks (KV in memory on each rank)


def replay_workload(spec: dict, fabric: str, rate: float | None, profile) -> Workload:
    """The scenario's workload on two instances: at most MAX_CHUNKS chunks, the move on
    the compute, and (unless given) a rate at which each instance would be half busy if
    every use were one attention there."""
    fields = dict(spec["fields"])
    fields.update(instances=2, chunks=min(fields["chunks"], MAX_CHUNKS), move_on_compute=True)
    if rate is None:
        attend = profile.device.compute(fields["rows"] * fields["heads"], fields["chunk_tokens"])
        rate = 0.5 * 2 / attend
    fields["rate_per_s"] = rate
    return Workload(**fields, fabric=fabric)


def _stats(latency: np.ndarray, arrival: np.ndarray) -> dict:
    span = float((arrival + latency).max() - arrival.min())
    return {
        "p50_us": float(np.percentile(latency, 50) * 1e6),
        "p99_us": float(np.percentile(latency, 99) * 1e6),
        "mean_us": float(latency.mean() * 1e6),
        "throughput_per_s": len(latency) / span if span > 0 else math.nan,
    }


def validate_by_replay(
    profile, w: Workload, policies, requests: int, seed: int, out_dir: Path, launch
) -> pd.DataFrame:
    """Per policy: the simulated and the replayed p50, p99, mean and throughput of one
    trace. ``launch(config_path, label)`` runs ``xbench.simulate.replay`` on two ranks."""
    from xbench.simulate.replay import ReplayConfig

    trace = make_trace(w, requests, seed)
    rows = []
    for policy in policies:
        result = simulate(profile, w, trace, policy)
        decisions = [PATHS[p] for p in result.path] if policy == "predicate" else []
        cfg = ReplayConfig(
            out_dir=str(out_dir),
            run_id=out_dir.name,
            policy=policy,
            arrival=(trace.arrival - trace.arrival[0]).tolist(),
            requester=trace.requester.tolist(),
            chunk=trace.chunk.tolist(),
            decisions=decisions,
            chunk_tokens=w.chunk_tokens,
            rows=w.rows,
            heads=w.heads,
            cache_chunks=w.cache_chunks,
            max_batch_rows=w.max_batch_rows,
        )
        config_path = out_dir / f"replay-{policy}.config.json"
        config_path.write_text(cfg.to_json())
        launch(config_path, policy)
        measured = json.loads((out_dir / f"replay-{policy}.json").read_text())
        arrival = np.asarray(cfg.arrival)
        sim = _stats(result.latency, arrival)
        real = _stats(np.asarray(measured["latency"]), arrival)
        row = {"policy": policy, "requests": len(trace), "rate_per_s": w.rate_per_s}
        for key in sim:
            row[f"simulated_{key}"] = sim[key]
            row[f"measured_{key}"] = real[key]
            row[f"error_{key}"] = sim[key] / real[key] - 1
        row["routed_instead"] = measured["routed_instead"]
        rows.append(row)
    return pd.DataFrame(rows)
