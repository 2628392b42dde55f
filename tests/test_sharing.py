"""Shared-KV batching (MoSKA) on the cost model's device terms (core.sharing), its report in
xbench simulate, and the GQA preset it prices."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from xbench.core.models import get_model
from xbench.core.profile import load_profile
from xbench.core.scenario import load_workload
from xbench.core.sharing import (
    Attention,
    batched_against_separate,
    chunks_read,
    on_gpus,
    ridge_batch,
    step,
)
from xbench.errors import XbenchError

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

ROOT = Path(__file__).resolve().parents[1]
PRIORS = load_profile(ROOT / "profiles" / "h100-priors.toml")
DS = get_model("deepseek-v3.2")
LLAMA = get_model("llama-3.1-8b")


def test_the_gqa_preset_holds_llama_3_1_8b():
    assert (LLAMA.q_heads, LLAMA.kv_heads, LLAMA.layers, LLAMA.attention) == (32, 8, 32, "GQA")
    # a token's K and V in 8 heads of 128: 2,048 B in FP8, 4,096 in BF16; a query head's row
    # spends 2 x (128 + 128) FLOP a token, absorbed MLA's 2 x (576 + 512)
    assert LLAMA.kv_bytes_per_token("fp8") == 2048 and LLAMA.kv_bytes_per_token("bf16") == 4096
    assert LLAMA.flops_per_row_token() == 512 and DS.flops_per_row_token() == 2176
    assert DS.attention == "MLA" and DS.kv_heads == 1


@pytest.mark.parametrize("heads", [16, 32])
def test_the_batched_gain_is_the_kernel_terms_ratio_at_each_b(heads):
    """Same model as the terms: one call of B x heads rows against B calls of heads rows,
    exactly B T_c(heads, c) / T_c(B heads, c) from the device's own T_c."""
    att = Attention(PRIORS.device, heads)
    c = 65536
    for row in batched_against_separate(att, c, [1, 3, 16, 100, 1024]):
        b = row["batch"]
        expected = b * PRIORS.device.compute(heads, c) / PRIORS.device.compute(b * heads, c)
        assert row["gain"] == pytest.approx(expected, rel=1e-12)
        assert row["batched_s"] == pytest.approx(PRIORS.device.compute(b * heads, c))


def test_scaling_to_a_preset_scales_the_token_term_by_bytes_and_the_row_term_by_flops():
    att = Attention.for_preset(PRIORS.device, 32, LLAMA, "fp8", 1152, DS.flops_per_row_token())
    d, c = PRIORS.device, 4096
    t0 = d.compute(0, 0)
    memory = (d.compute(0, c) - t0) * 2048 / 1152
    flops = (d.compute(32, c) - d.compute(0, c)) * 512 / 2176
    assert att.call(32, c) == pytest.approx(t0 + memory + flops, rel=1e-12)
    # the knee: where one query's row term equals the call's token term
    assert att.knee(c) == pytest.approx(memory / flops, rel=1e-12)
    # the hardware's ridge in queries: matmul rate / bandwidth over one query's FLOP a byte
    ceilings = PRIORS.ceilings
    # (an FP8 KV attended on FP8 tensor cores: the FP8 rate)
    assert ridge_batch(ceilings, LLAMA, "fp8", 32) == pytest.approx(
        ceilings.matmul_fp8 / ceilings.memory / (32 * 512 / 2048)
    )
    assert ridge_batch(ceilings, LLAMA, "bf16", 32) == pytest.approx(
        ceilings.matmul / ceilings.memory / (32 * 512 / 4096)
    )
    assert ridge_batch(None, LLAMA, "fp8", 32) is None


@pytest.mark.parametrize(
    ("kv_format", "kv_bytes", "rate"), [("fp8", 2048, 989 / 1979), ("bf16", 4096, 1.0)]
)
def test_the_batching_gain_at_each_b_is_the_kernel_terms_ratio_at_the_dtypes_rate(
    kv_format, kv_bytes, rate
):
    """B calls over a chunk against one batched call, from the device terms by hand: the
    token term scaled by the KV's bytes, the row term by the FLOPs a row-token and by the
    matmul rate of the KV's dtype over the BF16 one the terms were fitted at."""
    att = Attention.for_preset(
        PRIORS.device, 32, LLAMA, kv_format, 1152, DS.flops_per_row_token(), PRIORS.ceilings
    )
    assert att.rate_ratio == pytest.approx(rate)
    d, c = PRIORS.device, 65536
    t0 = d.compute(0, 0)
    memory = (d.compute(0, c) - t0) * kv_bytes / 1152

    def call(rows):
        return t0 + memory + (d.compute(rows, c) - d.compute(0, c)) * 512 / 2176 * rate

    for row in batched_against_separate(att, c, [1, 4, 64, 1024]):
        b = row["batch"]
        assert row["gain"] == pytest.approx(b * call(32) / call(b * 32), rel=1e-12)


