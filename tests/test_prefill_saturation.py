"""Prefill-as-a-service under load: bursty arrivals, and the deployments at saturation
(simulate.prefill.saturation): the highest rate each keeps up with, against capacities
worked out by hand on one prompt length."""

import re
from pathlib import Path

import numpy as np
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

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

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


def test_a_deployment_on_a_sliver_of_the_fleet_still_finds_its_rate():
    """The bisection's bracket starts at the whole fleet / 1024; a deployment far below
    that (a cluster at a millionth of the device's speed, alone) was called 0/s, and the
    others' "vs homogeneous" a division by zero."""
    w = _one_length(local_speed=1e-6)
    c = PrefillCosts(PRIORS, w)
    here = w.local_instances / c.local(L)
    fleet = (w.local_instances * w.local_speed + w.remote_instances) / c.prefill(L)
    assert here < fleet / 1024  # below the old bracket
    for seed in (0, 1):
        found = sustainable_rate(PRIORS, w, "local", 2000, seed)
        assert 0.96 * here <= found <= 1.03 * here, (seed, found / here)


def test_a_deployment_that_keeps_up_with_nothing_compares_as_missing():
    from xbench.simulate.prefill import saturation

    w = _one_length()
    spec = {"fabrics": ["tcp"], "fields": {**w.__dict__, "link_trace": ((0.0, 1e-300),)}}
    spec["fields"].pop("fabric")
    frame = saturation(PRIORS, spec, 200, 0).set_index("deployment")
    assert frame.loc["naive heterogeneous", "max_rate_per_s"] == 0.0  # nothing crosses the link
    assert frame["vs_naive"].isna().all()  # against none: missing, not a division by zero
    assert frame.loc["homogeneous", "max_rate_per_s"] > 0


def test_the_same_gpus_deployment_has_both_clusters_count_of_this_clusters_kind():
    """Worked by hand on one length: as many GPUs as both clusters (2 + 1 instances), all
    of this cluster's kind, keep up with 3 / T_local; the others compare against it."""
    from xbench.simulate.prefill import saturation

    w = _one_length()
    c = PrefillCosts(PRIORS, w)
    spec = {"fabrics": ["tcp"], "fields": dict(w.__dict__)}
    spec["fields"].pop("fabric")
    frame = saturation(PRIORS, spec, 2000, 0).set_index("deployment")
    same = frame.loc["homogeneous, same GPUs", "max_rate_per_s"]
    assert 0.96 * 3 / c.local(L) <= same <= 1.03 * 3 / c.local(L)
    for name, row in frame.iterrows():
        assert row.vs_same_gpus == pytest.approx(row.max_rate_per_s / same - 1), name


