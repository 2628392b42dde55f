"""xbench simulate (issue 21): the engine's paths, queueing, batching and cache against hand
computations; the scenario files; the command."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_one_rank

from xbench.core.profile import load_profile
from xbench.core.scenario import ScenarioError, load_workload
from xbench.results.schema import PREFILL_SIMULATION, SIMULATION
from xbench.results.store import read_table, table_run_meta
from xbench.simulate import PATHS, Workload, make_trace, random_workloads, simulate
from xbench.simulate.engine import Trace, _Costs
from xbench.simulate.prefill import PrefillCosts, PrefillTrace, PrefillWorkload, simulate_prefill

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

# the engine's hand computations run on a fixed profile (the H100 priors as shipped until
# 2026-11-26), so they check its mechanics, not the shipped profile's current values
PRIORS = load_profile(Path(__file__).parent / "data" / "engine-fixture.toml")
SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.toml"))
W = Workload(instances=2, chunks=2, chunk_tokens=2048, rate_per_s=1000, cache_chunks=4, fabric="ib")


def _trace(*rows):
    """(arrival s, requester, chunk) rows; chunk k lives on instance k % 2."""
    a, r, k = zip(*rows, strict=True)
    return Trace(np.array(a, float), np.array(r), np.array(k))


def test_one_request_costs_the_models_phases():
    c = _Costs(PRIORS, W)
    remote = _trace((0.0, 0, 1))
    route = simulate(PRIORS, W, remote, "route")
    want = c.send_occ + c.send_fly + c.attend + c.back_occ + c.back_fly + c.merge
    assert route.latency[0] == pytest.approx(want) and PATHS[route.path[0]] == "route"
    assert want == pytest.approx(c.per_use()["route"])
    # the same phases as the cost model adds them
    from xbench.core.costmodel import Request, times

    r = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib")
    assert want == pytest.approx(times(PRIORS.fabric("ib"), PRIORS.device, r)[0])
    fetch = simulate(PRIORS, W, remote, "fetch")
    assert fetch.latency[0] == pytest.approx(c.kv_occ + c.kv_fly + c.move + c.attend + c.merge)
    home = simulate(PRIORS, W, _trace((0.0, 1, 1)), "route")
    assert home.latency[0] == pytest.approx(c.attend) and PATHS[home.path[0]] == "present"


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_use_over_a_decode_step_costs_the_models_step(pipelined):
    """A use of 61 layers on idle instances: route, fetch and local take the cost model's
    times for the same step (decide --layers 61), route's round trip every layer or, where
    pipelined, once; the chunk's KV of every layer crosses once."""
    from dataclasses import replace

    from xbench.core.costmodel import Request, times

    step = replace(W, layers=61, pipeline_layers=pipelined)
    one, c = _Costs(PRIORS, W), _Costs(PRIORS, step)
    remote = _trace((0.0, 0, 1))
    r = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib", layers=61,
                pipeline_layers=pipelined)  # fmt: skip
    route, fetch, local = times(PRIORS.fabric("ib"), PRIORS.device, r)
    assert simulate(PRIORS, step, remote, "route").latency[0] == pytest.approx(route)
    assert simulate(PRIORS, step, remote, "fetch").latency[0] == pytest.approx(fetch)
    assert simulate(PRIORS, step, remote, "local").latency[0] == pytest.approx(local)
    assert c.attend == pytest.approx(61 * one.attend)
    assert c.send_occ == pytest.approx((1 if pipelined else 61) * one.send_occ)
    assert c.s_kv == 61 * one.s_kv
    moved = simulate(PRIORS, step, remote, "fetch").bytes_moved
    assert moved == pytest.approx(61 * simulate(PRIORS, W, remote, "fetch").bytes_moved)


# k holders: 8 instances, chunk 0's shares on instances 0-3
SPREAD = Workload(
    instances=8, chunks=8, chunk_tokens=2048, rate_per_s=1000, cache_chunks=4, fabric="ib",
    holders=4,
)  # fmt: skip


@pytest.mark.parametrize("layers", [1, 61])
def test_a_use_spread_over_k_holders_costs_the_models_step(layers):
    """A chunk on 4 holders (decide --holders 4), on idle instances: a fetch, its 4 shares
    sent at once and their bytes one after another through the requester's link, takes the
    cost model's time exactly; a route takes it less the answers' bytes but one (the model
    counts the k answers as arriving together; here they leave their holders as the
    queries reached them, one query's time apart). The predicate prices both as the model."""
    from dataclasses import replace

    from xbench.core.costmodel import Request, times

    w = replace(SPREAD, layers=layers)
    c = _Costs(PRIORS, w)
    r = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib", layers=layers, holders=4)
    route, fetch, _ = times(PRIORS.fabric("ib"), PRIORS.device, r)
    assert c.per_use()["route"] == pytest.approx(route, rel=1e-12)
    assert c.per_use()["fetch"] == pytest.approx(fetch, rel=1e-12)
    remote = Trace(np.array([0.0]), np.array([7]), np.array([0]))  # 7 holds no share
    fetched = simulate(PRIORS, w, remote, "fetch")
    assert fetched.latency[0] == pytest.approx(fetch, rel=1e-12)
    assert fetched.bytes_moved == pytest.approx(c.s_kv)
    assert fetched.link_busy[:4] == pytest.approx([c.kv_occ] * 4)  # each holder its share
    routed = simulate(PRIORS, w, remote, "route")
    answer_bytes = c.back_occ - c.overheads["back"]
    assert routed.latency[0] == pytest.approx(route - 3 * answer_bytes, rel=1e-12)
    assert routed.link_busy[7] == pytest.approx(4 * c.send_occ)  # four queries out
    assert routed.link_busy[:4] == pytest.approx([c.back_occ] * 4)  # an answer from each
    assert routed.compute_busy[:4] == pytest.approx([c.attend_share] * 4)
    assert c.attend_share == pytest.approx(layers * PRIORS.device.compute(16, 512))


def test_a_requester_holding_a_share_attends_it_and_asks_the_others():
    """Requester 1 holds one of chunk 0's 4 shares: a route attends it here beside the
    three queries' answers and merges 5 partials; a fetch pulls the three it lacks. Its own
    copy of a span's prefix stays whole with it (present)."""
    c = _Costs(PRIORS, SPREAD)
    me = Trace(np.array([0.0]), np.array([1]), np.array([0]))
    routed = simulate(PRIORS, SPREAD, me, "route")
    assert routed.link_busy[1] == pytest.approx(3 * c.send_occ)  # no query to itself
    assert routed.compute_busy[1] == pytest.approx(c.attend_share + c.route_merge_base)
    assert routed.bytes_moved == pytest.approx(3 * (c.s_q + c.s_o))
    # the last query leaves after three, reaches instance 3, is attended and answered
    last = 3 * c.send_occ + c.send_fly + c.attend_share + c.back_occ + c.back_fly
    assert routed.latency[0] == pytest.approx(last + c.route_merge_base)
    fetched = simulate(PRIORS, SPREAD, me, "fetch")
    assert fetched.link_busy[1] == 0.0 and fetched.bytes_moved == pytest.approx(0.75 * c.s_kv)
    assert fetched.latency[0] < c.per_use()["fetch"]
    spans = Workload(**{**SPREAD.__dict__, "chunks": 4 + 8, "spans": (("p", ("a", "b"), 1.0),)})
    own = Trace(np.array([0.0]), np.array([5]), np.array([2 + 5]), np.array([5]), np.array([0]))
    assert PATHS[simulate(PRIORS, spans, own, "route").path[0]] == "present"


def test_queries_for_one_chunk_batch_at_each_holder_over_its_share():
    """Four requesters' queries for chunk 0 at once: each holder runs the first alone and
    the others as one call over its share (c / k tokens), not over the whole chunk."""
    c = _Costs(PRIORS, SPREAD)
    # what a query adds at a holder is read over the share, even before any share's call
    assert c.joins_share[0] == c.batched_share[1] == pytest.approx(c.attend_share)
    assert c.joins_share[2] == pytest.approx(c.batched_share[3] - c.batched_share[2])
    trace = Trace(np.zeros(4), np.array([4, 5, 6, 7]), np.zeros(4, int))
    res = simulate(PRIORS, SPREAD, trace, "route")
    assert res.batches == 8 and res.batched_rows == 16
    want = c.attend_share + c.batched_share[3]
    assert res.compute_busy[:4] == pytest.approx([want] * 4)
    assert c.batched_share[3] == pytest.approx(PRIORS.device.compute(3 * 16, 512))


def test_k_holders_are_refused_past_the_instances():
    with pytest.raises(ValueError, match="holders = 9: between 1 and the 8 instances"):
        simulate(PRIORS, Workload(instances=8, holders=9), _trace((0.0, 0, 1)), "route")


def test_a_busy_holder_queues_and_batches_one_chunk():
    c = _Costs(PRIORS, W)
    same_time = _trace(*[(0.0, 0, 1)] * 8)  # eight queries for chunk 1 at once
    res = simulate(PRIORS, W, same_time, "route")
    # the first runs alone (the server was idle), the other seven queued and ran as one call
    assert res.batches == 2 and res.batched_rows == 8
    assert res.compute_busy[1] == pytest.approx(c.attend + c.batched_attend(7))
    assert res.compute_busy[1] < 8 * c.attend
    two_chunks = _trace((0.0, 0, 1), (0.0, 0, 3))  # different chunks, same holder: FIFO
    res = simulate(PRIORS, W, two_chunks, "route")
    assert res.batches == 2 and res.latency[1] > res.latency[0]


def test_a_fetched_chunk_serves_later_uses_and_waits_for_arriving_ones():
    c = _Costs(PRIORS, W)
    fetch_done = c.kv_occ + c.kv_fly + c.move + c.attend + c.merge
    trace = _trace((0.0, 0, 1), (1e-6, 0, 1), (fetch_done + 1e-3, 0, 1))
    res = simulate(PRIORS, W, trace, "fetch")
    paths = [PATHS[p] for p in res.path]
    assert paths == ["fetch", "present", "present"]
    # arrived meanwhile: waits for the fetch, then attends in place
    assert res.latency[1] == pytest.approx(fetch_done - 1e-6 + c.attend, rel=1e-9)
    # arrived after: the chunk is in the cache
    assert res.latency[2] == pytest.approx(c.attend)
    assert res.bytes_moved == pytest.approx(c.s_kv)


