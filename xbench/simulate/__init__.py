"""``xbench simulate``: a scenario's workload through the fitted cost model, policy against
policy (``engine`` is the discrete-event simulation; this module runs it and summarises)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from xbench.core import conditions
from xbench.core.costmodel import RECOMPUTE_TERMS
from xbench.simulate.engine import PATHS, POLICIES, Workload, make_trace, simulate


def request_starts(trace) -> np.ndarray:
    """The index of each request's first use, where a request fans out to several (its
    uses lie together in the trace)."""
    return np.flatnonzero(np.r_[True, np.diff(trace.request) != 0])


def request_latency(result, trace) -> np.ndarray:
    """Seconds per request: a request that fans out to several chunks (a span request)
    ends with its slowest use; otherwise a request is one use."""
    if trace.request is None:
        return result.latency
    return np.maximum.reduceat(result.latency, request_starts(trace))


def summarize(result, policy: str, fabric: str, trace) -> dict:
    """A policy's run in figures. ``offered_per_s``: the requests a second the trace
    offered; ``sustainable_per_s``: about the most its busiest resource (a compute or a
    link) keeps up with, the requests over that resource's busy time."""
    lat = request_latency(result, trace) * 1e6
    span = result.makespan or float("nan")
    last = float(trace.arrival[-1]) if len(trace.arrival) else 0.0
    busiest = max(float(result.compute_busy.max()), float(result.link_busy.max()))
    return {
        "fabric": fabric,
        "policy": policy,
        "requests": len(lat),
        "p50_us": float(np.percentile(lat, 50)),
        "p90_us": float(np.percentile(lat, 90)),
        "p99_us": float(np.percentile(lat, 99)),
        "mean_us": float(lat.mean()),
        "throughput_per_s": len(lat) / span,
        "offered_per_s": len(lat) / last if last > 0 else float("nan"),
        "sustainable_per_s": len(lat) / busiest if busiest > 0 else float("inf"),
        "bytes_moved": float(result.bytes_moved),
        "link_util_mean": float(result.link_busy.mean() / span),
        "link_util_max": float(result.link_busy.max() / span),
        "compute_util_mean": float(result.compute_busy.mean() / span),
        "compute_util_max": float(result.compute_busy.max() / span),
        **{f"share_{p}": float((result.path == i).mean()) for i, p in enumerate(PATHS)},
        "batches": int(result.batches),
        "mean_batch_rows": result.batched_rows / result.batches if result.batches else float("nan"),
    }


# A run whose throughput falls this far below the rate offered did not keep up: it saturated
KEPT_UP = 0.9


def saturated_line(frame: pd.DataFrame) -> str | None:
    """One line where runs saturated (their throughput fell below ``KEPT_UP`` of the rate
    offered): how many, and the slowest and best sustained rates among them; None where
    every run kept up."""
    over = frame[frame.throughput_per_s < KEPT_UP * frame.offered_per_s]
    if over.empty:
        return None
    offered = float(over.offered_per_s.max())
    slow = over.loc[over.sustainable_per_s.idxmin()]
    best = over.loc[over.sustainable_per_s.idxmax()]

    def rate(r) -> str:
        return f"about {r.sustainable_per_s:,.0f}/s ({r.fabric} {r.policy})"

    return (
        f"saturated: {len(over)} of {len(frame)} runs fell behind the {offered:,.0f} "
        f"requests/s offered (their busiest compute or link sustains {rate(slow)} to "
        f"{rate(best)}; sustainable_per_s in --format json): their latencies measure a "
        "queue's growth and their throughput the capacity; --rate below the rate sustained "
        "measures a request's cost"
    )


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


def moves_on_compute(profile) -> bool:
    """Whether a fetch's move (gather at the holder, splice at the requester) runs on the
    instances' compute: so in a profile fitted on CPU kernels, where the same cores attend
    and move; on a GPU the copy engines and SMs overlap."""
    return conditions.timed_on_cpu(profile.provenance.get("conditions", {}))


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


COPIES_POLICIES = ("route", "predicate")  # the top-k workload's paths copies are set against