def test_simulate_compares_the_deployments_at_saturation(xbench):
    r = xbench("simulate", "prefill-as-a-service", "--requests", "1000", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "deployments at saturation" in flat
    for name in (
        "homogeneous",
        "homogeneous, same GPUs",
        "naive heterogeneous",
        "PrfaaS, threshold",
        "PrfaaS, predicate",
    ):
        assert f" {name} " in flat
    assert "ends when its KV is here, no decode shares the GPUs" in flat
    assert "+54 %" in flat and "+32 %" in flat


def test_bursts_keep_the_mean_rate_and_raise_the_dispersion():
    plain = PrefillWorkload(rate_per_s=5.0)
    assert plain.spell_rates() == (5.0, 5.0)
    dispersion = []
    for factor in (1.0, 4.0, 10.0):
        w = PrefillWorkload(rate_per_s=5.0, burst_factor=factor, burst_on_s=1.0, burst_off_s=4.0)
        on, off = w.spell_rates()
        assert on == pytest.approx(factor * off)
        assert (1.0 * on + 4.0 * off) / 5.0 == pytest.approx(5.0)  # time-weighted mean
        trace = make_prefill_trace(w, 100_000, 0)
        assert np.all(np.diff(trace.arrival) > 0)
        assert len(trace) / trace.arrival[-1] == pytest.approx(5.0, rel=0.03)
        counts = np.histogram(trace.arrival, bins=np.arange(0.0, trace.arrival[-1], 1.0))[0]
        dispersion.append(counts.var() / counts.mean())
    # Poisson counts: variance = mean; on and off spells add the spells' variance
    assert dispersion[0] == pytest.approx(1.0, abs=0.05)
    assert 1.5 < dispersion[1] < dispersion[2]
    # without bursts the trace is the Poisson one it always was (unit gaps, scaled)
    rng = np.random.default_rng(0)
    expected = np.cumsum(rng.exponential(1.0 / 5.0, 1000))
    assert np.allclose(make_prefill_trace(plain, 1000, 0).arrival, expected)


def test_a_scenario_names_its_bursts_and_a_bad_one_is_refused(tmp_path):
    from xbench.core.scenario import ScenarioError, load_workload

    head = '[scenario]\nname = "p"\nmodel = "deepseek-v3.2"\n[workload]\nkind = "prefill"\n'
    path = tmp_path / "p.toml"
    path.write_text(head + 'burst_factor = 4.0\nburst_on = "2s"\nburst_off = "500ms"\n')
    fields = load_workload(path)["fields"]
    assert (fields["burst_factor"], fields["burst_on_s"], fields["burst_off_s"]) == (4.0, 2.0, 0.5)
    for bad, words in (
        ('burst_on = "soon"', "burst_on = 'soon' is not a duration"),
        ('burst_off = "0s"', "burst_off = '0s' is not a duration"),
        ("burst_factor = 0.5", "burst_factor = 0.5 is out of range"),
    ):
        path.write_text(head + bad + "\n")
        with pytest.raises(ScenarioError, match=re.escape(words)):
            load_workload(path)


def test_a_link_trace_sets_the_bandwidth_a_transfer_starts_at():
    w = PrefillWorkload(link_trace=((0.0, 1.0), (10.0, 0.5), (20.0, 2.0)))
    assert [w.link_share(t) for t in (0.0, 9.9, 10.0, 15.0, 20.0, 1e9)] == [1, 1, 0.5, 0.5, 2, 2]
    assert PrefillWorkload().link_share(5.0) == 1.0
    plain = _one_length(rate_per_s=1.0)
    trace = make_prefill_trace(plain, 300, 0)
    base = simulate_prefill(PRIORS, plain, trace, "offload")
    half = PrefillWorkload(**{**plain.__dict__, "link_trace": ((0.0, 0.5),)})
    slow = simulate_prefill(PRIORS, half, trace, "offload")
    # every transfer at half the bandwidth: twice the link's busy time, the same bytes
    assert slow.link_busy == pytest.approx(2 * base.link_busy)
    assert slow.bytes_moved == base.bytes_moved
    assert (
        slow.latency >= base.latency - 1e-12
    ).all() and slow.latency.mean() > base.latency.mean()


def test_a_scenario_gives_its_link_trace_and_a_bad_one_is_refused(tmp_path):
    from xbench.core.scenario import ScenarioError, load_workload

    head = '[scenario]\nname = "p"\nmodel = "deepseek-v3.2"\n[workload]\nkind = "prefill"\n'
    path = tmp_path / "p.toml"
    path.write_text(head + "link_trace = [[0, 1.0], [300, 0.25], [600, 1]]\n")
    assert load_workload(path)["fields"]["link_trace"] == ((0, 1), (300, 0.25), (600, 1))
    for bad in ("[[0, 1.0], [0, 0.5]]", "[[0, 0]]", "[[5]]", '[[0, "fast"]]'):
        path.write_text(head + f"link_trace = {bad}\n")
        with pytest.raises(ScenarioError, match=r"link_trace\[\d\] = .* is not \[seconds"):
            load_workload(path)
