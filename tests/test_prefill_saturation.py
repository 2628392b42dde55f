"""Prefill deployments at saturation (simulate.prefill.saturation): the highest rate each
keeps up with, against capacities worked out by hand on one prompt length."""

from pathlib import Path

import pytest

from xbench.core.profile import load_profile
from xbench.simulate.prefill import (
    PrefillCosts,
    PrefillWorkload,
    keeps_up,
    make_prefill_trace,
    simulate_prefill,
    sustainable_rate,
)

PRIORS = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "h100-priors.toml")
L = 8192


def _one_length(**kw) -> PrefillWorkload:
    """Every prompt L tokens long: each deployment's capacity is a quotient."""
    base = dict(local_instances=2, remote_instances=1, local_speed=0.3, length_median=L)
    return PrefillWorkload(**{**base, **kw, "length_sigma": 0.0, "fabric": "tcp"})


@pytest.mark.parametrize("seed", [0, 1])
def test_each_deployment_saturates_where_its_busiest_resource_does(seed):
    w = _one_length()
    c = PrefillCosts(PRIORS, w)
    here = w.local_instances / c.local(L)  # instances over one prefill each
    there = min(w.remote_instances / c.prefill(L), 1 / c.transfer(L))
    assert 1 / c.transfer(L) > w.remote_instances / c.prefill(L)  # compute binds there
    for policy, capacity in (("local", here), ("offload", there), ("predicate", here + there)):
        found = sustainable_rate(PRIORS, w, policy, 2000, seed)
        assert 0.96 * capacity <= found <= 1.03 * capacity, (policy, found, capacity)


def test_offloading_short_prompts_saturates_the_link_first():
    w = _one_length(remote_instances=8, length_median=512)
    c = PrefillCosts(PRIORS, w)
    link = 1 / c.transfer(512)
    assert link < w.remote_instances / c.prefill(512)  # short prompts: the link binds
    found = sustainable_rate(PRIORS, w, "offload", 2000, 0)
    assert 0.96 * link <= found <= 1.03 * link


def test_an_overloaded_deployment_does_not_keep_up():
    w = _one_length()
    c = PrefillCosts(PRIORS, w)
    capacity = w.local_instances / c.local(L)
    for rate, expected in ((0.8 * capacity, True), (1.1 * capacity, False)):
        wr = PrefillWorkload(**{**w.__dict__, "rate_per_s": rate})
        trace = make_prefill_trace(wr, 2000, 0)
        assert keeps_up(simulate_prefill(PRIORS, wr, trace, "local"), trace) is expected


def test_simulate_compares_the_deployments_at_saturation(xbench):
    r = xbench("simulate", "prefill-as-a-service", "--requests", "1000", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "deployments at saturation" in flat
    for name in ("homogeneous", "naive heterogeneous", "PrfaaS, threshold", "PrfaaS, predicate"):
        assert f" {name} " in flat
    assert "+54 %" in flat and "+32 %" in flat