def own_copies(profile, spec: dict, requests: int, seed: int, frame=None) -> pd.DataFrame:
    """MoSKA's comparison in the event simulator, per fabric: a top-k workload's decode
    steps (``topk`` shared chunks a request, batched at their holders; its unique KV at its
    requester; the answers merged there) under always-route and the predicate, against the
    same requests each attending its own copy of the whole context (every shared chunk and
    its unique KV, dense, one call at its requester, batched with none). Throughputs are at
    the workload's rate: a saturating rate (the requests queued at once) measures capacity.
    Beside each, the closed form's gain (``core.sharing.step``, on the same device terms and
    shape) at the batch whose queries per chunk call match the simulation's, so what queues,
    links and merges one at a time cost shows as the difference. ``frame``: ``run``'s rows
    for the same requests and seed, read instead of simulating a policy again."""
    from xbench.core.sharing import Attention, step
    from xbench.simulate.engine import OWN, Trace

    w = Workload(**spec["fields"], fabric=spec["fabrics"][0])
    trace = make_trace(w, requests, seed)  # (a trace does not depend on the fabric)
    shared = w.chunks * w.chunk_tokens
    first = request_starts(trace)
    alone = Trace(
        trace.arrival[first],
        trace.requester[first],
        np.full(len(first), OWN),
        trace.requester[first],
        np.arange(len(first)),
    )
    # the copies touch no link: one simulation stands for every fabric
    copy = replace(w, unique_tokens=shared + w.unique_tokens)
    copies = summarize(simulate(profile, copy, alone, "route"), "copies", w.fabric, alone)
    keep = w.topk / w.chunks
    att = Attention(profile.device, w.rows * w.heads)
    rows = []
    for fabric in spec["fabrics"]:
        w = replace(w, fabric=fabric)
        for policy in COPIES_POLICIES:
            ran = (
                frame[(frame.fabric == fabric) & (frame.policy == policy)]
                if frame is not None
                else ()
            )
            row = (
                ran.iloc[0]
                if len(ran)
                else summarize(simulate(profile, w, trace, policy), policy, fabric, trace)
            )
            queries = row["mean_batch_rows"] / w.rows
            batch = _batch_holding(queries, w.chunks, keep)
            closed = step(
                att,
                profile.device.merge,
                batch=batch,
                shared=shared,
                unique=w.unique_tokens,
                chunk=w.chunk_tokens,
                keep=keep,
                layers=w.layers,
            )
            rows.append(
                {
                    "fabric": fabric,
                    "policy": policy,
                    "throughput_per_s": row["throughput_per_s"],
                    "copies_throughput_per_s": copies["throughput_per_s"],
                    "gain": row["throughput_per_s"] / copies["throughput_per_s"],
                    "mean_us": row["mean_us"],
                    "copies_mean_us": copies["mean_us"],
                    "queries_per_call": queries,
                    "closed_form_batch": batch,
                    "closed_form_gain": closed["gain"],
                    "link_util_max": row["link_util_max"],
                    "compute_util_max": row["compute_util_max"],
                    "copies_compute_util_max": copies["compute_util_max"],
                }
            )
    return pd.DataFrame(rows)


def _batch_holding(queries: float, chunks: int, keep: float) -> float:
    """The batch B of a closed-form step (``core.sharing.step``) whose chunk calls hold
    ``queries`` queries each: B keep chunks over the chunks read, which grows from 1 at
    B = 1 (one query reads its own) to B keep."""
    from scipy.optimize import brentq

    from xbench.core.sharing import chunks_read

    def held(batch: float) -> float:
        return batch * keep * chunks / chunks_read(chunks, keep, batch)

    if queries <= 1:
        return 1.0
    return brentq(lambda b: held(b) - queries, 1.0, queries / keep + 1.0)


FABRICS = ("nvlink", "ibgda", "ib", "roce", "tcp")