def test_on_cpus_the_move_is_work_on_both_computes():
    """move_on_compute: the holder gathers on its compute before the chunk leaves, the
    requester splices on its compute before attending; same total, other occupancy."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile

    # a measured splice (500 us + 1 ns/token): the gather is the rest of T_move
    device = replace(
        PRIORS.device,
        splice_t0=Coef(5e-4, 5e-4, 5e-4, "s"),
        splice_per_token=Coef(1e-9, 1e-9, 1e-9, "s/token"),
    )
    measured = Profile("splice", PRIORS.fabrics, device)
    cpu = replace(W, move_on_compute=True)
    c = _Costs(measured, cpu)
    assert c.splice == pytest.approx(5e-4 + 2048e-9) and c.gather > 1e-3
    assert c.gather + c.splice == pytest.approx(c.move)
    one = simulate(measured, cpu, _trace((0.0, 0, 1)), "fetch")
    assert one.latency[0] == pytest.approx(
        c.gather + c.kv_occ + c.kv_fly + c.splice + c.attend + c.merge
    )
    assert one.compute_busy[1] == pytest.approx(c.gather)
    assert one.compute_busy[0] == pytest.approx(c.splice + c.attend + c.merge)
    # the holder's own work queues behind the gather: instance 1 fetches chunk 0, then
    # instance 0 attends chunk 0 at home
    busy = _trace((0.0, 1, 0), (0.0, 0, 0))
    res = simulate(measured, cpu, busy, "fetch")
    assert res.compute_busy[0] == pytest.approx(c.gather + c.attend)
    assert res.latency[1] == pytest.approx(c.gather + c.attend)
    delay = simulate(measured, W, _trace((0.0, 0, 1)), "fetch")
    assert delay.compute_busy[1] == 0 and delay.latency[0] == pytest.approx(one.latency[0])


def test_a_rank_on_one_core_takes_arrivals_and_messages_in_between_its_jobs():
    """move_on_compute (CPU ranks: one core computes and messages): an arrival at a busy
    rank is taken in when its job ends; taking an arrival or a message in costs the core
    message_cost; spread gives each attending call its factor, in order per instance."""
    from dataclasses import replace

    cpu = replace(W, move_on_compute=True)
    c = _Costs(PRIORS, cpu)
    route = c.send_occ + c.send_fly + c.attend + c.back_occ + c.back_fly + c.merge
    # instance 1 attends its own chunk 1 from t = 0; its route of chunk 0 waits for that
    busy = _trace((0.0, 1, 1), (1e-6, 1, 0))
    res = simulate(PRIORS, cpu, busy, "route")
    assert res.latency[1] == pytest.approx(c.attend - 1e-6 + route)
    gpu = simulate(PRIORS, W, busy, "route")  # elsewhere the query leaves at once
    assert gpu.latency[1] == pytest.approx(route)
    m = 50e-6
    one = simulate(PRIORS, cpu, _trace((0.0, 0, 1)), "route", message_cost=m)
    # taken in: the arrival (core 0 idle: at once, the query leaves meanwhile), the query
    # at the holder (then its attention), the answer (then the merge)
    assert one.latency[0] == pytest.approx(route + 2 * m)
    assert one.compute_busy.tolist() == pytest.approx([2 * m + c.merge, m + c.attend])
    # each instance takes its measured factors in order, cycling: 2x, then 3x, then 2x
    spread = [np.array([1.0]), np.array([2.0, 3.0])]
    home = _trace((0.0, 1, 1), (1.0, 1, 1), (2.0, 1, 1))
    varied = simulate(PRIORS, cpu, home, "route", spread=spread)
    assert varied.latency.tolist() == pytest.approx([2 * c.attend, 3 * c.attend, 2 * c.attend])


def test_a_busy_rank_takes_in_arrivals_then_messages_when_its_job_ends():
    """As the replay's loop does: a routed query that reached a busy holder is taken in
    when the holder's job ends, after the arrivals that came meanwhile, so the holder's own
    use that arrived after the query still attends before it."""
    from dataclasses import replace

    cpu = replace(W, move_on_compute=True)
    c = _Costs(PRIORS, cpu)
    landed = 1e-6 + c.send_occ + c.send_fly
    assert landed + 1e-6 < c.attend  # both reach instance 0 while it attends
    # 0 attends its chunk 0; 1 routes chunk 0 to it; then 0's own use of chunk 2 arrives
    res = simulate(PRIORS, cpu, _trace((0.0, 0, 0), (1e-6, 1, 0), (landed + 1e-6, 0, 2)), "route")
    assert res.latency[2] == pytest.approx(2 * c.attend - landed - 1e-6)
    back = c.back_occ + c.back_fly + c.merge
    assert res.latency[1] == pytest.approx(3 * c.attend - 1e-6 + back)
    # on a device the query is queued as it lands (nothing to take it in)
    gpu = simulate(PRIORS, W, _trace((0.0, 0, 0), (1e-6, 1, 0), (landed + 1e-6, 0, 2)), "route")
    assert gpu.latency[1] == pytest.approx(2 * c.attend - 1e-6 + back)


def test_uses_of_a_present_chunk_batch_like_routed_ones():
    c = _Costs(PRIORS, W)
    home = _trace(*[(0.0, 1, 1)] * 6)  # six uses of chunk 1 at its holder, at once
    res = simulate(PRIORS, W, home, "route")
    assert res.batches == 2 and res.batched_rows == 6  # one alone, then five as one call
    assert res.compute_busy[1] == pytest.approx(c.attend + c.batched_attend(5))
    assert res.latency[-1] == pytest.approx(c.attend + c.batched_attend(5))


def test_a_requester_merges_the_answers_queued_at_it_in_one_call():
    """batch_merges (MoSKA's batched merge at the requester): answers that queue at a busy
    requester are merged in one call of their rows together, the uses of one call ending
    together; one merge alone costs route's merge as before."""
    from dataclasses import replace

    batched = replace(W, batch_merges=True)
    c = _Costs(PRIORS, batched)
    assert c.batched_merge[1] == pytest.approx(c.route_merge_base)
    assert c.batched_merge[8] < 8 * c.route_merge_base
    # eight queries at once: the holder answers the first alone and seven in one call, and
    # those seven answers reach the requester while it merges the first
    trace = _trace(*[(0.0, 0, 1)] * 8)
    one_by_one = simulate(PRIORS, W, trace, "route")
    together = simulate(PRIORS, batched, trace, "route")
    assert one_by_one.compute_busy[0] == pytest.approx(8 * c.route_merge_base)
    assert together.compute_busy[0] < one_by_one.compute_busy[0]
    ends = np.round(together.latency, 12)
    assert len(set(ends)) < len(ends)  # some uses ended in one merge call
    assert together.latency.max() <= one_by_one.latency.max() + 1e-12


def test_a_routed_merge_after_its_wait_pays_the_measured_extra():
    """A device with merge-wait terms: the predicate's route prices the merge after the
    route's own wait, as the cost model does; in the engine the merge pays for how long its
    core waited (saturated here: the requester idled since before the trace)."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile, Request, times

    w0, w1, tau = 300e-6, 0.2e-9, 5e-3
    device = replace(
        PRIORS.device,
        merge_wait_t0=Coef(w0, w0, w0, "s"),
        merge_wait_per_row_partial=Coef(w1, w1, w1, "s/row-partial"),
        merge_wait_tau=Coef(tau, tau, tau, "s"),
    )
    waited = Profile("waited", PRIORS.fabrics, device)
    c = _Costs(waited, W)
    r = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib")
    assert c.per_use()["route"] == pytest.approx(times(waited.fabric("ib"), device, r)[0])
    assert c.per_use()["fetch"] == pytest.approx(_Costs(PRIORS, W).per_use()["fetch"])
    res = simulate(waited, W, _trace((0.0, 0, 1)), "route")
    answered = c.send_occ + c.send_fly + c.attend + c.back_occ + c.back_fly
    merge = device.merge(c.rows, 2) + (w0 + c.rows * 2 * w1)
    assert res.latency[0] == pytest.approx(answered + merge)
    # over a step of 3 layers: the model prices each layer's merge after that layer's round
    # trip; the engine gives each layer's merge its share of the (saturated) wait
    step = replace(W, layers=3)
    r3 = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib", layers=3)
    assert _Costs(waited, step).per_use()["route"] == pytest.approx(
        times(waited.fabric("ib"), device, r3)[0]
    )
    res = simulate(waited, step, _trace((0.0, 0, 1)), "route")
    assert res.latency[0] == pytest.approx(3 * (answered + merge))


def test_a_fetched_chunk_is_attended_for_less_right_after_its_splice():
    """A device with spliced_saving: the fetch's first attention, on the chunk it has just
    spliced, costs T_c less the saving, in the per-use price and in the engine; later uses
    of the kept chunk pay T_c."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile, Request, times

    saved = 40e-6
    device = replace(PRIORS.device, spliced_saving=((2048.0, Coef(saved, saved, saved, "s")),))
    hot = Profile("hot", PRIORS.fabrics, device)
    c, cold = _Costs(hot, W), _Costs(PRIORS, W)
    assert c.fetch_attend == pytest.approx(cold.attend - saved) and c.attend == cold.attend
    r = Request(rows=1, heads=16, chunk_tokens=2048, fabric="ib")
    assert c.per_use()["fetch"] == pytest.approx(times(hot.fabric("ib"), device, r)[1])
    assert c.per_use()["fetch"] == pytest.approx(cold.per_use()["fetch"] - saved)
    trace = _trace((0.0, 0, 1), (1.0, 0, 1))  # the chunk fetched, then used again from cache
    first, again = simulate(hot, W, trace, "fetch").latency
    first_cold, again_cold = simulate(PRIORS, W, trace, "fetch").latency
    assert first == pytest.approx(first_cold - saved)
    assert again == pytest.approx(again_cold)


def test_a_call_after_idle_pays_the_measured_extra():
    """A device with idle terms: a call that starts after g idle adds E (1 - exp(-g/tau));
    a call queued behind another (no idle) adds nothing; the first call of the trace starts
    on a device idle since before it."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile

    extra, tau = 5e-4, 3e-3
    device = replace(
        PRIORS.device, idle_extra=Coef(extra, extra, extra, "s"), idle_tau=Coef(tau, tau, tau, "s")
    )
    cold = Profile("cold", PRIORS.fabrics, device)
    c = _Costs(PRIORS, W)
    assert device.after_idle(0.0) == 0.0 and PRIORS.device.after_idle(1.0) == 0.0
    assert device.after_idle(tau) == pytest.approx(extra * (1 - math.exp(-1)))
    gap = 2e-3  # chunk 1 at its holder: uses 2 ms after the first one ended
    trace = _trace((0.0, 1, 1), (c.attend + gap, 1, 1), (c.attend + gap, 1, 3))
    res = simulate(cold, W, trace, "route")
    assert res.latency[0] == pytest.approx(c.attend + extra)  # idle since long before
    second = c.attend + device.after_idle(gap - extra)  # the first ran E longer
    assert res.latency[1] == pytest.approx(second)
    assert res.latency[2] == pytest.approx(second + c.attend)  # queued: no idle extra
    warm = simulate(PRIORS, W, trace, "route")
    assert warm.latency[0] == pytest.approx(c.attend)


def test_calibration_scales_the_costs_to_what_the_replay_measured():
    """Jobs a replay ran, made from a device with known factors: attention 1.3x back to
    back, 300 us more after idle (tau 3 ms), merges 2x, gathers 1.5x, splices 3x; the
    calibration finds the first four, and scales the splice as the gather, saying that this
    is assumed (the splice is not measured: with it at 3x it still reads 1.5x)."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile
    from xbench.simulate.calibration import calibrate

    tau = 3e-3
    device = replace(
        PRIORS.device,
        idle_extra=Coef(1e-3, 1e-3, 1e-3, "s"),
        idle_tau=Coef(tau, tau, tau, "s"),
        splice_t0=Coef(5e-4, 5e-4, 5e-4, "s"),
        splice_per_token=Coef(1e-9, 1e-9, 1e-9, "s/token"),
    )
    profile = Profile("p", PRIORS.fabrics, device)
    w = replace(W, move_on_compute=True)
    c = _Costs(profile, w)
    extra = 3e-4
    jobs, t = [], 0.0
    for i in range(40):  # alternately back to back and after 1-8 ms idle
        idle = 0.0 if i % 2 else 1e-3 * (1 + i % 8)
        calls = 1 + i % 3
        t += idle
        since = idle if jobs else math.inf  # the first job follows the replay's start
        spent = 1.3 * c.batched_attend(calls * w.rows) + (extra * -math.expm1(-since / tau))
        jobs.append(("attend", t, t + spent, calls))
        t += spent
        for kind, spent in (("merge", 2 * c.merge), ("gather", 1.5 * c.gather)):
            jobs.append((kind, t + 1e-3, t + 1e-3 + spent, 1))
            t += 1e-3 + spent
        spent = 3.0 * c.splice + 1.3 * c.attend + 2 * c.merge  # right after the gather
        jobs.append(("fetched", t, t + spent, 1))
        t += spent
    jobs.append(("messages", t, t + 3e-5, 3))  # taking 3 items in, not compute
    calibration = calibrate(profile, w, [jobs])
    calibrated, factors = calibration.profile, calibration.factors
    assert len(calibration.spread) == 1 and np.allclose(calibration.spread[0], 1.0)
    assert factors["attention_spread"] < 1e-9
    assert factors["attention"] == pytest.approx(1.3)
    assert factors["idle_extra_us"] == pytest.approx(300, rel=1e-6)
    assert factors["merge"] == pytest.approx(2.0) and factors["gather"] == pytest.approx(1.5)
    # the gather's (the same copy's), not the 3x the replay ran: assumed, and said so
    assert factors["splice"] == factors["gather"] == pytest.approx(1.5)
    assert calibration.message_cost == pytest.approx(1e-5)  # 30 us for 3 items
    k = _Costs(calibrated, w)
    assert k.attend == pytest.approx(1.3 * c.attend) and k.merge == pytest.approx(2 * c.merge)
    assert k.gather == pytest.approx(1.5 * c.gather) and k.splice == pytest.approx(1.5 * c.splice)
    assert calibrated.device.after_idle(tau) == pytest.approx(extra * (1 - math.exp(-1)))
    with pytest.raises(ValueError, match="no attention back to back"):
        calibrate(profile, w, [[("merge", 0.0, 1e-4, 1)]])


def test_calibration_scales_a_merge_after_a_wait_whole():
    """Merges after waits, measured at 2x what the profile says after those waits (its
    merge and its wait extra): the calibrated profile's merge after any wait is 2x, the
    saturation time unchanged."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile
    from xbench.simulate.calibration import calibrate

    device = replace(
        PRIORS.device,
        merge_wait_t0=Coef(3e-4, 3e-4, 3e-4, "s"),
        merge_wait_per_row_partial=Coef(1e-10, 1e-10, 1e-10, "s/row-partial"),
        merge_wait_tau=Coef(1e-2, 1e-2, 1e-2, "s"),
    )
    profile = Profile("waits", PRIORS.fabrics, device)
    w = replace(W, move_on_compute=True)
    c = _Costs(profile, w)
    rows, chunk = c.rows, w.chunk_tokens
    jobs, t = [("attend", 0.0, c.attend, 1)], c.attend
    for i in range(9):
        t += 1e-3 * (1 + i)  # the wait for the answer
        spent = 2 * device.merge_after_wait(rows, 2, chunk, 1e-3 * (1 + i))
        jobs.append(("merge", t, t + spent, 1))
        jobs.append(("attend", t + spent, t + spent + c.attend, 1))
        t += spent + c.attend
    calibration = calibrate(profile, w, [jobs])
    assert calibration.factors["merge"] == pytest.approx(2.0)
    scaled = calibration.profile.device
    for wait in (5e-4, 4e-3, 0.1):
        assert scaled.merge_after_wait(rows, 2, chunk, wait) == pytest.approx(
            2 * device.merge_after_wait(rows, 2, chunk, wait)
        )


def test_the_predicate_prices_a_call_on_an_idle_core():
    """With idle terms, a routed call on an idle holder pays its idle extra, a fetched one
    the requester's when the chunk lands: a large extra on the holder turns route to fetch,
    the same on the requester turns it back."""
    from dataclasses import replace

    from xbench.core.costmodel import Coef, Profile
    from xbench.simulate.engine import _predicate

    second = Coef(1.0, 1.0, 1.0, "s")
    device = replace(PRIORS.device, idle_extra=second, idle_tau=Coef(1e-3, 1e-3, 1e-3, "s"))
    c = _Costs(Profile("cold", PRIORS.fabrics, device), W)
    args = (c, c.per_use(), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, c.attend)
    assert _predicate(*args) == "route"  # one use, no reuse: a fetch does not pay
    assert _predicate(*args, idle_holder=math.inf, idle_me=0.0) == "fetch"
    assert _predicate(*args, idle_holder=math.inf, idle_me=math.inf) == "route"


def test_later_routes_pay_the_steady_queues_of_two_cores_and_a_fetched_chunk_one():
    """A chunk used again: its later routes wait at the holder and again for the merge here,
    its later uses in place wait here only; a queued holder turns a reused chunk's route
    into a fetch, the same queue here does not."""
    from xbench.simulate.engine import _predicate

    c = _Costs(PRIORS, W)
    args = (c, c.per_use(), 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, c.attend)
    assert _predicate(*args) == "route"  # three later uses do not pay back the priors' 3 ms move
    assert _predicate(*args, queue_holder=0.01) == "fetch"
    assert _predicate(*args, queue_me=0.01) == "route"


def test_steady_wait_is_pollaczek_khinchine():
    from xbench.simulate.engine import BUSY_CAP, _Computes, _delay, _Links

    servers = _Computes(1)
    for k in range(100):  # 100 jobs of 1 ms over 0.2 s: M/D/1 at half busy waits S / 2
        servers.run(0, k * 2e-3, 1e-3)
    assert servers.steady_wait(0, 0.2) == pytest.approx(0.5e-3)
    # a prior of jobs counted beside them: 100 more of 1 ms over 0.2 s more, the same load
    primed = _Computes(1, 100, 1e-3)
    for k in range(100):
        primed.run(0, k * 2e-3, 1e-3)
    assert primed.steady_wait(0, 0.4) == pytest.approx(0.5e-3)
    # saturated: the busy fraction stops at the cap instead of exploding, and the backlog's
    # growth (twice the capacity: 1 s a second) is met halfway through the horizon
    steady = 100 * 1e-6 / (2 * 0.05 * (1 - BUSY_CAP))
    assert servers.steady_wait(0, 0.05) == pytest.approx(steady)
    assert _delay(0.1, 100 * 1e-6, 0.05, 0.5) == pytest.approx(steady + 0.25)
    assert _delay(0.1, 100 * 1e-6, 0.2, 0.5) == pytest.approx(0.5e-3)  # under it: no growth
    # a link's messages a second, its prior's beside them
    links = _Links(1, 100)
    for k in range(100):
        links.run(0, k * 2e-3, 1e-6)
    assert links.rate(0, 0.4) == pytest.approx(500.0)


def test_a_routed_use_pays_the_links_it_would_overload_unless_the_compute_hides_them():
    """Every use routed, each link carries its queries and answers at the rates seen: under
    its capacity M/G/1's wait, past it a backlog growing by (load - 1) s a second, met over
    what is left of the workload; the holder's compute, a stage in tandem, hides as much as
    its own backlog and growth, read from the work it ran and holds or, where more, the
    work the uses asked so far would bring it."""
    from xbench.simulate.engine import BUSY_CAP, PRIOR_USES, Always, Simulation

    w = Workload(instances=2, chunks=2, chunk_tokens=2048, rate_per_s=1000, fabric="ib")
    sim = Simulation(PRIORS, w, _trace((0.0, 0, 1)), Always("route"), None, 0.0)
    c = sim.costs
    q, a = c.queries_occ, c.back_occ
    span = 1.0

    def routed(i, queries, answers):  # link i's uses, the prior's 4 of each beside them
        sim.remote_out[i], sim.remote_in[i] = queries - PRIOR_USES, answers - PRIOR_USES

    routed(0, 100, 200)  # 100 queries and 200 answers a second
    load = 100 * q + 200 * a
    assert load < BUSY_CAP
    wait = (100 * q * q + 200 * a * a) / (2 * (1 - load))
    over = int(2 / (q + a))  # queries and answers that fill the link twice over
    routed(1, over, over)
    grows1 = over * (q + a) - 1
    wait1 = over * (q * q + a * a) / (2 * (1 - BUSY_CAP))
    sim.reuse.end = sim.start + 0.5  # half a second left at 0: a use meets a quarter's growth
    sim.prior_span = span
    want = wait + wait1 + grows1 * 0.5 / 2
    # (the compute's prior, 4 attentions a second, is far under its capacity: no growth)
    assert sim.compute.overload(1, span) == 0.0
    assert sim.routed_links(0, 1, 0.0, span, 0.0) == pytest.approx(want)
    routed(1, 100, 200)  # link 0's traffic on both: each waits M/G/1 alone, under capacity
    assert sim.routed_links(0, 1, 0.0, span, 0.0) == pytest.approx(2 * wait)
    routed(1, over, over)
    # the holder's compute holding more than that already: nothing more to pay
    assert sim.routed_links(0, 1, 0.0, span, want) == 0.0
    # asked twice what it does a second: the compute's backlog grows as fast as the link's
    sim.compute.time[1] = 1.0 + grows1 - PRIOR_USES * c.attend
    assert sim.compute.overload(1, span) == pytest.approx(grows1)
    assert sim.routed_links(0, 1, 0.0, span, 0.0) == pytest.approx(wait + wait1)
    # the same growth from work asked at arrival, not yet there (its queries in flight)
    sim.compute.time[1] = 0.0
    sim.asked[1] = 1.0 + grows1 - PRIOR_USES * c.attend
    assert sim.routed_links(0, 1, 0.0, span, 0.0) == pytest.approx(wait + wait1)
    # both links overloaded: its query meets one growth, its answer the other
    sim.asked[1] = 0.0
    routed(0, 3 * over // 4, 3 * over // 4)  # 1.5 times over
    grows0 = 3 * over // 4 * (q + a) - 1
    assert 0 < grows0 < grows1
    wait0 = 3 * over // 4 * (q * q + a * a) / (2 * (1 - BUSY_CAP))
    want = wait0 + wait1 + (grows0 + grows1) / 4
    assert sim.routed_links(0, 1, 0.0, span, 0.0) == pytest.approx(want)


def test_arrivals_count_the_links_messages_as_if_every_use_routed():
    """A use of a chunk elsewhere counts a query on its requester's link and an answer on
    its holder's; a use of a chunk here counts neither."""
    from xbench.simulate.engine import Always, Simulation

    w = Workload(instances=4, chunks=8, chunk_tokens=2048, rate_per_s=1000, fabric="ib")
    trace = _trace((0.0, 0, 1), (1e-3, 0, 0), (2e-3, 2, 1))
    sim = Simulation(PRIORS, w, trace, Always("route"), None, 0.0)
    sim.run()
    assert sim.remote_out == [1, 0, 1, 0]
    assert sim.remote_in == [0, 2, 0, 0]


def test_arrivals_count_the_batched_floor_of_the_work_they_would_ask():
    """Each use taken in adds to the compute that would attend it, were it routed, the least
    a query adds to a batched call (its rows' part of T_c: the holder's share on k
    holders, every holder's where it is spread, the requester's own where it holds one);
    a top-k request's unique KV adds its whole call at its requester."""
    from xbench.simulate.engine import OWN, Always, Simulation

    w = Workload(instances=4, chunks=8, chunk_tokens=2048, rate_per_s=1000, fabric="ib")
    sim = Simulation(PRIORS, w, _trace((0.0, 0, 1), (0.0, 0, 2)), Always("route"), None, 0.0)
    c = sim.costs
    rh = w.rows * w.heads
    floor = PRIORS.device.compute(2 * rh, 2048) - PRIORS.device.compute(rh, 2048)
    assert c.query_floor == pytest.approx(floor) and c.share_floor == c.query_floor
    sim.arrive(0, 0.0)
    sim.arrive(1, 0.0)
    assert sim.asked == pytest.approx([0.0, floor, floor, 0.0])
    spread = Workload(
        instances=4, chunks=8, chunk_tokens=2048, holders=2, unique_tokens=4096, topk=1
    )
    trace = Trace(np.zeros(3), np.array([0, 0, 0]), np.array([OWN, 3, 1]), np.array([0, 3, 1]))
    sim = Simulation(PRIORS, spread, trace, Always("route"), None, 0.0)
    share = PRIORS.device.compute(2 * rh, 1024) - PRIORS.device.compute(rh, 1024)
    assert sim.costs.share_floor == pytest.approx(share)
    for r in range(3):
        sim.arrive(r, 0.0)
    # its own KV here; chunk 3 on 3 and 0 (a share here, attended in place); chunk 1 on 1, 2
    own = PRIORS.device.compute(rh, 4096)
    assert sim.asked == pytest.approx([own + share, share, share, share])


def test_reuse_estimate_reads_counts_clocks_and_the_cache():
    from xbench.simulate.engine import PRIOR_USES, _Reuse

    w = Workload(instances=2, chunks=8, rate_per_s=800.0, cache_chunks=2)
    reuse = _Reuse(w, start=0.0, end=10.0)
    beta = w.chunks * w.instances / w.rate_per_s  # 20 ms: one use per chunk, per requester
    reuse.used(0, 1)
    # a first use reads the prior's rate (1/beta = 50/s); its 4 remote chunks compete for
    # 2 places, so a stay serves C / (n - C) = 1 use; joiners are the rate over the fetch
    joiners, after = reuse.expect(0, 1, now=0.0, fetch_time=0.01)
    assert joiners == pytest.approx(0.5) and after == pytest.approx(1.0)
    for _ in range(40):  # chunk 1 used often: its count stands out, nothing rivals it
        reuse.used(0, 1)
    rate = (PRIOR_USES + 40) / (PRIOR_USES * beta + 1.0)
    joiners, after = reuse.expect(0, 1, now=1.0, fetch_time=0.01)
    assert joiners == pytest.approx(rate * 0.01)
    assert after == pytest.approx(rate * (9.0 - 0.01))  # the stay lasts to the end
    reuse.evicted(0, idle_age=0.002)  # once the cache evicts, its measured T rules
    _, after = reuse.expect(0, 1, now=1.0, fetch_time=0.01)
    assert after == pytest.approx(math.expm1(rate * 0.002))
    none = _Reuse(Workload(instances=2, chunks=8, cache_chunks=0), 0.0, 10.0)
    none.used(0, 1)
    assert none.expect(0, 1, 0.0, 0.01)[1] == 0.0  # no cache: nothing after


def _priors_tail(seeds):
    from xbench.simulate import gain_tail, predicate_gains

    return gain_tail(
        gain
        for seed in seeds
        for gain, _ in predicate_gains(PRIORS, random_workloads(seed, 40, lengths=(500, 2000)))
    )


def _cpu_tail(seeds):
    """The profile fitted on the 2-vCPU VM (tests/data, from a `make demo` there), the move
    on the compute, where the better static policy kept every instance under 80 % busy."""
    from xbench.simulate import gain_tail, predicate_gains

    cpu = load_profile(Path(__file__).parent / "data" / "vm-cpu-profile.toml")
    return gain_tail(
        gain
        for seed in seeds
        for gain, busy in predicate_gains(
            cpu, random_workloads(seed, 30, max_rate=3000, fabrics=["shm"], move_on_compute=True)
        )
        if not busy
    )


def _assert_the_predicates_property(t, worst: float):
    """Better than the better static policy on most workloads where it chose otherwise, 90 %
    of them within 3 % (its learning cost: a chunk's first uses carry no evidence of its
    reuse), and the tail bounded as measured (ties, same choices, excluded and counted)."""
    summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in t.items()}
    assert t["compared"] >= 10, summary
    assert t["better"] >= 0.7 * t["compared"], summary
    assert t["p90"] <= 0.03 and t["worst"] <= worst, summary