def test_a_router_reads_the_chunks_any_query_chose():
    assert chunks_read(16, 1.0, 5) == 16  # dense: every chunk
    assert chunks_read(16, 0.25, 1) == pytest.approx(4)  # one query: its own
    assert chunks_read(16, 0.25, 256) == pytest.approx(16)  # many: nearly all
    assert chunks_read(16, 0.25, 2) == pytest.approx(16 * (1 - 0.75**2))


def test_a_step_adds_its_parts_and_its_gain_stays_under_the_bound():
    att = Attention.for_preset(PRIORS.device, 32, LLAMA, "fp8", 1152, DS.flops_per_row_token())
    gains = []
    for shared in (2**20, 2**22, 2**24):
        r = step(
            att,
            PRIORS.device.merge,
            batch=256,
            shared=shared,
            unique=65536,
            chunk=65536,
            keep=0.25,
            layers=32,
        )
        assert r["step_s"] == pytest.approx(r["shared_s"] + r["unique_s"] + r["merge_s"])
        assert r["separate_step_s"] == pytest.approx(32 * 256 * att.call(32, shared + 65536))
        assert r["throughput_per_s"] == pytest.approx(256 / r["step_s"])
        one = att.call(32, 65536)
        bound = one / (one - att.call(0, 65536)) / 0.25
        assert r["separate_step_s"] / (r["shared_s"] + r["merge_s"]) < bound
        gains.append(r["gain"])
    assert gains[0] < gains[1] < gains[2]  # the more context is shared, the more it saves


def test_a_step_on_gpus_holds_each_setups_kv_and_counts_every_gpu():
    """Worked by hand: GPUs of 100 GB holding 10 GB of weights; Llama's FP8 KV is 64 KiB a
    token over its 32 layers; 4 requests, 1M shared tokens, 64K unique each."""
    att = Attention.for_preset(
        PRIORS.device, 32, LLAMA, "fp8", 1152, DS.flops_per_row_token(), PRIORS.ceilings
    )
    row = step(
        att, PRIORS.device.merge, batch=4, shared=2**20, unique=2**16, chunk=2**16, layers=32
    )
    placed = on_gpus(att, row, LLAMA, "fp8", chunk=2**16, hbm=100e9, weights=10e9)
    assert placed["kv_bytes_per_token"] == 2048 * 32
    # MoSKA: 2^36 B shared + 4 x 2^32 B unique = 85.9 GB: one GPU of 90 GB free, busy the
    # whole step; copies: 73.0 GB each, one a GPU: 4 GPUs, each busy all the time
    assert (placed["moska_gpus"], placed["copies_gpus"], placed["apart_gpus"]) == (1, 4, 2)
    assert placed["gpus_per_copy"] == 1
    assert placed["moska_hbm_share"] == pytest.approx((2**36 + 2**34 + 10e9) / 100e9)
    assert placed["copies_hbm_share"] == pytest.approx(((2**20 + 2**16) * 2**16 + 10e9) / 100e9)
    assert placed["moska_utilisation"] == pytest.approx(1.0)
    assert placed["copies_utilisation"] == pytest.approx(1.0)
    assert placed["moska_per_gpu_per_s"] == pytest.approx(4 / row["step_s"])
    # every GPU busy: the gain per GPU is the device time's
    assert placed["moska_gain_per_gpu"] == pytest.approx(row["gain"])
    # apart: two GPUs, each waiting for the other's part: less than the step's gain
    wall = max(row["shared_s"] + row["merge_s"], row["unique_s"])
    assert placed["apart_utilisation"] == pytest.approx(row["step_s"] / (2 * wall))
    assert placed["apart_gain_per_gpu"] < row["gain"]
    # a copy larger than a GPU's free memory spreads over several, a GPU each part
    big = step(
        att, PRIORS.device.merge, batch=4, shared=2**22, unique=2**16, chunk=2**16, layers=32
    )
    spread = on_gpus(att, big, LLAMA, "fp8", chunk=2**16, hbm=100e9, weights=10e9)
    assert spread["gpus_per_copy"] == 4 and spread["copies_gpus"] == 16  # 279 GB a copy
    with pytest.raises(ValueError, match="the weights"):
        on_gpus(att, row, LLAMA, "fp8", chunk=2**16, hbm=10e9, weights=10e9)