def random_workloads(
    seed: int,
    count: int,
    *,
    max_rate: float = 1e5,
    fabrics=FABRICS,
    lengths=(500, 2000, 5000),
    move_on_compute: bool = False,
):
    """``count`` random decode workloads and a trace of each, from ``seed``: instances 2-8,
    chunks 4-256, 512-8,192 tokens, rows 1 or 4, a Poisson rate from 10^2 to ``max_rate``
    per second, Zipf 0-1.5, a cache of 0-64 chunks, one of ``fabrics``, one of ``lengths``
    requests (the draws the predicate's property test and benchmark use)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        w = Workload(
            instances=int(rng.integers(2, 9)),
            chunks=int(rng.choice([4, 16, 64, 256])),
            chunk_tokens=int(rng.choice([512, 2048, 8192])),
            rows=int(rng.choice([1, 4])),
            rate_per_s=float(10 ** rng.uniform(2, np.log10(max_rate))),
            zipf=float(rng.uniform(0, 1.5)),
            cache_chunks=int(rng.choice([0, 2, 16, 64])),
            fabric=str(rng.choice(list(fabrics))),
            move_on_compute=move_on_compute,
        )
        yield w, make_trace(w, int(rng.choice(list(lengths))), seed + i)


BUSY = 0.8  # a static policy that keeps an instance this busy is near its overload


def predicate_gains(profile, workloads):
    """Per (workload, trace): the predicate's mean latency over the better of always-route
    and always-fetch's, minus 1 (positive: the predicate was worse), and whether that better
    policy kept a compute or a link at least ``BUSY`` busy (the predicate's property is
    judged where it did not)."""
    for w, trace in workloads:
        rows = {
            p: summarize(simulate(profile, w, trace, p), p, w.fabric, trace)
            for p in ("route", "fetch", "predicate")
        }
        best = rows[min(("route", "fetch"), key=lambda p: rows[p]["mean_us"])]
        busy = max(best["compute_util_max"], best["link_util_max"]) >= BUSY
        yield rows["predicate"]["mean_us"] / best["mean_us"] - 1, busy


TIE = 1e-12  # |gain| at or below: the predicate's latencies are the static policy's


def gain_tail(gains) -> dict:
    """What the predicate's gains say, ties apart: a workload where it chose as the better
    static policy did (identical latencies: with the H100 priors, 2,341 of 2,400) says nothing
    about its choices, so the counts, percentiles and extremes are over the others. Gains are
    fractions (positive: the predicate was worse); percentiles are None without any."""
    g = np.asarray(list(gains), dtype=float)
    tied = np.abs(g) <= TIE
    chose = g[~tied]
    pct = (lambda q: float(np.percentile(chose, q))) if len(chose) else (lambda q: None)
    return {
        "workloads": len(g),
        "ties": int(tied.sum()),
        "compared": len(chose),
        "better": int((chose < 0).sum()),
        "worse": int((chose > 0).sum()),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "worst": float(chose.max()) if len(chose) else None,
        "best": float(chose.min()) if len(chose) else None,
    }


def sharing_report(profile, spec: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """A scenario's [workload] sharing (MoSKA), on the profile's device terms scaled from the
    scenario's model to the one asked (``core.sharing``): one batched call over the shared
    context against B calls at each B; a decode step's throughput with the shared context
    batched and routed top-k against each request holding its own copy, per shared context
    size; and the figures that bound the gain (the knee, the ridge, their ceiling)."""
    from xbench.core.models import get_model
    from xbench.core.sharing import (
        Attention,
        batched_against_separate,
        on_gpus,
        ridge_batch,
        step,
    )

    cfg, fields = spec["sharing"], spec["fields"]
    preset = get_model(cfg["model"])
    reference = get_model(spec["model"])
    att = Attention.for_preset(
        profile.device,
        cfg["heads"],
        preset,
        cfg["kv_format"],
        fields["kv_bytes_per_token"],
        reference.flops_per_row_token(),
        profile.ceilings,
    )
    chunk = cfg["chunk_tokens"]
    calls = pd.DataFrame(batched_against_separate(att, chunk, cfg["batches"]))
    sweep = pd.DataFrame(
        [
            step(
                att,
                profile.device.merge,
                batch=cfg["batch"],
                shared=s,
                unique=cfg["unique_tokens"],
                chunk=chunk,
                keep=cfg["keep"],
                layers=preset.layers,
            )
            for s in cfg["shared_tokens"]
        ]
    )
    # with the unique KV on nodes of its own (MoSKA's disaggregation): the shared part alone
    sweep["gain_unique_elsewhere"] = sweep.separate_step_s / (sweep.shared_s + sweep.merge_s)
    hbm, weights, unplaced = _sharing_memory(profile, preset, cfg["kv_format"])
    if hbm is not None:
        placed = [
            on_gpus(att, row, preset, cfg["kv_format"], chunk=chunk, hbm=hbm, weights=weights)
            for row in sweep.to_dict("records")
        ]
        sweep = pd.concat([sweep, pd.DataFrame(placed)], axis=1)
    knee = att.knee(chunk)
    one = att.call(cfg["heads"], chunk)
    call_bound = one / (one - att.call(0, chunk))
    facts = {
        "model": preset.name,
        "kv_format": cfg["kv_format"],
        "heads": cfg["heads"],
        "reference": reference.name,
        "knee": knee,
        "ridge": ridge_batch(profile.ceilings, preset, cfg["kv_format"], cfg["heads"]),
        # one call's gain cannot pass T_c(heads) over its row term (B calls' launches and
        # token reads saved, none of their FLOPs), and routing multiplies it by 1 / keep
        # (each query's rows attend keep of the shared chunks, dense copies all of them)
        "call_bound": call_bound,
        "ceiling": call_bound / cfg["keep"],
        "keep": cfg["keep"],
        "batch": cfg["batch"],
        # what one request's own copy of the largest context holds, every layer
        "copy_bytes": (max(cfg["shared_tokens"]) + cfg["unique_tokens"])
        * preset.kv_bytes_per_token(cfg["kv_format"])
        * preset.layers,
        "paper": 538.7,
        # the setup's matmul rate over the BF16 one the device terms were fitted at
        "matmul_speedup": 1 / att.rate_ratio,
        "hbm": hbm,
        "weights_bytes": weights,
        "unplaced": unplaced,  # why the step is not on GPUs (None where it is)
    }
    return calls, sweep, facts


def _sharing_memory(profile, preset, kv_format) -> tuple:
    """(a GPU's memory, the model's weights on it, why not) for placing a sharing step on
    GPUs, bytes: the weights in the KV's dtype (MoSKA's setup is FP8 throughout); (None,
    None, the reason) where the profile gives no HBM, the model no parameter count, or its
    weights fill a GPU (they would be sharded over several: not modelled)."""
    from xbench.core.models import DTYPE_BYTES

    hbm = profile.ceilings.hbm if profile.ceilings else None
    if hbm is None:
        return None, None, f"profile {profile.name} gives no [ceilings] hbm"
    if preset.total_params is None:
        return None, None, f"{preset.name} has no published parameter count"
    weights = preset.total_params * DTYPE_BYTES.get(kv_format, 2)
    if weights >= hbm:
        return None, None, f"{preset.name}'s weights fill a GPU (sharded weights are not modelled)"
    return hbm, weights, None


def prefill_shape(spec: dict) -> tuple[int, int]:
    """(layers, GPUs) of a decode workload's whole-model prefill: the step's layers where
    the workload sets more than one, else its model's; the model's query heads over the
    request's (its tensor parallelism: the device terms are one GPU's share), 1 without a
    model."""
    from xbench.core.models import get_model

    fields, model = spec["fields"], spec.get("model")
    preset = get_model(model) if model else None
    layers = fields.get("layers", 1)
    if layers == 1 and preset is not None:
        layers = preset.layers
    heads = fields.get("heads", 0)
    gpus = max(preset.q_heads // heads, 1) if preset is not None and heads else 1
    return layers, gpus


PAPER_TTFT_RATIOS = (10.0, 20.0)  # span queries' reported TTFT gains (arXiv 2511.02749)


def _whole_prefill(device, layers: int, gpus: int):
    """``prefill(tokens, context)``: the whole model's prefill the span reports price
    (``core.parts.prefill_time`` over ``layers`` layers and ``gpus`` GPUs)."""
    from xbench.core.parts import prefill_time

    def prefill(tokens, context):
        return prefill_time(device, tokens, context, layers=layers, gpus=gpus)

    return prefill


def span_hit_rates(profile, spec: dict) -> pd.DataFrame:
    """A span workload's calls in the order written (each expression's inner gen(...) calls
    first): each one's KV-cache hit rate against what the ones before it left,
    position-dependent (prefix caching) and position-independent (its commuting sets cached
    member by member), and the time to first token: the whole model's prefill of what missed
    after what hit (:func:`prefill_shape`'s layers and GPUs, ``core.parts.prefill_time``),
    columns ``prefill_layers`` and ``prefill_gpus``, with its terms (``ttft_<cache>_<term>_s``,
    :data:`~xbench.core.costmodel.RECOMPUTE_TERMS`) and ``ttft_ratio``, prefix caching's TTFT over span caching's."""
    import math

    from xbench.core.parts import prefill_terms
    from xbench.core.spans import hit_rates, prefilled_tokens

    cache = spec["span_cache"]
    layers, gpus = prefill_shape(spec)
    device = profile.device
    prefill = _whole_prefill(device, layers, gpus)

    frame = pd.DataFrame(
        hit_rates(
            cache["exprs"],
            block=cache["block"],
            lengths=cache["lengths"],
            default_tokens=cache["default_tokens"],
            dual_output=cache["dual_output"],
            prefill=None if device.recompute(1) == math.inf else prefill,
        )
    )
    frame["output"] = frame.output.fillna("")  # "": a data-only expression
    if "ttft_dependent_s" in frame:
        frame["prefill_layers"], frame["prefill_gpus"] = layers, gpus
        for label in ("dependent", "independent"):
            hits = frame[f"hit_tokens_{label}"]
            terms = [
                prefill_terms(device, *prefilled_tokens(total, hit), layers=layers, gpus=gpus)
                for total, hit in zip(frame.tokens, hits, strict=True)
            ]
            for i, term in enumerate(RECOMPUTE_TERMS):
                frame[f"ttft_{label}_{term}_s"] = [t[i] for t in terms]
        frame["ttft_ratio"] = frame.ttft_dependent_s / frame.ttft_independent_s
    return frame


def span_ttft_reach(profile, spec: dict, hits: pd.DataFrame) -> pd.DataFrame:
    """Where span queries' reported 10-20x lower TTFT appears on this profile: for the calls'
    span-caching misses (what both caches prefill, ``new_tokens``), the tokens a call must
    find under span caching and miss under prefix caching for prefix caching's TTFT to be
    each :data:`PAPER_TTFT_RATIOS` times span caching's (``context_tokens``; null past a
    billion), the whole model's prefill as :func:`span_hit_rates` prices it."""
    from xbench.core.spans import context_for_ratio, prefilled_tokens

    layers, gpus = int(hits.prefill_layers.iloc[0]), int(hits.prefill_gpus.iloc[0])
    prefill = _whole_prefill(profile.device, layers, gpus)

    found = hits[hits.hit_tokens_independent > 0]  # calls that span caching helped
    misses = sorted(
        {
            prefilled_tokens(t, h)[0]
            for t, h in zip(found.tokens, found.hit_tokens_independent, strict=True)
        }
    )
    rows = []
    for new in misses or [1]:
        for ratio in PAPER_TTFT_RATIOS:
            context = context_for_ratio(prefill, new, ratio)
            rows.append({"new_tokens": new, "ratio": ratio, "context_tokens": context})
    return pd.DataFrame(rows)