def test_predicate_against_the_better_static_policy_over_seeds():
    """Seeds 0-19, 40 workloads each, not chosen: with the engine fixture (the H100 priors
    as shipped until 2026-11-26, a layer's move charged 3 ms) the predicate ties the
    better static policy on all but 22 (it routes everywhere, as they do); on those it
    was better on 18, its excess at the 90th percentile +1.8 %, worst +6.6 % (seed 2; seeds
    0-59 give 55 compared, better on 44, worst +6.7 %: the slow test). Before routed
    answers paid the holder's link backlog (moska-shared-chunk), 18 and 45 were better;
    before links were priced at their own message rates, 17 and 42. A 3 % bound on every
    workload, as this test once asserted on one seed, does not hold."""
    _assert_the_predicates_property(_priors_tail(range(20)), worst=0.07)


def test_predicate_on_a_cpu_profile_over_seeds():
    """Seeds 0-4 of the CPU profile's workloads, where the better static policy was not
    busy (seeds 0-19: 303 compared, better on 245, p99 +9.1 %, worst +10.6 %: seed 9's
    workload 19, 500 requests on shm where the link is 4 % busy, moved from +7.5 % when
    links were priced at their own message rates; its few fetch-or-route choices sit near
    the tie, and the property's tail moves with them)."""
    _assert_the_predicates_property(_cpu_tail(range(5)), worst=0.10)