def test_simulate_prints_the_sharing_report_against_the_papers_figure(xbench):
    r = xbench("simulate", "moska-shared-chunk", "--requests", "2000", env={"COLUMNS": "220"})
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())  # (titles and captions wrap)
    assert "shared-KV batching (llama-3.1-8b, fp8 KV, 32 query heads)" in flat
    assert re.search(r"knee: B = \d+\.\d", flat) and "ridge point: B = " in flat
    # the smallest and largest shared contexts, a row each, read whole at 80 columns
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if re.match(r" +\d+M ", line)}
    assert {"1M", "16M"} <= set(rows), r.stdout
    narrow = xbench("simulate", "moska-shared-chunk", "--requests", "500", env={"COLUMNS": "80"})
    tail = narrow.stdout[narrow.stdout.index("shared-KV batching") :]
    assert "…" not in tail and max(map(len, tail.splitlines())) <= 80, tail
    assert re.search(r"against MoSKA's x538\.7: per GPU the step gains x\d+\.\d-x\d+\.\d", flat)
    assert re.search(r"at most x\d+\.\d, each request's unique KV", flat), flat
    assert "16 GPUs of 80 GB a copy" in flat, flat
    # the README quotes the gains per GPU
    low, high = re.search(r"per GPU the step gains x(\d+\.\d)-x(\d+\.\d)", flat).groups()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"per GPU a step gains x{low} with 1M shared tokens to x{high} with 16M" in readme


def test_a_model_whose_weights_fill_a_gpu_is_not_placed_and_says_why(xbench, tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        '[scenario]\nname = "m"\nmodel = "deepseek-v3.2"\n[workload]\ninstances = 2\n'
        'chunks = 2\nchunk_tokens = 1024\nrate = "100/s"\nfabric = "ib"\n'
        'sharing = { model = "deepseek-v3.2", kv_format = "fp8", shared_tokens = [65536] }\n'
    )
    r = xbench("simulate", path, "--requests", "200", env={"COLUMNS": "200"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    flat = " ".join(r.stdout.split())
    assert "the step is not placed on GPUs: deepseek-v3.2's weights fill a GPU" in flat


def _scenario(tmp_path, body: str, model: str = "deepseek-v3.2") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(
        f'[scenario]\nname = "s"\nmodel = "{model}"\n[workload]\nchunks = 4\n' + body + "\n"
    )
    return path


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("sharing = { keep = 2.0 }", "[workload] sharing keep = 2.0 is more than every chunk"),
        ("sharing = { keep = 0 }", "[workload] sharing keep = 0 is out of range"),
        ("sharing = { batches = [0, 2] }", "[workload] sharing batches = [0, 2] is not a list"),
        ("sharing = { colour = 1 }", "unknown [workload] sharing field 'colour'"),
        ('sharing = { kv_format = "fp4" }', "llama-3.1-8b has no KV format 'fp4'"),
        ('sharing = { model = "gpt-9" }', "unknown model 'gpt-9'"),
        (
            'sharing = { model = "mimo-v2-flash", kv_format = "bf16" }',
            "model mimo-v2-flash is a hybrid (9 of its 48 layers attend the whole context)",
        ),
    ],
)
def test_a_bad_sharing_table_is_named(tmp_path, body, words):
    with pytest.raises(Exception, match=re.escape(words)):
        load_workload(_scenario(tmp_path, body))


def test_the_sharing_table_fills_the_papers_setup(tmp_path):
    cfg = load_workload(_scenario(tmp_path, "sharing = {}"))["sharing"]
    assert cfg["model"] == "llama-3.1-8b" and cfg["kv_format"] == "fp8" and cfg["heads"] == 32
    assert cfg["unique_tokens"] == 65536 and cfg["keep"] == 0.25
    assert cfg["shared_tokens"][0] == 2**20 and cfg["shared_tokens"][-1] == 2**24


