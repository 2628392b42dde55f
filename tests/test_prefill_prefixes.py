"""Prefill-as-a-service with shared prefixes: each cluster's prefix cache (LRU by tokens, a
prefix counted from when its KV is there), the prefill of a request's new tokens over its
cached prefix, the KV an offload ships (what this cluster lacks), cache-aware thresholds,
the trace's prefixes, the scenario keys and the printed hit rate."""

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from xbench.core.profile import load_profile
from xbench.simulate.prefill import (
    PrefillCosts,
    PrefillTrace,
    PrefillWorkload,
    PrefixCache,
    make_prefill_trace,
    simulate_prefill,
    sustainable_rate,
)

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

PRIORS = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "h100-priors.toml")
# one instance here, two there; every cache large enough for what the tests put in it
W = PrefillWorkload(
    local_instances=1, remote_instances=2, local_speed=0.25, layers=4, fabric="tcp",
    prefixes=2, local_cache_tokens=1e6, remote_cache_tokens=1e6,
)  # fmt: skip
H, OWN = 8192, 1024  # a prefix's tokens, a request's own


def _trace(*rows):
    """(arrival s, own tokens, prefix or -1) rows; every prefix is H tokens."""
    a, own, p = zip(*rows, strict=True)
    prefix = np.array(p)
    return PrefillTrace(
        np.array(a, float), np.array(own, float), prefix, np.where(prefix >= 0, float(H), 0.0)
    )


def test_a_cached_prefix_is_not_prefilled_again():
    """The second request's prefix is cached here: only its own tokens are prefilled,
    attending the prefix (T_recompute(H + u) - T_recompute(H)); hit rate H of 2 (H + u)."""
    c = PrefillCosts(PRIORS, W)
    d = PRIORS.device
    later = 10 * c.local(H + OWN)
    res = simulate_prefill(PRIORS, W, _trace((0.0, OWN, 0), (later, OWN, 0)), "local")
    assert res.latency[0] == pytest.approx(c.local(H + OWN))
    over_prefix = 4 * (d.recompute(H + OWN) - d.recompute(H)) / (8 * 0.25)
    assert res.latency[1] == pytest.approx(over_prefix) and over_prefix < c.local(H + OWN)
    assert res.latency[1] > c.local(OWN)  # its tokens attend the prefix too
    assert res.hit_tokens == H and res.prompt_tokens == 2 * (H + OWN)


def test_a_prefix_counts_only_once_its_kv_is_there():
    """A request that arrives while its prefix is still being prefilled misses it."""
    c = PrefillCosts(PRIORS, W)
    res = simulate_prefill(PRIORS, W, _trace((0.0, OWN, 0), (1e-3, OWN, 0)), "local")
    assert res.hit_tokens == 0
    assert res.latency[1] == pytest.approx(2 * c.local(H + OWN) - 1e-3)  # FIFO behind it


def test_an_offload_ships_only_the_kv_this_cluster_lacks():
    """The first offload prefills the whole prompt there and ships all of its KV; its
    prefix is then cached in both clusters, so the next offloads prefill their own tokens
    there over it and ship only their KV."""
    c = PrefillCosts(PRIORS, W)
    gap = 10 * c.local(H + OWN)
    trace = _trace((0.0, OWN, 0), (gap, OWN, 0), (2 * gap, OWN, 0))
    res = simulate_prefill(PRIORS, W, trace, "threshold", threshold=0)
    assert res.offloaded.tolist() == [True, True, True]
    # the first ships the whole prompt; its prefix then lands here and is cached there
    assert res.bytes_moved == pytest.approx(((H + OWN) + 2 * OWN) * c.kv_per_token)
    assert sorted(res.remote_busy) == pytest.approx(
        sorted([c.prefill(H + OWN) + c.prefill(OWN, 1.0, H), c.prefill(OWN, 1.0, H)])
    )
    assert res.hit_tokens == 2 * H


def test_the_caches_keep_the_most_recently_used_prefixes_up_to_their_tokens():
    cache = PrefixCache(2 * H + 10)
    for p in (0, 1, 0, 2):  # 0 used again, so 1 is the least recently used when 2 comes
        cache.put(p, H, 0.0)
    assert [cache.cached(p, 1.0) for p in (0, 1, 2)] == [H, 0.0, H]
    cache.put(3, 3 * H, 0.0)  # larger than the cache: not kept, nothing evicted
    assert cache.held == 2 * H and cache.cached(3, 1.0) == 0.0
    cache.put(0, H, 5.0)  # used again later: keeps the time its KV was first there
    assert cache.cached(0, 1.0) == H
    small = PrefillWorkload(**{**W.__dict__, "local_cache_tokens": 1.5 * H})
    c = PrefillCosts(PRIORS, small)
    gap = 10 * c.local(H + OWN)
    alternate = _trace(*[(i * gap, OWN, i % 2) for i in range(6)])
    assert simulate_prefill(PRIORS, small, alternate, "local").hit_tokens == 0  # 1 evicts 0
    assert simulate_prefill(PRIORS, W, alternate, "local").hit_tokens == 4 * H