@pytest.mark.slow
def test_predicate_property_over_sixty_and_twenty_seeds():
    """The property over every seed the figures in the docstrings above came from."""
    _assert_the_predicates_property(_priors_tail(range(60)), worst=0.07)
    _assert_the_predicates_property(_cpu_tail(range(20)), worst=0.11)


def test_the_move_runs_on_the_compute_where_the_profile_was_fitted_on_cpu_kernels():
    import dataclasses

    from xbench.simulate import moves_on_compute

    cpu = load_profile(Path(__file__).parent / "data" / "vm-cpu-profile.toml")
    assert moves_on_compute(cpu) and not moves_on_compute(PRIORS)
    conditions = {**cpu.provenance["conditions"], "gpu": "NVIDIA H100 80GB HBM3"}
    on_gpu = dataclasses.replace(cpu, provenance={**cpu.provenance, "conditions": conditions})
    assert not moves_on_compute(on_gpu)


def test_every_shipped_scenario_with_a_workload_loads():
    loaded = {s.stem: load_workload(s) for s in SCENARIOS if "[workload]" in s.read_text()}
    assert {"agentic-codebase", "decode-route-vs-fetch", "moska-shared-chunk"} <= set(loaded)
    # what simulate reports beside the policies comes from the scenario, not its name
    assert {name: w["reports"] for name, w in loaded.items() if w["reports"]} == {
        "moska-shared-chunk": ("batching",),
        "moska-topk": ("copies",),
    }
    assert set(loaded["decode-route-vs-fetch"]["fabrics"]) == {
        "nvlink",
        "ibgda",
        "ib",
        "roce",
        "tcp",
    }


