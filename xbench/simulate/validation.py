"""``xbench simulate --validate``: the simulator against the same trace replayed for real.

A decode scenario's workload, scaled to two instances (two local ranks, each on its own
core), is simulated with the profile and replayed between the ranks (``replay``), policy by
policy, on one trace; the result is each policy's p50, p99, mean and throughput, simulated
and measured, with their errors. Each policy is simulated three ways: with the profile's
costs, with the costs a calibration replay of another trace measured (``calibration``), and
with the costs the validated replay itself measured: the last is no prediction but the
simulator's own error (its queueing, batching, cache and links given the true costs),
which tells it from the error of the costs it was given and from the machine's drift
between replays a minute apart (10-30 % on a shared VM). With several rounds (a calibration
replay, then the trace's) the figures compared are medians over rounds. The profile must
have been fitted here (CPU kernels, the local fabric): the simulation then runs T_move on
the compute, as the ranks do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from xbench.simulate.engine import PATHS, Workload, make_trace, simulate

REPLAYED = ("route", "fetch", "predicate")  # local recomputes: nothing real to run here
CALIBRATION_LEAST = 200  # requests in the calibration trace, at least (else the trace's)
MAX_CHUNKS = 32  # two instances hold at most this many chunks (KV in memory on each rank)


def replay_workload(spec: dict, fabric: str, rate: float | None, profile) -> Workload:
    """The scenario's workload on two instances: at most MAX_CHUNKS chunks, the move on
    the compute, one merge per answer (as the replay's ranks merge), and (unless given) a
    rate at which each instance would be half busy if every use were one attention there."""
    fields = dict(spec["fields"])
    fields.update(
        instances=2, chunks=min(fields["chunks"], MAX_CHUNKS), move_on_compute=True,
        batch_merges=False,
    )  # fmt: skip
    if rate is None:
        attend = profile.device.compute(fields["rows"] * fields["heads"], fields["chunk_tokens"])
        rate = 0.5 * 2 / attend
    fields["rate_per_s"] = rate
    return Workload(**fields, fabric=fabric)


ERROR_COVERAGE = 0.95  # nominal coverage of an error's interval over rounds


def error_interval(simulated: list[float], measured: list[float], coverage: float = ERROR_COVERAGE):
    """The interval of a simulation's error over paired rounds, or (nan, nan) under two.

    Each round pairs a simulation with the replay it is compared with; the rounds' log
    errors log(simulated / measured) are taken as draws around the simulator's bias, and
    the interval is Student's t at ``coverage`` on their mean, back on the ratio scale
    (exp - 1). An interval that holds 0 says the rounds cannot tell the simulation from
    the machine's drift between replays; it is wide with few rounds (t has rounds - 1
    degrees of freedom), which is what few rounds can say. The comparison it belongs to
    is of the same paired rounds (the median error's sign and size sit inside it)."""
    from scipy import stats

    d = np.log(np.asarray(simulated, float) / np.asarray(measured, float))
    if len(d) < 2 or not np.isfinite(d).all():
        return math.nan, math.nan
    half = stats.t.ppf(0.5 + coverage / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return math.expm1(d.mean() - half), math.expm1(d.mean() + half)


def _stats(latency: np.ndarray, arrival: np.ndarray) -> dict:
    span = float((arrival + latency).max() - arrival.min())
    return {
        "p50_us": float(np.percentile(latency, 50) * 1e6),
        "p99_us": float(np.percentile(latency, 99) * 1e6),
        "mean_us": float(latency.mean() * 1e6),
        "throughput_per_s": len(latency) / span if span > 0 else math.nan,
    }


def _medians(found: list[dict]) -> dict | None:
    """Each key's median over rounds, of the rounds that have a value for it (None where
    none has, or where no round found anything)."""
    if not found:
        return None
    out = {}
    for key in found[0]:
        values = [f[key] for f in found if f[key] is not None]
        out[key] = float(np.median(values)) if values else None
    return out


def _simulate(calibration, w: Workload, trace, policy: str, decisions):
    """The trace simulated with a calibration's costs, its calls varying as measured."""
    return simulate(
        calibration.profile,
        w,
        trace,
        policy,
        decisions,
        spread=calibration.spread,
        message_cost=calibration.message_cost,
    )


class _Replays:
    """One validation's replays and simulations of a workload: each replay launched on two
    ranks (``launch(config_path, label)`` runs ``xbench.simulate.replay``) into
    ``out_dir``, each simulation on the profile's costs or a replay's calibration."""

    def __init__(self, profile, w: Workload, out_dir: Path, launch, warn):
        self.profile, self.w, self.out_dir = profile, w, out_dir
        self.launch, self.warn = launch, warn

    def replay(self, label: str, policy: str, trace, decisions=()) -> dict:
        """The replay's measurements (its JSON: latencies, jobs, routed_instead)."""
        from xbench.simulate.replay import ReplayConfig

        w, out_dir = self.w, self.out_dir
        cfg = ReplayConfig(
            out_dir=str(out_dir),
            run_id=out_dir.name,
            policy=policy,
            arrival=(trace.arrival - trace.arrival[0]).tolist(),
            requester=trace.requester.tolist(),
            chunk=trace.chunk.tolist(),
            decisions=list(decisions),
            chunk_tokens=w.chunk_tokens,
            rows=w.rows,
            heads=w.heads,
            cache_chunks=w.cache_chunks,
            max_batch_rows=w.max_batch_rows,
            label=label,
        )
        config_path = out_dir / f"replay-{label}.config.json"
        config_path.write_text(cfg.to_json())
        self.launch(config_path, label)
        return json.loads((out_dir / f"replay-{label}.json").read_text())

    def simulated(self, trace, policy: str):
        """The profile's simulation, and the predicate's paths as it chose them (which the
        replay and the other simulations follow; None for a static policy)."""
        result = simulate(self.profile, self.w, trace, policy)
        return result, [PATHS[p] for p in result.path] if policy == "predicate" else None

    def calibrated_by(self, measured: dict, label: str):
        """Costs calibrated on a replay's jobs (None, with a warning, where they cannot be)."""
        from xbench.simulate.calibration import calibrate

        try:
            return calibrate(self.profile, self.w, measured["jobs"])
        except ValueError as exc:
            if self.warn is not None:
                self.warn(f"no {label} costs ({exc}): that row is not simulated")
            return None


def _rounds(replays: _Replays, policy: str, traces, decisions, count: int):
    """``count`` rounds of a calibration replay and then the trace's: a shared machine's
    core runs slower for seconds at a time, so one replay's p99 is one draw of where those
    spells fell; the medians over rounds compare typical with typical. Returns (the
    replays' stats per round, per costs the (round, simulated stats) of the rounds whose
    calibration held, each round's factors, the most uses a round's replay could not
    follow)."""
    calibration_trace, trace = traces
    calibration_decisions, decisions = decisions
    arrival = trace.arrival - trace.arrival[0]
    real_runs: list[dict] = []
    sims: dict = {"calibrated": [], "replayed": []}
    rounds = []
    routed_instead = 0
    for k in range(1, count + 1):
        again = "" if k == 1 else f"-again-{k}"
        before = replays.replay(
            f"calibrate-{policy}{again}", policy, calibration_trace, calibration_decisions or ()
        )
        measured = replays.replay(f"{policy}{again}", policy, trace, decisions or ())
        real_runs.append(_stats(np.asarray(measured["latency"]), arrival))
        routed_instead = max(routed_instead, measured["routed_instead"])
        found = {
            "calibrated": replays.calibrated_by(before, "calibrated"),
            "replayed": replays.calibrated_by(measured, "own"),
        }
        for costs, calibration in found.items():
            if calibration is not None:
                sim = _simulate(calibration, replays.w, trace, policy, decisions)
                sims[costs].append((k - 1, _stats(sim.latency, arrival)))
        rounds.append({c: v.factors if v is not None else None for c, v in found.items()})
    return real_runs, sims, rounds, routed_instead


def _compared_rows(policy, w, trace, profile_sim, real_runs, sims, routed_instead) -> list[dict]:
    """One row per costs (the profile's, calibrated, replayed): the simulated against the
    measured medians, their errors with intervals over the paired rounds, and the floor."""
    replays = len(real_runs)
    real = _medians(real_runs)
    floor = {
        key: (max(abs(run[key] / real[key] - 1) for run in real_runs) if replays > 1 else math.nan)
        for key in real
    }
    paired = {"profile": [(k, profile_sim) for k in range(replays)], **sims}
    compared = [("profile", profile_sim)]
    compared += [(costs, _medians([s for _, s in runs])) for costs, runs in sims.items() if runs]
    rows = []
    for costs, sim in compared:
        row = {"policy": policy, "costs": costs, "requests": len(trace), "rate_per_s": w.rate_per_s}
        for key in sim:
            row[f"simulated_{key}"] = sim[key]
            row[f"measured_{key}"] = real[key]
            row[f"error_{key}"] = sim[key] / real[key] - 1
            row[f"error_low_{key}"], row[f"error_high_{key}"] = error_interval(
                [s[key] for _, s in paired[costs]],
                [real_runs[k][key] for k, _ in paired[costs]],
            )
        row["routed_instead"] = routed_instead
        row["replays"] = replays
        row["central"] = "median" if replays > 1 else "one"
        row["error_coverage"] = ERROR_COVERAGE if replays > 1 else math.nan
        row.update({f"floor_{key}": value for key, value in floor.items()})
        rows.append(row)
    return rows


def validate_by_replay(
    profile,
    w: Workload,
    policies,
    requests: int,
    seed: int,
    out_dir: Path,
    launch,
    warn=None,
    replays: int = 1,
) -> tuple[pd.DataFrame, dict]:
    """Per policy: the simulated and the replayed p50, p99, mean and throughput of one
    trace, simulated with the profile's costs (``costs`` profile), those a replay of the
    same policy on another trace measured just before (calibrated) and those the replay
    itself measured (replayed); and both calibrations' factors per policy.
    ``launch(config_path, label)`` runs ``xbench.simulate.replay`` on two ranks.
    ``replays`` rounds each replay the calibration trace and then the trace; measured and
    simulated (calibrated and own costs) are the medians over rounds, and ``floor_*`` holds
    how far the rounds' replays landed from their median (the largest |replay / median - 1|;
    NaN with one round), the error the machine makes against itself."""
    runs = _Replays(profile, w, out_dir, launch, warn)
    # another trace (seed + 1), so nothing validated is fitted to, replayed right before
    # each replay of the policy's own (a shared machine's speed drifts within minutes), as
    # long as it: the tail is rare slow calls, and a shorter replay samples too few of them
    # for the calibrated p99 to follow the measured one
    calibration_trace = make_trace(w, max(CALIBRATION_LEAST, requests), seed + 1)
    trace = make_trace(w, requests, seed)
    arrival = trace.arrival - trace.arrival[0]
    rows = []
    factors: dict = {"requests": len(calibration_trace), "by_policy": {}}
    for policy in policies:
        _, calibration_decisions = runs.simulated(calibration_trace, policy)
        result, decisions = runs.simulated(trace, policy)
        real_runs, sims, rounds, routed_instead = _rounds(
            runs,
            policy,
            (calibration_trace, trace),
            (calibration_decisions, decisions),
            replays,
        )
        factors["by_policy"][policy] = {
            costs: _medians([r[costs] for r in rounds if r[costs] is not None])
            for costs in ("calibrated", "replayed")
        }
        factors["by_policy"][policy]["rounds"] = rounds
        profile_sim = _stats(result.latency, arrival)
        rows += _compared_rows(policy, w, trace, profile_sim, real_runs, sims, routed_instead)
    return pd.DataFrame(rows), factors