def test_a_threshold_keeps_a_request_whose_prefix_is_cached_here():
    """Cache-aware placement: the threshold reads the tokens uncached here, so the same
    prompt is offloaded while its prefix is not cached here and kept once it is."""
    c = PrefillCosts(PRIORS, W)
    gap = 10 * c.local(H + OWN)
    res = simulate_prefill(
        PRIORS, W, _trace((0.0, OWN, 0), (gap, OWN, 1), (2 * gap, OWN, 0)), "threshold", 4096
    )
    assert res.offloaded.tolist() == [True, True, False]  # 0 landed here with its KV


def test_the_trace_draws_prefixes_beside_the_same_arrivals_and_lengths():
    plain = PrefillWorkload(rate_per_s=5.0)
    shared = PrefillWorkload(rate_per_s=5.0, prefixes=50, prefix_share=0.6, prefix_sigma=0.5)
    a, b = make_prefill_trace(plain, 4000, 3), make_prefill_trace(shared, 4000, 3)
    assert a.prefix is None and np.array_equal(a.arrival, b.arrival)
    assert np.array_equal(a.length, b.length)
    assert 0.57 < (b.prefix >= 0).mean() < 0.63
    assert (b.prefix_tokens[b.prefix < 0] == 0).all()
    counts = np.bincount(b.prefix[b.prefix >= 0], minlength=50)
    assert counts[0] == counts.max() and counts[0] > 5 * counts[-10:].mean()  # Zipf
    for p in np.unique(b.prefix[b.prefix >= 0]):  # one length per prefix
        assert len(np.unique(b.prefix_tokens[b.prefix == p])) == 1
    assert np.array_equal(b.prompts(), b.length + b.prefix_tokens)


def test_with_one_prefix_always_cached_here_the_capacity_is_the_new_tokens_prefill():
    """Every request starts with the same prefix, cached here after the first: this cluster
    alone keeps up with its instances over one prefill of the new tokens over the prefix
    (within the -4..+3 % the plain capacities land in)."""
    one = PrefillWorkload(
        local_instances=2, remote_instances=1, local_speed=0.3, length_median=2048,
        length_sigma=0.0, fabric="tcp", prefixes=1, prefix_median=H, prefix_sigma=0.0,
        local_cache_tokens=H,
    )  # fmt: skip
    c = PrefillCosts(PRIORS, one)
    capacity = one.local_instances / c.local(2048, H)
    found = sustainable_rate(PRIORS, one, "local", 2000, 0)
    assert 0.96 * capacity <= found <= 1.03 * capacity, (found, capacity)


def test_a_scenario_gives_its_prefixes_and_a_bad_one_is_refused(tmp_path):
    from xbench.core.scenario import ScenarioError, load_workload

    head = '[scenario]\nname = "p"\nmodel = "deepseek-v3.2"\n[workload]\nkind = "prefill"\n'
    path = tmp_path / "p.toml"
    path.write_text(head + "prefixes = 20\nprefix_share = 0.5\nlocal_cache_tokens = 100000\n")
    fields = load_workload(path)["fields"]
    assert (fields["prefixes"], fields["prefix_share"], fields["local_cache_tokens"]) == (
        20, 0.5, 100000,
    )  # fmt: skip
    for bad, words in (
        ("local_cache_tokens = 10", "gives local_cache_tokens without prefixes"),
        ("prefixes = 3\nprefix_share = 1.5", "prefix_share = 1.5 is out of range"),
        ("prefixes = -1", "prefixes = -1 is out of range"),
    ):
        path.write_text(head + bad + "\n")
        with pytest.raises(ScenarioError, match=re.escape(words)):
            load_workload(path)


def test_simulate_prints_and_writes_the_hit_rate(xbench, tmp_path):
    src = Path(__file__).resolve().parents[1] / "scenarios" / "prefill-as-a-service.toml"
    shared = tmp_path / "shared.toml"
    shared.write_text(
        src.read_text().replace(
            "[workload]",
            "[workload]\nprefixes = 100\nprefix_share = 0.7\nlocal_cache_tokens = 1000000\n"
            "remote_cache_tokens = 1000000",
            1,
        )
    )
    out = tmp_path / "p.parquet"
    r = xbench("simulate", shared, "--requests", "400", "--out", out, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "hit: prompt tokens found in the prefix cache" in " ".join(r.stdout.split())
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    frame = pq.read_table(out).to_pandas()
    assert ((frame.hit_rate > 0) & (frame.hit_rate < 1)).all()
    tables = json.loads(xbench("simulate", src, "--requests", "200", "--format", "json").stdout)
    rows = tables["simulation"]
    assert {row["hit_rate"] for row in rows} == {0.0}