def span_reuse(profile, spec: dict, requests: int, seed: int) -> pd.DataFrame:
    """Per fabric and commuting chunk of a span workload: how often a requester that does
    not hold the chunk uses it over the trace (the reuse the expressions give it), the
    model's u* for the workload's shape on that fabric (a fetch pays from about u* uses on
    idle resources), and the share of those uses the predicate routed: decisions flip from
    route to fetch past the reuse threshold."""
    from xbench.core.costmodel import thresholds
    from xbench.core.scenario import span_chunks

    rows = []
    for fabric in spec["fabrics"]:
        w = Workload(**spec["fields"], fabric=fabric)
        trace = make_trace(w, requests, seed)
        result = simulate(profile, w, trace, "predicate")
        u_star = thresholds(profile.fabric(fabric), profile.device, workload_request(w))[1]
        remote = trace.holder != trace.requester
        for k, name in enumerate(span_chunks(w.spans)):
            uses = remote & (trace.chunk == k)
            rows.append(
                {
                    "fabric": fabric,
                    "chunk": name,
                    "uses_per_requester": uses.sum() / (w.instances - 1),
                    "u_star": u_star,
                    "routed": float((result.path[uses] == 1).mean()) if uses.any() else 0.0,
                }
            )
    return pd.DataFrame(rows)


