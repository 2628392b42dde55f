"""``xbench simulate``: a scenario's workload through the fitted cost model, policy against
policy (``engine`` is the discrete-event simulation; this module runs it and summarises)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from xbench.simulate.engine import PATHS, POLICIES, Workload, make_trace, simulate


def summarize(result, policy: str, fabric: str, trace) -> dict:
    lat = result.latency * 1e6
    span = result.makespan or float("nan")
    return {
        "fabric": fabric,
        "policy": policy,
        "requests": len(trace),
        "p50_us": float(np.percentile(lat, 50)),
        "p90_us": float(np.percentile(lat, 90)),
        "p99_us": float(np.percentile(lat, 99)),
        "mean_us": float(lat.mean()),
        "throughput_per_s": len(trace) / span,
        "bytes_moved": float(result.bytes_moved),
        "link_util_mean": float(result.link_busy.mean() / span),
        "link_util_max": float(result.link_busy.max() / span),
        "compute_util_mean": float(result.compute_busy.mean() / span),
        "compute_util_max": float(result.compute_busy.max() / span),
        **{f"share_{p}": float((result.path == i).mean()) for i, p in enumerate(PATHS)},
        "batches": int(result.batches),
        "mean_batch_rows": result.batched_rows / result.batches if result.batches else float("nan"),
    }


def run(profile, spec: dict, policies, requests: int, seed: int, on_step=None) -> pd.DataFrame:
    """Every fabric x policy of ``spec`` (from ``load_workload``) on one trace per fabric;
    ``gain_vs_best_static``: the predicate's mean latency against the better of always-route
    and always-fetch on the same trace (negative: the predicate wins by that fraction)."""
    rows = []
    for fabric in spec["fabrics"]:
        w = Workload(**spec["fields"], fabric=fabric)
        trace = make_trace(w, requests, seed)
        by_policy = {}
        for policy in policies:
            by_policy[policy] = summarize(
                simulate(profile, w, trace, policy), policy, fabric, trace
            )
            if on_step:
                on_step(f"{fabric} {policy}")
        best = min(
            (by_policy[p]["mean_us"] for p in ("route", "fetch") if p in by_policy), default=None
        )
        for row in by_policy.values():
            row["gain_vs_best_static"] = (
                row["mean_us"] / best - 1 if best and row["policy"] == "predicate" else float("nan")
            )
            rows.append(row)
    return pd.DataFrame(rows)


def batching_gain(profile, spec: dict, requests: int, seed: int) -> list[dict]:
    """Per fabric: always-route with the holder batching the queries that converge on a
    chunk, against the same trace served one by one (throughput and mean latency)."""
    out = []
    for fabric in spec["fabrics"]:
        w = Workload(**spec["fields"], fabric=fabric)
        trace = make_trace(w, requests, seed)
        batched = summarize(simulate(profile, w, trace, "route"), "route", fabric, trace)
        one = Workload(**{**spec["fields"], "max_batch_rows": w.rows}, fabric=fabric)
        single = summarize(simulate(profile, one, trace, "route"), "route", fabric, trace)
        out.append(
            {
                "fabric": fabric,
                "mean_batch_rows": batched["mean_batch_rows"],
                "throughput_gain": batched["throughput_per_s"] / single["throughput_per_s"],
                "mean_latency_ratio": batched["mean_us"] / single["mean_us"],
            }
        )
    return out


__all__ = ["PATHS", "POLICIES", "Workload", "batching_gain", "make_trace", "run", "simulate"]
