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
    r = xbench("simulate", "prefill-as-a-service", env={"COLUMNS": "200"})
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
    assert "its output tokens are decoded, decode at full batch" in flat
    assert "+54 %" in flat and "+32 %" in flat
    # the README quotes PrfaaS's threshold against the same GPUs and the naive deployment
    row = re.search(r" PrfaaS, threshold +\S+ +\d+/\d+ +(\d+\.\d\d) +\S+ / (\S+) / (\S+) ", flat)
    rate, same, naive = row.groups()
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    quoted = f"keeps up with {rate} requests/s, {same[:-1]} % over as many GPUs of this cluster's"
    assert quoted in readme and f"and {naive[:-1]} % over the naive deployment" in readme
    assert " P/D " in flat and re.search(
        r"decode \(tcp\): one instance of this cluster batches \d+", flat
    )


def test_a_decode_that_fits_no_request_writes_its_rates_as_missing_comparisons(tmp_path, xbench):
    """With 8 x 80 GB, DeepSeek-V3.2's weights leave no room for a request's KV: every
    deployment keeps up with nothing, its comparisons are missing, and --out writes them."""
    shipped = Path(__file__).resolve().parents[1] / "scenarios" / "prefill-as-a-service.toml"
    path = tmp_path / "full.toml"
    path.write_text(shipped.read_text().replace("local_hbm_gb = 96", "local_hbm_gb = 80"))
    out = tmp_path / "runs" / "p.parquet"
    r = xbench("simulate", str(path), "--requests", "200", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "no request fits beside the weights" in " ".join(r.stdout.split())
    from xbench.results import schema
    from xbench.results.store import read_table

    frame = read_table([out.with_name("p.saturation.parquet")], schema.PREFILL_SATURATION)
    assert (frame.max_rate_per_s == 0).all() and frame.vs_naive.isna().all()
    assert (frame.output_tokens == 1024).all() and (frame.decode_batch == 0).all()


def test_decode_needs_the_models_parameters_and_the_profiles_memory(tmp_path, xbench):
    from xbench.core.scenario import ScenarioError, load_workload

    head = '[scenario]\nname = "p"\nmodel = "{}"\n[workload]\nkind = "prefill"\n'
    path = tmp_path / "p.toml"
    path.write_text(head.format("glm-5") + "output_tokens = 256\n")
    with pytest.raises(ScenarioError, match="model glm-5 publishes no parameter counts"):
        load_workload(path)
    path.write_text(head.format("deepseek-v3.2") + "output_tokens = 256\nlocal_instances = 1\n")
    with pytest.raises(ScenarioError, match="one instance cannot both prefill and decode"):
        load_workload(path)
    path.write_text(head.format("glm-5") + "output_tokens = 0\n")  # prefill only: fine
    assert load_workload(path)["fields"]["output_tokens"] == 0
    path.write_text(head.format("deepseek-v3.2") + "output_tokens = 256\n")
    fields = load_workload(path)["fields"]
    assert (fields["decode_rows"], fields["attended_tokens"]) == (128, 2048.0)
    assert (fields["weight_bytes"], fields["matmul_dtype"]) == (1.0, "fp8")
    # a profile without [ceilings] has no memory rate to read the weights at
    bare = tmp_path / "bare.toml"
    priors = (Path(__file__).resolve().parents[1] / "profiles" / "h100-priors.toml").read_text()
    start = priors.index("\n[ceilings]") + 1
    bare.write_text(priors[:start] + priors[priors.index("\n[[fabric]]", start) :])
    r = xbench("simulate", str(path), "--profile", str(bare), "--requests", "50")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "no [ceilings] memory rate and GPU memory (hbm), which" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


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


# Decode on this cluster (DeepSeek-V3.2's shape: 128 query rows, DSA's 2,048-token top-k,
# 37e9 of 671e9 parameters active, FP8 weights) on H20-like GPUs: 96 GB each
DECODE = dict(
    decode_rows=128,
    attended_tokens=2048.0,
    active_params=37e9,
    total_params=671e9,
    weight_bytes=1.0,
    matmul_dtype="fp8",
    local_hbm_gb=96.0,
    local_memory_speed=1.2,
)


def _decode_by_hand(w: PrefillWorkload, prompts=(L,)) -> float:
    """Requests a second one decode instance finishes at full batch, worked from the
    profile's terms: each request holds its prompt and (out - 1) / 2 tokens on average and
    attends them (at most the top-k), as many fit beside the weights as the memory holds;
    a step reads every weight it uses once or runs their FLOPs, whichever is longer, over
    the 8 GPUs, and each GPU attends its share of the batch (the busiest ceil(B / 8)) in
    one call a layer."""
    d, ceilings, out = PRIORS.device, PRIORS.ceilings, w.output_tokens
    held = [p + (out - 1) / 2 for p in prompts]
    mean_held = sum(held) / len(held)
    free = 8 * 96e9 - 671e9 * 1.0
    batch = min(w.decode_batch, int(free // (mean_held * w.kv_bytes_per_token * w.layers)))
    attended = sum(min(h, 2048) for h in held) / len(held)
    read = min(671e9, batch * 37e9) / (ceilings.memory * 1.2)
    run = 2 * 37e9 * batch / (ceilings.matmul_fp8 * w.local_speed)
    per_request = (
        attended * d.compute_per_token.value / 1.2
        + attended * 128 * d.compute_per_row_token.value / w.local_speed
    )
    busiest = -(-batch // 8)
    step = max(read, run) / 8 + w.layers * (d.compute_t0.value + busiest * per_request)
    return batch / (out * step)


def test_a_decode_step_is_its_weights_read_and_each_requests_attention():
    w = _one_length(output_tokens=4096, **DECODE)
    decode = PrefillCosts(PRIORS, w).decode(np.full(5, float(L)))
    assert decode["batch_bound"] == "memory" and decode["batch"] < w.decode_batch
    assert decode["per_instance_per_s"] == pytest.approx(_decode_by_hand(w))
    assert decode["step_s"] == pytest.approx(decode["linear_s"] + decode["attention_s"])
    # a batch of one: only the active weights are read, and nothing fits where the weights
    # fill the GPUs
    one = PrefillCosts(PRIORS, _one_length(output_tokens=4096, decode_batch=1, **DECODE))
    single = one.decode(np.full(5, float(L)))
    assert single["batch"] == 1 and single["batch_bound"] == "decode_batch"
    assert single["linear_s"] == pytest.approx(37e9 / (PRIORS.ceilings.memory * 1.2) / 8)
    full = PrefillCosts(PRIORS, _one_length(output_tokens=4096, **{**DECODE, "local_hbm_gb": 80}))
    assert full.decode(np.full(5, float(L)))["per_instance_per_s"] == 0.0
    assert PrefillCosts(PRIORS, _one_length()).decode(np.full(5, float(L))) is None
    # prompts of two lengths: each request attends at most the top-k, averaged after the cap
    mixed = _one_length(output_tokens=64, **DECODE)
    decode = PrefillCosts(PRIORS, mixed).decode(np.array([1000.0, 9000.0]))
    assert decode["per_instance_per_s"] == pytest.approx(_decode_by_hand(mixed, (1000, 9000)))
    # compute this slow, the linear layers run their FLOPs longer than they read weights
    slow = _one_length(output_tokens=4096, **{**DECODE, "local_speed": 0.001})
    slow_decode = PrefillCosts(PRIORS, slow).decode(np.full(5, float(L)))
    flops = 2 * 37e9 * slow_decode["batch"] / (PRIORS.ceilings.matmul_fp8 * 0.001)
    assert slow_decode["linear_s"] == pytest.approx(flops / 8)
    assert slow_decode["per_instance_per_s"] == pytest.approx(_decode_by_hand(slow))


def test_prefill_and_decode_at_saturation_worked_by_hand():
    """One length, 4 instances here and 1 there: each split of this cluster's instances
    keeps up with the lesser of its prefill's capacity (p / T_local) and its decode's (d
    instances at full batch); each deployment runs its best split. Worked by hand: this
    cluster alone is prefill-bound at 2 / 2, as many GPUs of its kind decode-bound at 3 / 2,
    and the naive deployment decodes on all 4."""
    from xbench.simulate.prefill import saturation

    w = _one_length(local_instances=4, remote_instances=1, output_tokens=4096, **DECODE)
    c = PrefillCosts(PRIORS, w)
    per_decode, prefill = _decode_by_hand(w), 1 / c.local(L)
    spec = {"fabrics": ["tcp"], "fields": dict(w.__dict__)}
    spec["fields"].pop("fabric")
    frame = saturation(PRIORS, spec, 2000, 0).set_index("deployment")

    def best(instances):
        splits = [(p, instances - p) for p in range(1, instances)]
        return max(splits, key=lambda s: min(s[0] * prefill, s[1] * per_decode))

    expected = {
        "homogeneous": best(4),
        "homogeneous, same GPUs": best(5),
        "naive heterogeneous": (0, 4),
    }
    assert expected["homogeneous"] == (2, 2) and expected["homogeneous, same GPUs"] == (3, 2)
    there = min(1 / c.prefill(L), 1 / c.transfer(L))  # the remote instance or the link
    for name, (p, d) in expected.items():
        row = frame.loc[name]
        assert (row.prefill_instances, row.decode_instances) == (p, d), name
        assert row.decode_rate_per_s == pytest.approx(d * per_decode)
        capacity = min(p * prefill if p else there, d * per_decode)
        assert 0.96 * capacity <= row.max_rate_per_s <= 1.03 * capacity, (name, capacity)
    # PrfaaS may prefill nothing here, as the naive deployment: never below it
    for name in ("PrfaaS, threshold", "PrfaaS, predicate"):
        assert (
            frame.loc[name, "max_rate_per_s"] >= frame.loc["naive heterogeneous", "max_rate_per_s"]
        )
    # decode bounds the same GPUs' best split: its rate is the decode's exactly
    assert frame.loc["homogeneous, same GPUs", "max_rate_per_s"] == pytest.approx(2 * per_decode)
    assert frame["decode_per_instance_per_s"].iloc[0] == pytest.approx(per_decode)


def test_a_hybrid_models_kv_and_prefill_flops_worked_by_hand():
    """MiMo-V2-Flash: 9 of 48 layers attend the whole context (4 KV heads of 192 + 128),
    39 a 128-token window (8 KV heads); its prefill priced from DeepSeek-V3.2's terms FLOP
    for FLOP."""
    from xbench.core.models import get_model
    from xbench.core.parts import PrefillScale, prefill_terms, prefill_time

    mimo, ds = get_model("mimo-v2-flash"), get_model("deepseek-v3.2")
    assert (mimo.layers, mimo.full_layers, mimo.window_tokens) == (48, 9, 128)
    assert (ds.full_layers, ds.window_tokens) == (61, 0)  # every layer full
    scale = PrefillScale.of(ds, mimo)
    assert scale.matmul == pytest.approx((2 * 15e9 / 48) / (2 * 37e9 / 61))
    assert scale.attention == pytest.approx((9 / 48) * 64 * 320 / (128 * 320))
    assert scale.window == pytest.approx(128 * (39 / 48) * 2 * 64 * 320 / (128 * 320))
    assert tuple(PrefillScale.of(ds, ds)) == (1.0, 1.0, 0.0)
    d = PRIORS.device
    p1, p2 = d.recompute_per_token.value, d.recompute_per_token2.value
    t0 = d.recompute_t0.value if d.recompute_t0 else 0.0
    u, h = 4096, 1024  # new tokens after cached ones
    by_hand = (
        t0,
        u * p1 * scale.matmul,
        (u * (u + 2 * h) * p2) * scale.attention + u * scale.window * p2,
    )
    terms = prefill_terms(d, u, h, layers=48, gpus=8, speed=0.5, scale=scale)
    assert terms == pytest.approx(tuple(x * 48 / (8 * 0.5) for x in by_hand))
    assert prefill_time(d, u, h, 48, 8, 0.5, scale) == pytest.approx(sum(terms))
    assert prefill_time(d, u, h, 61, 8, 1.0, PrefillScale()) == pytest.approx(
        prefill_time(d, u, h, 61, 8, 1.0)
    )


def _scenario(tmp_path, extra: str, request: str = "") -> Path:
    path = tmp_path / "served.toml"
    path.write_text(
        '[scenario]\nname = "served"\nmodel = "deepseek-v3.2"\n' + request + "[workload]\n"
        'kind = "prefill"\nremote_instances = 1\nlocal_instances = 2\nlocal_speed = 0.3\n'
        'rate = "1/s"\nfabric = "tcp"\n' + extra
    )
    return path


def test_a_served_model_is_priced_from_the_scenario_models_terms(tmp_path, xbench):
    from xbench.core.models import get_model
    from xbench.core.parts import PrefillScale
    from xbench.core.scenario import load_workload
    from xbench.errors import XbenchError

    same = load_workload(_scenario(tmp_path, 'served_model = "deepseek-v3.2"\n'))["fields"]
    plain = load_workload(_scenario(tmp_path, ""))["fields"]
    a, b = (PrefillWorkload(**f, fabric="tcp") for f in (same, plain))
    trace = make_prefill_trace(b, 300, 0)
    for policy in ("local", "offload", "predicate"):  # serving the same model: the same run
        x, y = (simulate_prefill(PRIORS, w, trace, policy) for w in (a, b))
        assert x.latency == pytest.approx(y.latency) and x.bytes_moved == pytest.approx(
            y.bytes_moved
        )
    mimo = load_workload(_scenario(tmp_path, 'served_model = "mimo-v2-flash"\n'))["fields"]
    w = PrefillWorkload(**mimo, fabric="tcp")
    c = PrefillCosts(PRIORS, w)
    assert (w.layers, c.kv_per_token / w.kv_bytes_per_token, c.window_tokens) == (48, 9, 128)
    # bytes a token: K (192) and V (128) of each KV head, in bf16, over 9 full layers and
    # 39 windowed ones, which keep the last 128 tokens
    full, windowed = 9 * 4 * (192 + 128) * 2, 39 * 8 * (192 + 128) * 2
    assert c.kv_bytes(32768) == 32768 * full + 128 * windowed
    assert c.kv_bytes(100) == 100 * (full + windowed)
    # both FP8 models: the matmuls' FLOP ratio stands; a BF16 model's run at half the rate
    assert (
        c.scale.matmul
        == PrefillScale.of(get_model("deepseek-v3.2"), get_model("mimo-v2-flash")).matmul
    )
    llama = load_workload(_scenario(tmp_path, 'served_model = "llama-3.1-8b"\n'))["fields"]
    bf16 = PrefillCosts(PRIORS, PrefillWorkload(**llama, fabric="tcp")).scale
    ratio = PRIORS.ceilings.matmul_fp8 / PRIORS.ceilings.matmul
    base = PrefillScale.of(get_model("deepseek-v3.2"), get_model("llama-3.1-8b"))
    assert bf16.matmul == pytest.approx(base.matmul * ratio)
    # the scenario's own model with its KV given in [request]: the same KV as without
    own = '[request]\nkv_bytes = "656B"\n'
    same_kv = load_workload(_scenario(tmp_path, 'served_model = "deepseek-v3.2"\n', own))
    plain_kv = load_workload(_scenario(tmp_path, "", own))
    assert (
        same_kv["fields"]["kv_bytes_per_token"] == plain_kv["fields"]["kv_bytes_per_token"] == 656
    )
    # the CLI sets the model's KV rate beside the study's, and the prefill time each implies
    r = xbench("simulate", str(_scenario(tmp_path, 'served_model = "mimo-v2-flash"\n')),
               "--requests", "200", env={"COLUMNS": "200"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    implied = 8 * c.kv_bytes(32768) / 4.66e9
    ratio = implied / c.prefill(32768)
    assert "the study measured mimo-v2-flash at 4.66 Gb/s at 32K on 8 H200" in flat
    assert f"(x{ratio:.1f})" in flat
    for bad, words in (
        ('served_model = "glm-5"', "glm-5 publishes no active parameters"),
        ('served_model = "mimo-v2-flash"\noutput_tokens = 64', "decode prices the profile's"),
        ('served_model = "nope"', "served_model: unknown model 'nope'"),
    ):
        with pytest.raises(XbenchError, match=re.escape(words)):
            load_workload(_scenario(tmp_path, bad + "\n"))
        r = xbench("simulate", str(_scenario(tmp_path, bad + "\n")), "--requests", "50")
        assert r.returncode == 2 and "Traceback" not in r.stderr and words in r.stderr