@pytest.mark.parametrize(
    "table, words",
    [
        ("instances = 0", "instances = 0 is out of range"),
        ("colour = 3", "unknown [workload] field 'colour'"),
        ('rate = "fast"', "is not a rate"),
        ('zipf = "high"', "zipf = 'high' has the wrong type"),
        ('kind = "train"', "kind = 'train' is not a workload"),
        ('kind = "prefill"\nlocal_speed = 0', "local_speed = 0 is out of range"),
        ('kind = "prefill"\nmin_length = 9000\nmax_length = 100', "min_length 9000 > max_length"),
        ('kind = "prefill"\nchunks = 4', "unknown [workload] field 'chunks'"),
        ('reports = ["speedup"]', "reports ['speedup'] are not reports"),
        ('kind = "prefill"\nreports = ["batching"]', "unknown [workload] field 'reports'"),
        ("layers = 0", "layers = 0 is out of range"),
        ("pipeline_layers = 1", "give pipeline_layers as true or false"),
        ("layers = true", "give layers as a whole number"),
        ("fabric = []", "[workload] fabric = [] names no fabric"),  # simulated nothing, exit 0
        ('fabric = ""', "is not a list of fabric names"),
        # TOML spells nan and inf: they passed every range check and ended in a traceback
        # (a division by zero at saturation, numpy's NaN probabilities) or ran as given
        ("zipf = nan", "zipf = nan is not finite"),
        ('kind = "prefill"\nlocal_speed = inf', "local_speed = inf is not finite"),
        ('kind = "prefill"\nburst_factor = nan', "burst_factor = nan is not finite"),
        ('kind = "prefill"\nlength_sigma = -inf', "length_sigma = -inf is not finite"),
        ('kind = "prefill"\nprefixes = 3\nprefix_zipf = nan', "prefix_zipf = nan is not finite"),
        ('rate = "nan/s"', "rate = 'nan/s' is not a rate"),
        ('kind = "prefill"\nrate = "inf/s"', "rate = 'inf/s' is not a rate"),
        ("sharing = { keep = nan }", "sharing keep = nan is not finite"),
        # decide refused these shapes, and simulate ran them: decide's limits, for both
        ("chunk_tokens = 4611686018427387904", "chunk_tokens = 4611686018427387904 is beyond"),
        ("layers = 100000000", "keep layers at or below 10000"),
        ('kind = "prefill"\nmax_length = 2147483648', "keep max_length at or below 1073741824"),
    ],
)
def test_workload_errors_name_the_file_and_field(tmp_path, table, words):
    path = tmp_path / "bad.toml"
    path.write_text(f'[scenario]\nname = "bad"\nmodel = "deepseek-v3.2"\n[workload]\n{table}\n')
    import re

    with pytest.raises(ScenarioError, match=re.escape(words)) as err:
        load_workload(path)
    assert str(path) in str(err.value)


def test_simulate_writes_its_reports_beside_the_table(xbench, tmp_path):
    """--out NAME.parquet: each report goes to NAME.<report>.parquet, of its own versioned
    table with the run's metadata (the sharing report's bounds in it); an existing report
    file is refused before anything is written, and --force replaces them all."""

    from xbench.results.schema import (
        PREFILL_SATURATION,
        SHARING_CALLS,
        SHARING_STEPS,
        SPAN_HITS,
    )

    cases = (
        ("moska-shared-chunk", {"sharing-calls": SHARING_CALLS, "sharing-steps": SHARING_STEPS}),
        ("span-fanout", {"span-hits": SPAN_HITS}),
        ("span-generation", {"span-hits": SPAN_HITS}),
        ("prefill-as-a-service", {"saturation": PREFILL_SATURATION}),
        ("decode-route-vs-fetch", {}),
    )
    for name, reports in cases:
        out = tmp_path / f"{name}.parquet"
        r = xbench("simulate", name, "--requests", "300", "--out", out)
        assert r.returncode == 0, r.stderr
        written = sorted(p.name for p in tmp_path.glob(f"{name}.*.parquet"))
        assert written == sorted(f"{name}.{report}.parquet" for report in reports)
        for report, table in reports.items():
            frame = read_table([tmp_path / f"{name}.{report}.parquet"], table)
            assert len(frame) > 0 and not frame.isna().all().any()
    steps = tmp_path / "moska-shared-chunk.sharing-steps.parquet"
    run = table_run_meta(steps)
    assert run["sharing"]["paper"] == 538.7 and run["scenario"] == "moska-shared-chunk"
    saturated = read_table(
        [tmp_path / "prefill-as-a-service.saturation.parquet"], PREFILL_SATURATION
    )
    assert set(saturated.deployment) == {
        "homogeneous",
        "homogeneous, same GPUs",
        "naive heterogeneous",
        "PrfaaS, threshold",
        "PrfaaS, predicate",
    }
    # a report already there: refused, the table not written either
    fresh = tmp_path / "fresh.parquet"
    (tmp_path / "fresh.span-hits.parquet").write_text("mine")
    r = xbench("simulate", "span-fanout", "--requests", "100", "--out", fresh)
    assert r.returncode == 2 and "span-hits.parquet" in r.stderr and "already exists" in r.stderr
    assert not fresh.exists() and (tmp_path / "fresh.span-hits.parquet").read_text() == "mine"
    r = xbench("simulate", "span-fanout", "--requests", "100", "--out", fresh, "--force")
    assert r.returncode == 0 and len(read_table([tmp_path / "fresh.span-hits.parquet"], SPAN_HITS))
    # a span workload's table says what its shares and latencies are per policy
    said = " ".join(r.stdout.split())
    assert "present is each policy's KV-cache hit rate" in said and "time to first token" in said


def test_simulate_cli_every_scenario_writes_parquet(xbench, tmp_path):
    for scenario in SCENARIOS:
        if "[workload]" not in scenario.read_text() or load_workload(scenario)["kind"] != "decode":
            continue
        out = tmp_path / f"{scenario.stem}.parquet"
        r = xbench("simulate", scenario, "--requests", "400", "--out", out, "--format", "json")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)["simulation"]
        fabrics = load_workload(scenario)["fabrics"]
        assert len(rows) == 4 * len(fabrics)
        frame = read_table([out], SIMULATION)
        assert set(frame.policy) == {"route", "fetch", "local", "predicate"}
        shares = frame[[f"share_{p}" for p in PATHS]].sum(axis=1)
        assert np.allclose(shares, 1.0)
        assert (frame.p50_us <= frame.p99_us).all() and (frame.mean_us > 0).all()
    r = xbench("simulate", SCENARIOS[0], "--requests", "200")
    assert r.returncode == 0 and "vs best" in r.stdout
    # --rate replaces the scenario's: a tenth of the rate, about a tenth of the throughput
    agentic = [s for s in SCENARIOS if s.stem == "agentic-codebase"][0]
    fast, slow = (
        json.loads(
            xbench(
                "simulate",
                agentic,
                "--requests",
                "2000",
                "--policy",
                "route",
                "--fabric",
                "ib",
                "--rate",
                rate,
                "--format",
                "json",
            ).stdout
        )["simulation"][0]["throughput_per_s"]
        for rate in ("20000/s", "2000/s")
    )
    assert 8 < fast / slow < 12


def test_simulate_and_decide_take_a_scenarios_decode_step(xbench, tmp_path):
    """[workload] layers = 61 makes a use one decode step of 61 layers: simulate --layers 61
    gives the same figures, an idle route takes 61 layers' round trips, the table says what
    its times cover, and decide --scenario prices the same step."""
    src = [s for s in SCENARIOS if s.stem == "decode-route-vs-fetch"][0]
    step = tmp_path / "step.toml"
    step.write_text(src.read_text().replace("[workload]", "[workload]\nlayers = 61", 1))
    args = ("--requests", "300", "--fabric", "ib", "--rate", "20/s")
    runs = [
        {r["policy"]: r for r in json.loads(xbench("simulate", *more, *args, "--format", "json").stdout)["simulation"]}
        for more in ((step,), (src, "--layers", "61"), (src,))
    ]  # fmt: skip
    by_file, by_flag, one = runs
    assert {p: r["mean_us"] for p, r in by_file.items()} == {
        p: r["mean_us"] for p, r in by_flag.items()
    }
    assert by_file["route"]["p50_us"] == pytest.approx(61 * one["route"]["p50_us"], rel=0.02)
    table = xbench("simulate", step, *args, env={"COLUMNS": "200"}).stdout
    assert "times per use of a decode step of 61 layers" in table
    assert (
        "times per use of one layer"
        in xbench("simulate", src, *args, env={"COLUMNS": "200"}).stdout
    )
    rows = json.loads(xbench("decide", "--scenario", step, "--format", "json").stdout)
    assert rows and {r["layers"] for r in rows} == {61}
    rows = json.loads(xbench("decide", "--scenario", src, "--format", "json").stdout)
    assert {r["layers"] for r in rows} == {1}


def test_simulate_and_decide_take_a_scenarios_holders(xbench, tmp_path):
    """[workload] holders = 4 spreads each shared chunk over 4 instances: simulate --holders
    4 gives the same figures, the table and the Parquet's run metadata say so, and decide
    --scenario prices the same spread."""

    src = [s for s in SCENARIOS if s.stem == "decode-route-vs-fetch"][0]
    spread = tmp_path / "spread.toml"
    spread.write_text(src.read_text().replace("[workload]", "[workload]\nholders = 4", 1))
    args = ("--requests", "300", "--fabric", "ib", "--rate", "20/s", "--format", "json")
    by_file, by_flag, one = (
        {
            r["policy"]: r["mean_us"]
            for r in json.loads(xbench("simulate", *more, *args).stdout)["simulation"]
        }
        for more in ((spread,), (src, "--holders", "4"), (src,))
    )
    assert by_file == by_flag and by_file["route"] != one["route"]
    out = tmp_path / "sim.parquet"
    table = xbench("simulate", spread, *args[:-2], "--out", out, env={"COLUMNS": "200"}).stdout
    assert "each shared chunk on 4 holders" in table
    run = table_run_meta(out)
    assert (run["holders"], run["layers"]) == (4, 1)
    rows = json.loads(xbench("decide", "--scenario", spread, "--format", "json").stdout)
    assert rows and {r["holders"] for r in rows} == {4}
    too_many = tmp_path / "many.toml"
    too_many.write_text(src.read_text().replace("[workload]", "[workload]\nholders = 9", 1))
    r = xbench("simulate", too_many)
    assert r.returncode == 2 and "holders = 9 is more than its 8 instances" in r.stderr