def test_mla_kernels_and_terms_refuse_a_gqa_preset(xbench, tmp_path):
    with pytest.raises(XbenchError, match="llama-3.1-8b is GQA"):
        load_workload(_scenario(tmp_path, "", model="llama-3.1-8b"))
    for args in (("kernel", "--model", "llama-3.1-8b"), ("decide", "--model", "llama-3.1-8b")):
        r = xbench(*args, "--out", tmp_path / "never")
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "is GQA (8 KV heads)" in r.stderr and "MLA" in r.stderr
        assert not (tmp_path / "never").exists()


# ---- MoSKA's decode step in the event simulator: top-k routing, the unique KV here ----

TOPK = dict(instances=4, chunks=16, chunk_tokens=8192, topk=4, unique_tokens=16384, zipf=0.0)


def test_a_topk_trace_draws_distinct_chunks_a_request_after_its_unique_kv():
    from xbench.simulate import Workload, make_trace
    from xbench.simulate.engine import OWN

    w = Workload(**TOPK, rate_per_s=1e4)
    trace = make_trace(w, 3000, seed=5)
    per = w.topk + 1
    assert len(trace) == 3000 * per and w.uses_per_request() == per
    assert w.shared_uses_per_s == pytest.approx(1e4 * w.topk)
    chunk = trace.chunk.reshape(3000, per)
    assert (chunk[:, 0] == OWN).all()  # the unique KV first, at its requester
    chosen = chunk[:, 1:]
    assert all(len(set(row)) == w.topk for row in chosen.tolist())  # distinct chunks
    holder = trace.holder.reshape(3000, per)
    requester = trace.requester.reshape(3000, per)
    assert (holder[:, 0] == requester[:, 0]).all() and (holder[:, 1:] == chosen % 4).all()
    for column in (trace.arrival, trace.requester, trace.request):  # one request's uses together
        assert (column.reshape(3000, per) == column.reshape(3000, per)[:, :1]).all()
    # a uniform router: each chunk chosen by topk / chunks of the requests (4 sd)
    counts = np.bincount(chosen.ravel(), minlength=16)
    p = w.topk / w.chunks
    assert np.abs(counts - 3000 * p).max() < 4 * math.sqrt(3000 * p * (1 - p))
    # a skewed router keeps the popular chunks more often, still k distinct ones
    skew = make_trace(Workload(**{**TOPK, "zipf": 1.5}, rate_per_s=1e4), 3000, seed=5)
    counts = np.sort(np.bincount(skew.chunk[skew.chunk >= 0], minlength=16))
    assert counts[-1] > 2 * counts[0]
    with pytest.raises(ValueError, match="topk = 17: between 1 and the 16 chunks"):
        make_trace(Workload(**{**TOPK, "topk": 17}), 10)


def test_a_topk_step_on_idle_instances_ends_with_its_slowest_part():
    """One request by hand: its unique KV here (a call of its own) and one routed chunk,
    each in the model's time; the request ends with the slower. Two requests' unique KV at
    one requester never batch: the second waits for the first."""
    from xbench.simulate import Workload, request_latency, simulate
    from xbench.simulate.engine import OWN, Trace, _Costs

    w = Workload(**{**TOPK, "topk": 1}, rate_per_s=1e3, fabric="ib", cache_chunks=0)
    c = _Costs(PRIORS, w)
    assert c.own == pytest.approx(PRIORS.device.compute(16, 16384))
    one = Trace(
        np.zeros(2), np.array([0, 0]), np.array([OWN, 1]), np.array([0, 1]), np.array([0, 0])
    )
    res = simulate(PRIORS, w, one, "route")
    assert res.latency[0] == pytest.approx(c.own) and res.path[0] == 0
    assert res.latency[1] == pytest.approx(c.per_use()["route"]) and res.path[1] == 1
    assert request_latency(res, one)[0] == pytest.approx(max(c.own, c.per_use()["route"]))
    two = Trace(np.zeros(2), np.array([0, 0]), np.array([OWN, OWN]), np.array([0, 0]), np.arange(2))
    res = simulate(PRIORS, w, two, "route")
    assert sorted(res.latency) == pytest.approx([c.own, 2 * c.own]) and res.batches == 0


