"""The simulator as an engine (issue 41): its outputs on fixed seeds of every shipped
scenario match the golden file written by the engine before it was restructured (one
function of closures); policies are objects registered by name and asked only what the
engine cannot settle itself; the effects that stretch a job are chosen by what the profile
and the run have."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from simulate_golden import GOLDEN, outputs

from xbench.core.costmodel import Coef
from xbench.core.profile import load_profile
from xbench.simulate import PATHS, POLICIES, Workload, simulate
from xbench.simulate.engine import Policy, Simulation, Trace, _Costs

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

DATA = Path(__file__).parent / "data"
FIXTURE = load_profile(DATA / "engine-fixture.toml")
CPU = load_profile(DATA / "vm-cpu-profile.toml")
W = Workload(instances=2, chunks=2, chunk_tokens=2048, rate_per_s=1000, cache_chunks=4, fabric="ib")


def test_outputs_match_the_golden_file():
    """Every shipped decode scenario, its fabrics, a CPU profile with the move on the
    compute, message costs, a measured spread and merges after waits: the same latencies,
    paths, busy times, bytes and batches as the engine before (python
    tests/simulate_golden.py rewrites the file when a change to the model is meant to
    change them)."""
    want = json.loads(GOLDEN.read_text())
    got = outputs()
    assert got.keys() == want.keys()
    for key, figures in want.items():
        for name, value in figures.items():
            # exact but for the last bits a platform's libm may round differently
            assert got[key][name] == pytest.approx(value, rel=1e-12, abs=0), (key, name)


def _trace(*rows):
    a, r, k = zip(*rows, strict=True)
    return Trace(np.array(a, float), np.array(r), np.array(k))


class _Recorded(Policy):
    """Fetches its first question's chunk, routes the rest; keeps what it was asked."""

    def __init__(self):
        self.asked = []

    def choose(self, sim, r, me, k, holder, now):
        self.asked.append((r, me, k, holder))
        return "fetch" if len(self.asked) == 1 else "route"


def test_a_policy_is_asked_only_where_the_chunk_is_neither_here_nor_on_its_way():
    trace = _trace(
        (0.0, 0, 1),  # chunk 1 lives on 1: asked (fetch)
        (1e-6, 0, 1),  # on its way to 0: waits for it
        (0.5, 0, 1),  # in 0's cache
        (0.6, 1, 1),  # home
        (0.7, 1, 0),  # chunk 0 lives on 0: asked (route)
    )
    policy = _Recorded()
    result = Simulation(FIXTURE, W, trace, policy, None, 0.0).run()
    assert policy.asked == [(0, 0, 1, 1), (4, 1, 0, 0)]
    assert [PATHS[p] for p in result.path] == ["fetch", "present", "present", "present", "route"]
    assert result.latency.min() > 0


def test_policies_are_registered_by_name():
    trace = _trace((0.0, 0, 1), (0.1, 1, 0))
    for name, make in POLICIES.items():
        assert isinstance(make(), Policy)
        if name == "local" and FIXTURE.device.recompute_per_token is None:
            continue
        paths = {PATHS[p] for p in simulate(FIXTURE, W, trace, name).path}
        if name == "predicate":
            assert paths <= {"route", "fetch", "local"}
        else:
            assert paths == {name}
    with pytest.raises(ValueError, match="unknown policy 'nearest'"):
        simulate(FIXTURE, W, trace, "nearest")


def test_a_run_stretches_jobs_with_the_effects_it_has():
    trace = _trace((0.0, 0, 1))
    on_cpu = replace(Workload(chunks=2, instances=2, fabric="shm"), move_on_compute=True)

    def stretches(profile, w, spread=None, message_cost=0.0):
        sim = Simulation(profile, w, trace, POLICIES["route"](), spread, message_cost)
        return [effect.__name__ for effect in sim.stretches]

    assert stretches(FIXTURE, W) == []  # the fixture measured no idle, no merge after wait
    assert stretches(CPU, on_cpu) == ["_after_idle"]
    assert stretches(CPU, on_cpu, [[1.0, 1.2]], 2e-6) == [
        "_message_overhead",
        "_spread",
        "_after_idle",
    ]
    waits = replace(
        CPU.device,
        merge_wait_t0=Coef(3e-5, 3e-5, 3e-5, "s"),
        merge_wait_per_row_partial=Coef(1e-9, 1e-9, 1e-9, "s/row-partial"),
        merge_wait_tau=Coef(2e-4, 2e-4, 2e-4, "s"),
    )
    assert stretches(replace(CPU, device=waits), on_cpu)[-1] == "_merge_after_wait"
    # the message cost is taken on the rank's core only where it also computes
    assert stretches(CPU, replace(on_cpu, move_on_compute=False), None, 2e-6) == ["_after_idle"]


def test_batched_times_are_read_once_per_size():
    c = _Costs(FIXTURE, W)
    heads, tokens = W.heads, W.chunk_tokens
    assert c.batched[3] == FIXTURE.device.compute(3 * heads, tokens)
    assert c.joins[0] == c.batched[W.rows]
    assert c.joins[2] == c.batched[3 * W.rows] - c.batched[2 * W.rows]
    assert c.batched_attend(3) is c.batched[3] and c.joins_batch(2) is c.joins[2]