def workload_request(w: Workload, reuse: float = 0.0):
    """The routing question one use of ``w`` asks ``decide`` on ``w``'s fabric."""
    return w.request(reuse)


def decide_beside(profile, spec: dict, frame: pd.DataFrame) -> pd.DataFrame:
    """Per fabric of a decode workload that ran always-route and always-fetch (``run``'s
    frame): what ``decide`` answers for one use of the workload's shape on idle resources
    (at reuse 0, with u*), and at the uses a fetch served in the simulation (always-fetch's
    uses, not at home, per fetch: those that joined one on its way or found the chunk
    cached), beside the better static policy and how busy always-route kept its busiest
    link or compute. decide prices a use on idle resources: where, at that reuse, it names
    the policy that lost, a busy route (``route_busy`` >= ``BUSY``) or requests of several
    chunks (:func:`parted_by_fanout`) is why. No rows without both static policies."""
    from xbench.core.costmodel import decide, thresholds

    rows = []
    for fabric in spec["fabrics"]:
        by = frame[frame.fabric == fabric].set_index("policy")
        if not {"route", "fetch"} <= set(by.index):
            continue
        w = Workload(**spec["fields"], fabric=fabric)
        # always-route caches nothing, so what it found present was at home
        away, fetches = 1.0 - by.share_present["route"], by.share_fetch["fetch"]
        served = away / fetches if fetches > 0 else float("nan")
        idle = workload_request(w)
        at_served = workload_request(w, max(served - 1.0, 0.0)) if fetches > 0 else idle
        rows.append(
            {
                "fabric": fabric,
                "decide_idle": decide(profile, idle).choice,
                "u_star": thresholds(profile.fabric(fabric), profile.device, idle)[1],
                "uses_per_fetch": served,
                "decide_at_uses": decide(profile, at_served).choice,
                "better_static": by.mean_us[["route", "fetch"]].idxmin(),
                "route_busy": max(by.link_util_max["route"], by.compute_util_max["route"]),
                # shared chunks a request attends: route runs them at once at their
                # holders, fetch one after another on the requester's compute
                "chunks_per_request": w.uses_per_request(prefixes=False),
            }
        )
    return pd.DataFrame(rows, columns=BESIDE_COLUMNS)


BESIDE_COLUMNS = (  # decide_beside's, there even where a run lacks a static policy
    "fabric",
    "decide_idle",
    "u_star",
    "uses_per_fetch",
    "decide_at_uses",
    "better_static",
    "route_busy",
    "chunks_per_request",
)


def parted_by_fanout(beside: pd.DataFrame) -> pd.Series:
    """Where decide (one use) says fetch and the simulation finds route better with
    requests of several chunks: the request's latency is its slowest use, and route's uses
    run at once at their holders where fetch's queue on the requester's compute."""
    return (
        (beside.decide_at_uses == "fetch")
        & (beside.better_static == "route")
        & (beside.chunks_per_request > 1)
    )


__all__ = [
    "PATHS",
    "POLICIES",
    "Workload",
    "batching_gain",
    "decide_beside",
    "make_trace",
    "own_copies",
    "parted_by_fanout",
    "predicate_gains",
    "random_workloads",
    "request_latency",
    "request_starts",
    "sharing_report",
    "prefill_shape",
    "span_hit_rates",
    "span_ttft_reach",
    "run",
    "saturated_line",
    "simulate",
    "span_reuse",
    "workload_request",
]