def test_topk_routing_lands_on_the_closed_form_where_the_compute_binds():
    """own_copies joins the event simulator to core.sharing.step: device-initiated messages
    (ibgda, 0.05 us each) leave the instances' compute the bound, and the simulated gain over
    a copy each is the closed form's at the same queries per call; CPU-initiated ones (ib,
    5 us each, 2 (topk - 1) a request) fill a link first, and the simulation says so."""
    from xbench.simulate import own_copies

    spec = {
        "fields": {**TOPK, "rate_per_s": 1e7, "cache_chunks": 0, "batch_merges": True},
        "fabrics": ["ibgda", "ib"],
    }
    frame = own_copies(PRIORS, spec, 1500, 0).set_index(["fabric", "policy"])
    # run's rows for the same requests and seed stand in for simulating a policy again
    from xbench.simulate import run

    ran = run(PRIORS, spec, ["route", "predicate"], 1500, 0)
    again = own_copies(PRIORS, spec, 1500, 0, ran).set_index(["fabric", "policy"])
    assert again.equals(frame)
    gpu = frame.loc[("ibgda", "route")]
    assert gpu.compute_util_max > 0.95 and gpu.link_util_max < 0.5
    assert gpu.gain == pytest.approx(gpu.closed_form_gain, rel=0.05)
    assert gpu.gain > 2  # the copies read the whole context for each request
    # the closed form at the batch whose calls hold the simulation's queries per call
    closed = step(
        Attention(PRIORS.device, 16),
        PRIORS.device.merge,
        batch=gpu.closed_form_batch,
        shared=16 * 8192,
        unique=16384,
        chunk=8192,
        keep=0.25,
    )
    assert closed["queries_per_chunk"] == pytest.approx(gpu.queries_per_call, rel=1e-9)
    assert closed["gain"] == pytest.approx(gpu.closed_form_gain, rel=1e-12)
    cpu = frame.loc[("ib", "route")]
    assert cpu.link_util_max > 0.95 and cpu.gain < 0.8 * cpu.closed_form_gain
    # the copies attend the whole context at the requester, one call a request: the
    # busiest requester's calls take the run
    from xbench.simulate import Workload, make_trace

    trace = make_trace(Workload(**spec["fields"]), 1500, 0)
    busiest = np.bincount(trace.requester[trace.chunk < 0]).max()
    copy = PRIORS.device.compute(16, 16 * 8192 + 16384)
    assert gpu.copies_throughput_per_s == pytest.approx(1500 / (busiest * copy), rel=0.01)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("topk = 5", "[workload] topk = 5 is more than its 4 chunks"),
        ("topk = 0", "[workload] topk = 0 is out of range"),
        ("unique_tokens = 512", "[workload] gives unique_tokens without topk"),
        ('reports = ["copies"]', "[workload] reports copies without topk"),
    ],
)
def test_a_bad_topk_workload_is_named(tmp_path, body, words):
    with pytest.raises(Exception, match=re.escape(words)):
        load_workload(_scenario(tmp_path, body))


def test_a_span_workload_takes_no_topk(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        '[scenario]\nname = "s"\nmodel = "deepseek-v3.2"\n[workload]\n'
        'spans = [{ expr = "{a, b}", weight = 1 }]\ntopk = 1\n'
    )
    with pytest.raises(Exception, match=re.escape("gives spans and topk")):
        load_workload(path)


def test_simulate_prints_topk_routing_against_a_copy_each(xbench, tmp_path):
    from xbench.results.schema import OWN_COPIES
    from xbench.results.store import read_table, table_run_meta

    out = tmp_path / "topk.parquet"
    r = xbench("simulate", "moska-topk", "--requests", "600", "--out", out, env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    tail = r.stdout[r.stdout.index("top-k routing against a copy each") :]
    assert "…" not in tail and max(map(len, tail.splitlines())) <= 80, tail
    frame = read_table([tmp_path / "topk.copies.parquet"], OWN_COPIES)
    run = table_run_meta(out)
    assert (run["topk"], run["unique_tokens"], run["scenario"]) == (16, 65536, "moska-topk")
    assert set(frame.fabric) == {"ib", "ibgda", "nvlink"}
    assert set(frame.policy) == {"route", "predicate"} and (frame.gain > 1).all()
    r = xbench("simulate", "moska-topk", "--validate")
    assert r.returncode == 2 and "attend 16 chunks and their own KV" in r.stderr