def test_simulate_cli_bad_input(xbench, tmp_path):
    agentic = [s for s in SCENARIOS if s.stem == "agentic-codebase"][0]
    for args, words in [
        ((agentic, "--policy", "random"), "unknown policy"),
        ((agentic, "--fabric", "warp"), "--fabric warp: profile h100-priors has no such fabric"),
        ((agentic, "--requests", "0"), "nothing to replay"),
        ((agentic, "--requests", "0", "--validate"), "nothing to replay"),
        # numpy cannot size the arrays (was a traceback); 10^11 is out of memory (test_bad_input)
        ((agentic, "--requests", str(10**20)), "beyond what one replay holds; pass 1 to"),
        ((agentic, "--rate", "fast"), "--rate 'fast' is not a rate"),
        ((agentic, "--rate", "0/s"), "--rate '0/s' is not a rate"),
        ((agentic, "--seed", "-1"), "--seed -1"),
        ((agentic, "--fabric", ","), "empty item"),
        ((agentic, "--replays", "2"), "--replays counts --validate's replays"),
        ((agentic, "--validate", "--replays", "0"), "'--replays'"),
        ((agentic, "--validate", "--layers", "2"), "--validate replays one layer"),
        ((agentic, "--layers", "0"), "'--layers'"),
        # decide's limit, in click's words, which differ between releases
        ((agentic, "--layers", "100000"), "10000; see"),
        ((agentic, "--rate", "nan/s"), "--rate 'nan/s' is not a rate"),
        (("prefill-as-a-service", "--layers", "4"), "takes its layers from its model"),
        (("prefill-as-a-service", "--no-pipeline-layers"), "takes its layers from its model"),
        (("prefill-as-a-service", "--holders", "2"), "ships whole prompts' KV"),
        ((agentic, "--holders", "0"), "'--holders'"),
        ((agentic, "--holders", "99"), "--holders 99 is more than the workload's"),
        ((agentic, "--validate", "--holders", "2"), "spreads it over 2"),
        (("prefill-as-a-service", "--validate"), "--validate replays decode workloads"),
        ((tmp_path / "none.toml",), "does not exist"),
    ]:
        r = xbench("simulate", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert words in r.stderr.strip().splitlines()[-1]
    huge = tmp_path / "huge.toml"
    huge.write_text(
        re.sub(r"(?m)^requests = .*$", "requests = 10000000000000", agentic.read_text())
    )
    r = xbench("simulate", huge)
    assert r.returncode == 2 and "requests = 10000000000000 is beyond" in r.stderr, r.stderr
    plain = tmp_path / "plain.toml"
    plain.write_text('[scenario]\nname = "plain"\nmodel = "deepseek-v3.2"\n[grid]\nrows = [1]\n')
    r = xbench("simulate", plain)
    assert r.returncode == 2 and "no [workload]" in r.stderr


def test_speed_benchmark_runs(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "simulate_speed.py"),
            "--requests",
            "3000",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "3,000 requests" in r.stdout and "best" in r.stdout


# --- prefill-as-a-service: prefill here, or there and ship the KV ---------------------------

PW = PrefillWorkload(
    local_instances=1, remote_instances=2, local_speed=0.25, layers=4, kv_bytes_per_token=1152
)


def _prefill_trace(*rows):
    a, lengths = zip(*rows, strict=True)
    return PrefillTrace(np.array(a, float), np.array(lengths, float))


def test_prefill_costs_are_the_models_recompute_over_the_instance():
    c = PrefillCosts(PRIORS, PW)
    d = PRIORS.device
    tokens = 8192
    per_layer = tokens * d.recompute_per_token.value + tokens**2 * d.recompute_per_token2.value
    assert d.recompute(tokens) == pytest.approx(per_layer)
    assert c.prefill(tokens) == pytest.approx(4 * per_layer / 8)
    assert c.local(tokens) == pytest.approx(c.prefill(tokens) / 0.25)
    kv = tokens * 1152 * 4
    assert c.transfer(tokens) == pytest.approx(PRIORS.fabric("tcp").wire(kv, 4))
    assert c.kv_rate(tokens) == pytest.approx(kv / c.prefill(tokens))
    # the quadratic term: a long prefill produces its KV more slowly than a short one
    assert c.kv_rate(131072) < c.kv_rate(32768) < c.kv_rate(4096)
    one = _prefill_trace((0.0, tokens))
    assert simulate_prefill(PRIORS, PW, one, "local").latency[0] == pytest.approx(c.local(tokens))
    assert simulate_prefill(PRIORS, PW, one, "offload").latency[0] == pytest.approx(
        c.offload(tokens)
    )


def test_a_remote_prefill_pays_its_prompt_and_the_splice_here():
    """Offloading sends the prompt there and splices every landed layer's KV here, which a
    local prefill (writing its KV in place) does not: on idle resources both are in its
    time, as a pipeline over the layers with the prefill and the transfer, and in the
    length from which it wins."""
    c = PrefillCosts(PRIORS, PW)
    d = PRIORS.device
    tokens = 8192
    assert c.prompt(tokens) == pytest.approx(PRIORS.fabric("tcp").wire(4 * tokens))
    splice = d.move(tokens, 2) if d.splice_t0 is not None else d.move(tokens, 1)
    assert c.splice(tokens) == pytest.approx(splice) and splice > 0
    stages = (c.prefill(tokens) / 4, c.transfer(tokens) / 4, splice)
    assert c.offload(tokens) == pytest.approx(c.prompt(tokens) + sum(stages) + 3 * max(stages))
    parts = c.parts(tokens)
    assert parts["offload"] == c.offload(tokens) and parts["splice"] == pytest.approx(4 * splice)
    assert (
        parts["offload"]
        < parts["prompt"] + parts["remote_prefill"] + parts["transfer"] + parts["splice"]
    )
    t = c.idle_threshold()
    assert 0 < t < math.inf
    assert c.offload(t) < c.local(t) and c.offload(t - 1) >= c.local(t - 1)
    assert c.parts(math.inf) is None and c.parts(0.0) is None


def test_prefill_queues_at_instances_and_the_link():
    c = PrefillCosts(PRIORS, PW)
    both = _prefill_trace((0.0, 4096), (0.0, 4096))
    local = simulate_prefill(PRIORS, PW, both, "local")  # one local instance: FIFO
    assert local.latency[1] == pytest.approx(2 * c.local(4096))
    # KV heavy enough that the link binds: two remote instances prefill at once, and the
    # second transfer waits for the first on the shared link
    heavy = PrefillWorkload(**{**PW.__dict__, "kv_bytes_per_token": 2e6})
    h = PrefillCosts(PRIORS, heavy)
    x = h.transfer(4096)
    assert x > h.prefill(4096)
    res = simulate_prefill(PRIORS, heavy, both, "offload")
    assert res.latency[0] == pytest.approx(h.offload(4096))
    assert res.latency[1] == pytest.approx(res.latency[0] + x)
    assert res.link_busy == pytest.approx(2 * x)
    split = simulate_prefill(
        PRIORS, PW, _prefill_trace((0.0, 1000), (0.0, 9000)), "threshold", threshold=4096
    )
    assert split.offloaded.tolist() == [False, True]


def test_prefill_scenario_finds_a_threshold(xbench, tmp_path):
    scenario = [s for s in SCENARIOS if s.stem == "prefill-as-a-service"][0]
    spec = load_workload(scenario)
    assert spec["kind"] == "prefill" and spec["fields"]["layers"] == 61
    out = tmp_path / "prefill.parquet"
    r = xbench("simulate", scenario, "--requests", "1500", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "offload threshold (tcp):" in r.stdout and "Gb/s" in r.stdout
    said = " ".join(r.stdout.split())
    assert "on idle resources offloading wins from" in said
    assert "the prompt sent" in said and "spliced here" in said  # the costs it counted
    frame = read_table([out], PREFILL_SIMULATION)
    grid = frame[frame.policy == "threshold"]
    assert len(grid) > 10 and grid.best.sum() == 1
    best = grid[grid.best].iloc[0]
    assert best.mean_ms == grid.mean_ms.min()
    # offloading more means more bytes on the link
    ordered = grid.sort_values("threshold_tokens")
    assert (np.diff(ordered.bytes_moved) <= 0).all()
    assert 0 < best.share_offloaded < 1 and 0 < best.link_util < 1
    assert set(frame.policy) == {"local", "offload", "predicate", "threshold"}


# --- span fan-out: a prefix, then commuting chunks whose reuse the expressions give -------


def test_span_expressions_parse_and_bad_ones_are_named(tmp_path):
    from xbench.core.scenario import parse_span

    assert parse_span("system + {repo/a, repo/b}") == ("system", ("repo/a", "repo/b"))
    assert parse_span("{x}") == (None, ("x",))
    # the paper's forms: positional parts joined into the requester's own prefix, every
    # name in braces (nested too) a shared chunk
    assert parse_span("system + tools + {a, b}") == ("system + tools", ("a", "b"))
    assert parse_span("system + {a, b} + question") == ("system + question", ("a", "b"))
    assert parse_span("{a, {b, c}}") == (None, ("a", "b", "c"))
    for bad in ("system + repo/a", "{a, a}", "{}", "{a, {a}}"):
        with pytest.raises(ValueError):
            parse_span(bad)
    head = '[scenario]\nname = "s"\nmodel = "deepseek-v3.2"\n[workload]\n'
    for table, words in [
        ('spans = [{ expr = "{a, a}" }]', "spans[0] expr = '{a, a}': a named twice"),
        ('spans = [{ expr = "s + {a b}" }]', "expr = 's + {a b}': at column 8: expected"),
        ('spans = [{ expr = "{a}" }]\nspan_tokens = { b = 4 }', "names 'b', which no span does"),
        ('spans = [{ expr = "{a}" }]\nspan_tokens = { a = 0 }', "span_tokens.a = 0 is not"),
        ("chunks = 4\nblock_tokens = 16", "gives block_tokens without spans"),
        ('spans = [{ expr = "{a}", weight = 0 }]', "spans[0] weight = 0 is not a finite number"),
        # these three ended in numpy's "Probabilities contain NaN" or a division by zero
        ('spans = [{ expr = "{a}", weight = nan }]', "weight = nan is not a finite number > 0"),
        ('spans = [{ expr = "{a}", weight = inf }]', "weight = inf is not a finite number > 0"),
        (
            'spans = [{ expr = "{a}", weight = 1e308 }, { expr = "{b}" }]',
            "spans' weights are too large to weigh together",
        ),
        ('spans = [{ expr = "{a}" }]\nzipf = 1.0', "gives spans and zipf"),
        ("spans = []", "spans must be a non-empty list"),
    ]:
        path = tmp_path / "s.toml"
        path.write_text(head + table + "\n")
        with pytest.raises(ScenarioError, match=re.escape(words)):
            load_workload(path)


def test_a_span_request_fans_out_and_ends_with_its_slowest_use():
    from xbench.simulate import request_latency

    spans = (("sys", ("a", "b"), 1.0), (None, ("b",), 1.0))
    w = Workload(instances=2, chunks=4, rate_per_s=100.0, fabric="ib", spans=spans)
    trace = make_trace(w, 400, seed=3)
    starts = np.flatnonzero(np.r_[True, np.diff(trace.request) != 0])
    assert len(starts) == 400 and np.all(np.diff(trace.request) >= 0)
    sizes = np.diff(np.r_[starts, len(trace)])
    assert set(sizes) == {1, 3}  # "{b}" is one use; "sys + {a, b}" three
    first = trace.chunk[starts]
    prefix = sizes == 3
    # the prefix is each requester's own copy (held where it is asked), the others at k % 2
    assert (trace.holder[starts][prefix] == trace.requester[starts][prefix]).all()
    assert set(first[prefix]) <= {2, 3} and (first[~prefix] == 1).all()
    assert (trace.holder[trace.chunk < 2] == trace.chunk[trace.chunk < 2] % 2).all()
    assert w.uses_per_s == pytest.approx(100.0 * 2) and w.shared_chunks == 2
    res = simulate(PRIORS, w, trace, "route")
    per_request = request_latency(res, trace)
    assert len(per_request) == 400
    assert per_request == pytest.approx(np.maximum.reduceat(res.latency, starts))
    assert (per_request >= res.latency[starts]).all()


def test_span_reuse_flips_route_to_fetch_past_the_threshold():
    from xbench.simulate import span_reuse

    scenario = [s for s in SCENARIOS if s.stem == "span-fanout"][0]
    spec = load_workload(scenario)
    spec["fabrics"] = ["roce"]
    reuse = span_reuse(PRIORS, spec, 8000, 0).sort_values("uses_per_requester")
    u_star = reuse.u_star.iloc[0]
    rare, common = reuse.iloc[0], reuse.iloc[-1]
    assert rare.uses_per_requester < u_star < common.uses_per_requester
    assert common.routed < 0.05 and rare.routed > 0.5


# --- simulate --validate: the same trace replayed for real between two ranks ------------


LOOK = """
import time
import numpy as np
from mpi4py import MPI
from xbench.simulate.replay import message_waiting

comm, status = MPI.COMM_WORLD, MPI.Status()
for size in (1024, 18440):  # a small message, and a routed query's (one row, 16 heads)
    for _ in range(3):
        comm.Barrier()
        if comm.rank == 0:  # sends, then computes away from MPI
            req = comm.Isend(np.ones(size, np.uint8), dest=1, tag=11)
            until = time.perf_counter() + 0.04
            while time.perf_counter() < until:
                pass
            req.Wait()
        else:  # computes while it arrives, then looks once, as the replay's loop does
            # (20 ms: long enough that the sender, on a VM's shared cores, has sent; a
            # 5 ms window missed once in a loaded suite run)
            until = time.perf_counter() + 0.02
            while time.perf_counter() < until:
                pass
            print("seen" if message_waiting(comm, status) else "missed", flush=True)
            comm.Recv(np.empty(size, np.uint8), source=0, tag=11)
"""


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_replay_sees_at_once_a_message_that_came_while_it_computed(tmp_path):
    """Real ranks: a message that arrived while the replay's rank computed is seen the
    first time its loop looks (one MPICH Iprobe there missed it, and the replay took
    messages in a job late: routed requests' tail)."""
    import subprocess
    import sys

    from conftest import BIN

    script = tmp_path / "look.py"
    script.write_text(LOOK)
    r = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["seen"] * 6


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_replay_gathers_a_fetched_chunk_into_a_staging_buffer_it_sends_from():
    """Built by the replay's code on one real rank (MPI_COMM_SELF): a gather packs the
    request's number and then exactly the chunk's tokens into one of the buffers made
    before the clock (the copy the sweep timed, no second one into a packet), the buffer is
    sent as it is, and it goes back to the pool once the send completes."""
    code = """
import json, numpy as np, torch
from mpi4py import MPI
from xbench.kernels import gather_kv
from xbench.simulate.replay import Instance, ReplayConfig, KV
cfg = ReplayConfig(out_dir="-", run_id="-", policy="fetch", arrival=[0.0, 0.0],
                   requester=[1, 1], chunk=[2, 4], chunk_tokens=256)
me = Instance(cfg, MPI.COMM_SELF)
made = {b.ctypes.data for b in me.staging}
buf = me.staged_gather(7, 4)
first = len(me.staging)
me.send(buf, 0, KV, me.staging)
got = np.empty(buf.size, np.uint8)
MPI.COMM_SELF.Recv(got, source=0, tag=KV)
while me.sends:
    me.reap()
tokens = torch.from_numpy(got[8:]).view(torch.bfloat16).view(256, cfg.dim)
print(json.dumps({
    "from_pool": buf.ctypes.data in made, "left": first, "back": len(me.staging),
    "request": int(got[:8].view(np.int64)[0]),
    "tokens": bool(torch.equal(tokens, gather_kv(me.home[4], me.sel))),
    "other_chunk": bool(torch.equal(tokens, gather_kv(me.home[2], me.sel))),
}))
"""
    done = run_one_rank(code)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "from_pool": True,
        "left": 3,
        "back": 4,
        "request": 7,
        "tokens": True,
        "other_chunk": False,
    }


@pytest.mark.mpi
@pytest.mark.mpi_default  # shorter replay tests run under every MPI
def test_validate_replays_the_trace_between_two_ranks(xbench, tmp_path):
    scenario = tmp_path / "small.toml"
    scenario.write_text(
        '[scenario]\nname = "small"\nmodel = "deepseek-v3.2"\n[request]\nheads = 4\n'
        "[workload]\ninstances = 8\nchunks = 64\nchunk_tokens = 256\nzipf = 1.0\n"
        'cache_chunks = 4\nfabric = "ib"\n'
    )
    out = tmp_path / "validation.parquet"
    r = xbench(
        "simulate",
        scenario,
        "--validate",
        "--fabric",
        "ib",
        "--requests",
        "120",
        "--rate",
        "200/s",
        "--replays",
        "2",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "over 2 rounds" in text and "err's interval over the 2 rounds (95 % nominal)" in text
    assert "not fitted on CPU kernels" in r.stderr  # the priors: a warning, not a refusal
    from xbench.results.schema import SIMULATION_VALIDATION

    frame = read_table([out], SIMULATION_VALIDATION)
    (replays,) = tmp_path.glob("simulate-validate-*")  # the replays' files beside --out
    assert {"replay-route.json", "replay-calibrate-fetch.json"} <= {
        p.name for p in replays.iterdir()
    }
    # each policy simulated with the profile's costs, the calibration replay's, and the
    # costs its own replay measured
    assert list(frame.policy) == [p for p in ("route", "fetch", "predicate") for _ in range(3)]
    assert list(frame.costs) == ["profile", "calibrated", "replayed"] * 3
    import pyarrow.parquet as pq

    run = json.loads(pq.read_schema(out).metadata[b"xbench.run"])
    assert run["calibration"]["requests"] == 200  # the calibration trace: another, of 200
    by_policy = run["calibration"]["by_policy"]
    assert set(by_policy) == {"route", "fetch", "predicate"}
    for both in by_policy.values():  # a replay of another trace before, and its own
        for factors in (both["calibrated"], both["replayed"]):
            assert factors["attention"] > 0 and factors["attention_calls"] > 0
    assert (frame.requests == 120).all() and (frame.rate_per_s == 200).all()
    for stat in ("p50_us", "p99_us", "mean_us", "throughput_per_s"):
        real, sim = frame[f"measured_{stat}"], frame[f"simulated_{stat}"]
        assert (real > 0).all() and (sim > 0).all()
        assert np.allclose(frame[f"error_{stat}"], sim / real - 1)
    # a stable replay keeps up with its arrivals: throughput near the offered rate
    assert ((frame.measured_throughput_per_s > 100) & (frame.measured_throughput_per_s < 400)).all()
    assert (frame.routed_instead[frame.policy != "predicate"] == 0).all()
    from xbench.simulate.validation import error_interval

    # two rounds, each a calibration replay and then the trace's: measured is the median
    # of the trace's two replays, the floor how far each landed from it, on each costs row
    assert (frame.replays == 2).all() and (frame.central == "median").all()
    names = {p.name for p in replays.iterdir()}
    for policy, rows in frame.groupby("policy"):
        assert f"replay-calibrate-{policy}-again-2.json" in names
        runs = [
            np.array(json.loads((replays / f"replay-{name}.json").read_text())["latency"])
            for name in (policy, f"{policy}-again-2")
        ]
        for stat, q in (("p50_us", 50), ("p99_us", 99)):
            each = np.array([np.percentile(run, q) * 1e6 for run in runs])
            middle = np.median(each)
            assert rows[f"measured_{stat}"].to_numpy() == pytest.approx([middle] * 3)
            expected = np.abs(each / middle - 1).max()
            assert rows[f"floor_{stat}"].to_numpy() == pytest.approx([expected] * 3)
            # the profile's error: its interval over the two rounds, each paired with the
            # one simulation
            (profile_row,) = rows[rows.costs == "profile"].itertuples()
            low, high = error_interval([getattr(profile_row, f"simulated_{stat}")] * 2, each)
            assert getattr(profile_row, f"error_low_{stat}") == pytest.approx(low)
            assert getattr(profile_row, f"error_high_{stat}") == pytest.approx(high)
        assert (rows.error_coverage == 0.95).all()
        assert (rows.floor_throughput_per_s >= 0).all() and rows.floor_mean_us.notna().all()
    for both in by_policy.values():  # each round's factors kept, the table's are medians
        assert len(both["rounds"]) == 2
        attention = [r["calibrated"]["attention"] for r in both["rounds"]]
        assert both["calibrated"]["attention"] == pytest.approx(np.median(attention))
    # xbench report draws it: replays with their floors, the simulations as markers
    from test_report import coloured_share

    r = xbench("report", out, "--out", tmp_path / "report")
    assert r.returncode == 0, r.stderr
    (png,) = (tmp_path / "report").glob("validation-*.png")
    assert coloured_share(png) > 0.0005
    r = xbench("simulate", SCENARIOS[0], "--validate", "--profile", "h100-priors")
    assert r.returncode == 2 and "no local fabric (shm)" in r.stderr
    span = [s for s in SCENARIOS if s.stem == "span-fanout"][0]
    r = xbench("simulate", span, "--validate", "--fabric", "ib")
    assert r.returncode == 2 and "one chunk per request" in r.stderr


def test_the_errors_interval_covers_an_unbiased_simulator_as_its_label_says():
    """Monte Carlo of the validation's rounds (issue 39: the floor, one replay's largest
    distance from the median, held an unbiased simulator's error only 73 % of the time): a
    simulator without bias, replays drifting by a log-normal 0.12 round to round, 3 rounds;
    the interval holds 0 at its nominal 95 % (the t interval is exact under this drift), and
    a +25 % bias is outside it more often than not only with more rounds, as t says."""
    from xbench.simulate.validation import ERROR_COVERAGE, error_interval

    rng = np.random.default_rng(7)
    trials = 2000

    def holds_zero(bias: float, rounds: int) -> float:
        held = 0
        for _ in range(trials):
            real = 100 * np.exp(rng.normal(0, 0.12, rounds))
            low, high = error_interval([100 * (1 + bias)] * rounds, real)
            held += low <= 0 <= high
        return held / trials

    assert ERROR_COVERAGE == 0.95
    assert 0.93 <= holds_zero(0.0, 3) <= 0.97
    assert 0.93 <= holds_zero(0.0, 6) <= 0.97
    assert holds_zero(0.25, 3) > 0.5 > holds_zero(0.25, 8)  # few rounds cannot tell
    assert all(math.isnan(x) for x in error_interval([1.0], [1.0]))  # one round: none


def test_a_fetch_pays_for_the_answers_it_holds_up_on_the_holders_link():
    """The sourced priors, seed 3's TCP workload (8 instances, 16 chunks of 8K tokens, 43K
    uses a second): a fetch holds the holder's link for 0.8 ms while the routed answers
    queued behind it wait. Charged for that delay, the predicate's mean latency is within
    1.6x always-route's (2.17x when it was not)."""
    from xbench.simulate import summarize

    sourced = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "h100-priors.toml")
    (w, trace), *_ = [
        (w, t)
        for w, t in random_workloads(3, 40, lengths=(500, 2000))
        if w.fabric == "tcp" and w.instances == 8 and w.chunks == 16
    ]
    mean = {
        p: summarize(simulate(sourced, w, trace, p), p, w.fabric, trace)["mean_us"]
        for p in ("route", "predicate")
    }
    assert mean["predicate"] <= 1.6 * mean["route"], mean


def test_the_predicate_prices_routed_answers_on_a_congested_holders_link():
    """moska-shared-chunk (the sourced priors, seed 0), every instance a holder: routing
    every use overloads the links with answers, while fetches coalesce (uses arriving during
    one join it). Each routed answer and query waits behind its link's backlog, the joiners'
    too, and each option pays for the link time it adds at that link's own message rate:
    a later routed use also pays the wait its links would meet if every use routed (their
    backlogs' growth past capacity), so the early uses no longer route over links idle only
    because the trace has just begun: the predicate stays within 1 % of always-fetch's mean
    latency on both fabrics (seeds 0-4 as measured: ib +0.00 %, nvlink -0.03 to +0.43 %;
    before, ib +0.2 to +3.0 %, nvlink +0.1 to +2.0 %; 6.4x on ib when answers rode the link
    for free, 1.9-2.1x with a fetch's link time charged at the arrivals' rate)."""
    from xbench.resources import profile_path, scenario_path
    from xbench.simulate import run

    sourced = load_profile(profile_path("h100-priors"))
    spec = load_workload(scenario_path("moska-shared-chunk"))
    assert spec["fabrics"] == ["ib", "nvlink"]
    frame = run(sourced, spec, ["route", "fetch", "predicate"], 20000, 0)
    for fabric, by in frame.groupby("fabric"):
        mean = by.set_index("policy").mean_us
        assert mean["fetch"] < mean["route"] / 3, (fabric, mean)  # the workload's premise
        assert mean["predicate"] <= 1.01 * mean["fetch"], (fabric, mean)


def test_decide_and_simulate_agree_on_every_shipped_scenario_or_say_why(xbench):
    """One answer for one question: on every shipped decode scenario and fabric (the
    sourced priors, seeds 0-2), decide for one use of the workload's shape, at the reuse a
    fetch found in the simulation (uses that joined it or found it cached), names the better
    static policy, or always-route kept a link or compute busy (decide prices idle
    resources), and simulate says which."""
    from xbench.resources import profile_path, scenario_path
    from xbench.simulate import BUSY, decide_beside, run

    sourced = load_profile(profile_path("h100-priors"))
    decode = [
        s.stem
        for s in SCENARIOS
        if "[workload]" in s.read_text() and load_workload(s)["kind"] == "decode"
    ]
    assert {
        "decode-route-vs-fetch",
        "span-fanout",
        "agentic-codebase",
        "moska-shared-chunk",
    } <= set(decode)
    parted = []
    for name in decode:
        spec = load_workload(scenario_path(name))
        for seed in range(3):
            beside = decide_beside(
                sourced, spec, run(sourced, spec, ["route", "fetch"], 4000, seed)
            )
            assert list(beside.fabric) == spec["fabrics"]
            same = beside.decide_at_uses == beside.better_static
            assert (same | (beside.route_busy >= BUSY)).all(), (name, seed, beside)
            parted += [(name, f) for f in beside.fabric[~same]]
    assert ("moska-shared-chunk", "nvlink") in parted  # coalesced fetches on a congested link
    r = xbench("simulate", "moska-shared-chunk", "--requests", "4000", env={"COLUMNS": "400"})
    lines = [line for line in r.stdout.splitlines() if line.startswith("decide on ")]
    assert len(lines) == 2 and "(decide prices idle resources)" in lines[1], r.stdout
    assert "here a fetch served" in lines[0] and "at which decide says fetch" in lines[0]


def test_decide_and_simulate_part_on_requests_of_several_chunks_and_say_why(xbench, tmp_path):
    """Requests that each attend 4 chunks of 8K tokens, far past u* uses a fetch: decide
    (one use) says fetch, yet always-route's requests end sooner, their uses running at
    once at 4 holders where fetch's queue on the requester's compute; with one chunk a
    request, fetch wins as decide says."""
    from xbench.simulate import decide_beside, parted_by_fanout, run

    body = (
        '[scenario]\nname = "fan"\nmodel = "deepseek-v3.2"\n[request]\nheads = 16\n'
        '[workload]\ninstances = 8\nchunk_tokens = 8192\nrate = "50/s"\nfabric = ["ib"]\n'
        "cache_chunks = 6\nrequests = 3000\nspans = [\n"
        '  { expr = "system + {d1, d2, d3, d4} + q1" },\n'
        '  { expr = "system + {d3, d1, d4, d2} + q2" },\n]\n'
    )
    sourced = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "h100-priors.toml")
    for chunks, parted in (("{d1, d2, d3, d4}", True), ("{d1}", False)):
        path = tmp_path / f"fan{parted}.toml"
        path.write_text(
            body.replace("{d1, d2, d3, d4}", chunks).replace("{d3, d1, d4, d2}", chunks)
        )
        spec = load_workload(path)
        beside = decide_beside(sourced, spec, run(sourced, spec, ["route", "fetch"], 3000, 0))
        assert beside.decide_at_uses.tolist() == ["fetch"]
        assert parted_by_fanout(beside).tolist() == [parted], beside
        assert beside.better_static.tolist() == ["route" if parted else "fetch"]
        if parted:
            r = xbench("simulate", path, "--requests", "3000", env={"COLUMNS": "400"})
            (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("decide on ib")]
            assert "a request attends 4.0 chunks on average and ends with its slowest" in line


def test_one_policy_prints_its_table_without_decide_beside(xbench):
    """decide's answer is set beside route and fetch run together: with one policy there is
    nothing beside it, and the table prints whole."""
    r = xbench("simulate", "span-fanout", "--policy", "route", "--requests", "300")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "decide on" not in r.stdout and "span hit rates" in r.stdout


def test_json_and_csv_carry_every_table_simulate_shows(xbench):
    """A span workload's reuse and hit-rate tables and decide's answers beside the
    simulation, and a prefill workload's deployments at saturation: in JSON, one object of
    each table's rows by name; in CSV, one table whose first column names each row's."""
    import csv
    import io

    span = ("simulate", "span-fanout", "--requests", "300")
    tables = json.loads(xbench(*span, "--format", "json").stdout)
    assert {"simulation", "decide", "span_reuse", "span_hits"} <= set(tables)
    assert {"expr", "ttft_dependent_s", "ttft_independent_s"} <= set(tables["span_hits"][0])
    rows = list(csv.DictReader(io.StringIO(xbench(*span, "--format", "csv").stdout)))
    by_table = {name: [r for r in rows if r["table"] == name] for name in tables}
    assert {name: len(r) for name, r in by_table.items()} == {
        name: len(r) for name, r in tables.items()
    }
    assert by_table["simulation"][0]["requests"] == str(tables["simulation"][0]["requests"])
    prefill = ("simulate", "prefill-as-a-service", "--requests", "300", "--format", "json")
    tables = json.loads(xbench(*prefill).stdout)
    assert set(tables) == {"simulation", "saturation"} and tables["saturation"]
