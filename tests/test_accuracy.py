"""The model's accuracy across machines (issue 19): per-phase predictions and measurements,
the conditions a profile was fitted under, and the CPU attention path switch."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pandas as pd
import pytest
from conftest import drop_key, run_one_rank

from xbench.core import conditions
from xbench.core.costmodel import Coef, Request, times
from xbench.core.parts import phase_times
from xbench.core.profile import ProfileError, load_profile, save_profile
from xbench.kernels import cpu_bf16
from xbench.resources import profile_path
from xbench.validate.summary import phase_errors, validation_errors
from xbench.validate.worker import PHASES, phase_means

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

PRIORS = load_profile(profile_path("h100-priors"))
# route's merge after its wait: (w0 + R p w1) (1 - exp(-g / tau)) more
WAIT = {
    "merge_wait_t0": Coef(260e-6, 200e-6, 320e-6, "s"),
    "merge_wait_per_row_partial": Coef(0.25e-6, 0.1e-6, 0.4e-6, "s/row-partial"),
    "merge_wait_tau": Coef(5e-3, 3e-3, 8e-3, "s"),
}


# what a fetch's first attention saves on the chunk it has just spliced, per chunk size
SAVING = ((256, Coef(35e-6, 20e-6, 50e-6, "s")), (1024, Coef(150e-6, 100e-6, 200e-6, "s")))


@pytest.mark.parametrize(
    "request_",
    [
        Request(rows=1, heads=16, chunk_tokens=256),
        Request(rows=16, heads=128, chunk_tokens=4096, segments=64),
        Request(rows=4, heads=16, chunk_tokens=1024, reuse=3, include_probe=True),
        Request(rows=2, heads=16, chunk_tokens=512, blocks_local=True, fetch_cost=1e-5),
    ],
)
@pytest.mark.parametrize("waits", [False, True], ids=["merge-as-fetch", "merge-after-wait"])
@pytest.mark.parametrize("saving", [(), SAVING], ids=["cold-fetch", "spliced-fetch"])
def test_phases_add_up_to_the_options_times(request_, waits, saving):
    device = dataclasses.replace(PRIORS.device, spliced_saving=saving)
    if waits:
        device = dataclasses.replace(device, **WAIT)
    for fabric in PRIORS.fabrics:
        route, fetch, local = times(fabric, device, request_)
        phases = phase_times(fabric, device, request_)
        assert sum(phases["route"].values()) == pytest.approx(route, rel=1e-12)
        assert sum(phases["fetch"].values()) == pytest.approx(fetch, rel=1e-12)
        assert sum(phases["local"].values()) == pytest.approx(local, rel=1e-12)
        assert set(PHASES["route"]) <= set(phases["route"])
        assert set(PHASES["fetch"]) <= set(phases["fetch"])
        # the send leg carries the query, the return leg the answer: each its own message
        r = request_
        assert phases["route"]["send"] == pytest.approx(
            fabric.wire(r.rows * r.heads * r.payload_bytes)
        )
        assert phases["route"]["return"] == pytest.approx(
            fabric.wire(r.rows * r.heads * r.return_bytes)
        )


def test_phase_means_from_both_ranks_stamps():
    # two iterations; requester stamps (a0, a1, a2), holder stamps (b0, b1) per iteration
    mine = [0.0, 10.0, 11.0, 20.0, 32.0, 34.0]
    theirs = [2.0, 9.0, 23.0, 29.0]
    got = phase_means("route", mine, theirs, 2)
    assert got == {"send": 2.5, "attention": 6.5, "return": 2.0, "merge": 1.5}
    assert sum(got.values()) == pytest.approx(((11 - 0) + (34 - 20)) / 2)
    # fetch: requester (a0..a4), holder (b0 after the request, b1 after packing)
    mine = [0.0, 10.0, 12.0, 20.0, 21.0]
    theirs = [1.0, 4.0]
    got = phase_means("fetch", mine, theirs, 1)
    assert got == {"transfer": 7.0, "move": 5.0, "attention": 8.0, "merge": 1.0}
    assert phase_means("local", [1.0, 4.0, 5.0, 9.0], [], 2) == {"attention": 3.5}


def test_validate_rotates_chunks_over_twice_the_cache_as_the_sweep_does(monkeypatch):
    """Validate's sets add up to twice the last cache in chunks read, as the kernel sweep's
    attention sets do, so the model's attention and validate's are both timed from memory."""
    from xbench.validate.worker import ValidateConfig, _sets_needed

    asked = []
    monkeypatch.setattr(
        "xbench.kernels.bench.cache_bytes", lambda device: asked.append(device) or 8 * 2**20
    )
    cfg = ValidateConfig(out_dir="-", run_id="-")
    for chunk in (64, 256, 1024, 4096):
        sets, chunk_bytes = _sets_needed(cfg, chunk, 4), chunk * cfg.dim * 2
        assert (sets - 1) * chunk_bytes < 2 * 8 * 2**20 <= sets * chunk_bytes
    assert set(asked) == {"cpu"}  # the last cache of the device the ranks run on


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_validate_sets_past_the_fresh_ones_are_copies_in_their_own_memory():
    """Built by the real ranks' code on one real rank (MPI_COMM_SELF): the copies hold the
    fresh sets' values in memory of their own, with their own free pages, and every set's
    local attention gives the checked answer."""
    code = """
import json, torch
from mpi4py import MPI
from xbench.validate.worker import Peer, ValidateConfig
from xbench.kernels.bench import FRESH_SETS
cfg = ValidateConfig(out_dir="-", run_id="-", local_tokens=64)
peer = Peer(cfg, 2, 128, MPI.COMM_SELF, FRESH_SETS + 3)
peer.prepare()
holders = [h for h, _, _, _ in peer.sets]
results = [peer.local(i) for i in range(len(peer.sets))]
print(json.dumps({
    "sets": len(peer.sets),
    "holders": len({h.data_ptr() for h in holders}),
    "targets": len({t.data_ptr() for t in peer.targets}),
    "copy_equal": all(torch.equal(holders[FRESH_SETS + k], holders[k]) for k in range(3)),
    "same_answer": all(torch.equal(results[FRESH_SETS + k][0], results[k][0]) for k in range(3)),
    "partials": len(peer.local_partials) >= len(peer.sets),
    "check": peer.check("local", results[0])[1],
}))
"""
    done = run_one_rank(code)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "sets": 11,
        "holders": 11,
        "targets": 11,
        "copy_equal": True,
        "same_answer": True,
        "partials": True,
        "check": True,
    }


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_validate_graphs_are_captured_per_call_and_set_before_timing_and_replayed_after():
    """validate's --launch graph path on one real rank (MPI_COMM_SELF), with CUDA's capture
    stood in for by one that records what it was asked and replays by running the call
    again (no GPU here): prepare() captures each compute call once per set (a fetch's merge
    reading its attention's captured outputs), the paths then only replay, and their
    answers are the eager ones."""
    code = """
import json, torch
from mpi4py import MPI
from xbench.kernels import bench
from xbench.kernels.bench import FRESH_SETS
from xbench.validate.calls import CaseCalls
from xbench.validate.worker import Peer, ValidateConfig

captured = []

def tensors(out):
    return [out] if isinstance(out, torch.Tensor) else list(out)

class Replay:  # a graph's replay: the call's results written into the captured outputs
    def __init__(self, body, static):
        self.body, self.static, self.replays = body, static, 0
    def replay(self):
        self.replays += 1
        for held, new in zip(self.static, tensors(self.body()), strict=True):
            held.copy_(new)

def capture(self, body):  # the eager warm-up, then what a graph would hold
    body()
    captured.append(body)
    return Replay(body, tensors(body()))

bench.Clock.capture = capture
cfg = ValidateConfig(out_dir="-", run_id="-", local_tokens=64, fetch_layout="packed")
eager = Peer(cfg, 2, 128, MPI.COMM_SELF, FRESH_SETS + 1)
graphed = Peer(cfg, 2, 128, MPI.COMM_SELF, FRESH_SETS + 1)
graphed.calls = CaseCalls(graphs=True)
eager.prepare()
graphed.prepare()
after_prepare = len(captured)
same = []
for peer in (eager, graphed):
    peer.skv.copy_(peer.sets[1][0].reshape(-1, cfg.dim)[: peer.chunk])  # a fetched chunk
    peer.sq.copy_(peer.sets[1][3])  # a routed query
def fetched(p, k):  # the requester's side of a fetch, past the wire (one rank here)
    p._splice_fetched(k)
    return p._merge_fetched(k, p._attend_fetched(k))

def routed(p, k):  # both sides of a route, past the wire
    p._gather(k)
    p._attend_routed(k)
    return p._merge_routed(k)

for i in range(len(graphed.sets)):
    for path in (lambda p: p.local(i), lambda p: fetched(p, i), lambda p: routed(p, i)):
        got = [path(p) for p in (eager, graphed)]
        same.append(all(torch.equal(a, b) for a, b in zip(*got, strict=True)))
print(json.dumps({
    "sets": len(graphed.sets),
    "captured": after_prepare,
    "keys": sorted({k[0] for k in graphed.calls.graphs}),
    "after_timing": len(captured) - after_prepare,
    "same": all(same),
    "replayed": min(g.replays for k, g in graphed.calls.graphs.items()
                    if k[0] in ("local attention", "fetch merge", "route merge")),
}))
"""
    done = run_one_rank(code)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    keys = ["fetch attention", "fetch gather", "fetch merge", "fetch splice", "local attention"]
    keys += ["route attention", "route merge"]
    assert got == {
        "sets": 9,
        "captured": 7 * 9,
        "keys": keys,
        "after_timing": 0,
        "same": True,
        "replayed": 1,
    }


def test_bias_and_phase_errors_name_the_term_that_is_off():
    summary = pd.DataFrame(
        {
            "option": ["route", "route", "local"],
            "error": [-0.2, -0.1, 0.05],
            "measured_us": [100.0, 200.0, 50.0],
            "measured_send_us": [10.0, 10.0, float("nan")],
            "predicted_send_us": [10.0, 10.0, float("nan")],
            "measured_attention_us": [60.0, 150.0, 50.0],
            "predicted_attention_us": [40.0, 130.0, 52.5],
            **{
                f"{kind}_{p}_us": [float("nan")] * 3
                for p in ("return", "merge", "transfer", "move")
                for kind in ("measured", "predicted")
            },
        }
    )
    errors = validation_errors(summary)
    assert errors["bias"] == pytest.approx(-0.25 / 3)
    assert errors["bias_by_option"] == pytest.approx({"route": -0.15, "local": 0.05})
    phases = phase_errors(summary).set_index(["option", "phase"])
    assert phases.loc[("route", "send"), "error_of_total"] == 0
    assert phases.loc[("route", "attention"), "error_of_total"] == pytest.approx(
        (-20 / 100 - 20 / 200) / 2
    )
    assert phases.loc[("route", "attention"), "measured_us"] == 210
    assert ("route", "merge") not in phases.index  # no phase predicted, no row


def test_conditions_from_runs_and_their_differences():
    kernel = {
        "command": "kernel",
        "cpu_model": "AMD EPYC",
        "cpu_flags": "avx2 avx512f avx512_bf16",
        "device": "cpu",
        "conditions": {"cpu_attention": "c-bf16", "torch_threads": 1, "kernel_layout": "alone"},
    }
    probe = {
        "command": "probe",
        "cpu_model": "AMD EPYC",
        "mpi_library": "MPICH Version: 4.3",
        "mpi_thread_level": "single",
    }
    fitted = conditions.merged([probe, kernel])
    assert fitted == {
        "cpu_model": "AMD EPYC",
        "cpu_flags": "avx2 avx512f avx512_bf16",
        "cpu_attention": "c-bf16",
        "torch_threads": 1,
        "kernel_layout": "alone",
        "mpi_library": "MPICH Version: 4.3",
        "mpi_thread_level": "single",
    }
    here = {"cpu_model": "AMD EPYC", "cpu_attention": "torch", "mpi_library": "Open MPI v5.0.11"}
    diffs = conditions.differences(fitted, here)
    assert [d[0] for d in diffs] == ["cpu_attention", "mpi_library"]  # unknown fields skipped
    line = conditions.describe("lab", diffs)
    assert "\n" not in line and "cpu_attention c-bf16 there, torch here" in line
    gpu_run = {**kernel, "device": "cuda", "gpus": [{"name": "NVIDIA H100", "driver": "580.1"}]}
    assert conditions.from_run_meta(gpu_run)["gpu"] == "NVIDIA H100"


def test_cpu_attention_path_switch(restore_cpu_path):
    import torch

    from xbench.kernels import DensePages, mla_partial_attention

    assert cpu_bf16.choose_path("torch") == "torch" and cpu_bf16.load() is None
    assert os.environ[cpu_bf16.PATH_ENV] == "torch"  # launched ranks inherit it
    q = torch.randn(4, 8, 576).bfloat16()
    cache = torch.randn(2, 64, 576).bfloat16()
    pages = DensePages(torch.arange(2), 128)
    by_torch = mla_partial_attention(q, cache, pages, 0.04, v_dim=512)[0]
    with pytest.raises(ValueError, match="unknown CPU attention path"):
        cpu_bf16.choose_path("fast")
    if cpu_bf16.unavailable_because():
        with pytest.raises(ValueError, match="c-bf16"):
            cpu_bf16.choose_path("c-bf16")
        assert cpu_bf16.choose_path("auto") == "torch"
    else:
        assert cpu_bf16.choose_path("c-bf16") == "c-bf16" and cpu_bf16.load() is not None
        by_c = mla_partial_attention(q, cache, pages, 0.04, v_dim=512)[0]
        # two paths, one answer (both accumulate in fp32)
        assert torch.allclose(by_c.float(), by_torch.float(), atol=2e-2, rtol=2e-2)


def test_steady_allocator_sets_glibc_thresholds():
    import platform

    said = __import__("xbench.host", fromlist=["steady_allocator"]).steady_allocator()
    if platform.libc_ver()[0] == "glibc":
        assert said == "glibc mmap threshold 64 MiB"


def _profile_with_conditions(tmp_path, **found):
    prof = dataclasses.replace(
        PRIORS, provenance={**PRIORS.provenance, "conditions": found}, name="lab"
    )
    return save_profile(prof, tmp_path / "lab.toml")


def test_decide_warns_once_when_the_cpu_differs(xbench, tmp_path):
    path = _profile_with_conditions(
        tmp_path, cpu_model="Some Other CPU 9000", cpu_attention="torch"
    )
    r = xbench("decide", "--profile", path, "--payload", "1KB", "--format", "json")
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "cpu_model Some Other CPU 9000 there" in warnings[0]
    json.loads(r.stdout)  # stdout stays parseable
    # a GPU profile read where there is no GPU is planning, not use: no warning
    path = _profile_with_conditions(tmp_path / "g", gpu="NVIDIA H100 80GB HBM3", driver="580")
    r = xbench("decide", "--profile", path, "--payload", "1KB", "--format", "json")
    import torch

    if not torch.cuda.is_available():
        assert r.returncode == 0 and "warning" not in r.stderr


def test_merge_per_token_is_paid_by_route_and_fetch_not_local(tmp_path):
    tax = Coef(30e-9, 25e-9, 35e-9, "s/token")
    device = dataclasses.replace(PRIORS.device, merge_per_token=tax)
    fabric = PRIORS.fabrics[0]
    for chunk in (256, 4096):
        r = Request(rows=4, heads=16, chunk_tokens=chunk)
        before, after = times(fabric, PRIORS.device, r), times(fabric, device, r)
        assert after[0] - before[0] == pytest.approx(chunk * 30e-9)  # route
        assert after[1] - before[1] == pytest.approx(chunk * 30e-9)  # fetch (no reuse)
        assert after[2] == before[2]  # local merges nothing
        assert phase_times(fabric, device, r)["route"]["merge"] == pytest.approx(
            device.merge(64, 2, chunk)
        )
    # the term survives a profile's round trip, interval and all
    path = save_profile(dataclasses.replace(PRIORS, device=device), tmp_path / "p.toml")
    assert load_profile(path).device.merge_per_token == pytest.approx(tax)


def test_a_fetch_attends_its_spliced_chunk_for_less_on_its_first_use_only():
    """With spliced_saving, fetch's attention phase is T_c less the saving at the chunk,
    spread over the uses one fetch serves; route's and local's times do not move; b* and u*
    still say where route and fetch cross."""
    from xbench.core.costmodel import thresholds

    device = dataclasses.replace(PRIORS.device, spliced_saving=SAVING)
    fabric = PRIORS.fabrics[0]
    for chunk, saved in ((256, 35e-6), (640, 92.5e-6), (1024, 150e-6), (65536, 150e-6)):
        for reuse in (0, 3):
            r = Request(rows=4, heads=16, chunk_tokens=chunk, reuse=reuse)
            assert device.saved_on_splice(chunk) == pytest.approx(saved)
            cold, hot = times(fabric, PRIORS.device, r), times(fabric, device, r)
            assert hot[0] == cold[0] and hot[2] == cold[2]
            assert hot[1] == pytest.approx(cold[1] - saved / (1 + reuse), rel=1e-12)
            attention = phase_times(fabric, device, r)["fetch"]["attention"]
            assert attention == pytest.approx(device.compute(64, chunk) - saved / (1 + reuse))
    shape = dict(heads=16, chunk_tokens=1024)
    b_star, _ = thresholds(fabric, device, Request(rows=1, **shape))
    assert b_star < thresholds(fabric, PRIORS.device, Request(rows=1, **shape))[0]
    for rows in (max(1, math.floor(b_star * 0.99)), math.ceil(b_star * 1.01)):
        route, fetch, _ = times(fabric, device, Request(rows=rows, **shape))
        assert (route < fetch) == (rows < b_star)


def test_route_merges_after_its_wait_for_the_answer(tmp_path):
    """With the merge-wait terms, route's merge is T_m(R, 2, 0) plus what its wait (the
    holder's attention and both messages) adds, growing with the chunk the holder attends;
    fetch's and local's times do not change; the terms survive a profile file."""
    device = dataclasses.replace(PRIORS.device, **WAIT)
    fabric = PRIORS.fabrics[0]
    merges = []
    for chunk in (256, 4096, 65536):
        r = Request(rows=4, heads=16, chunk_tokens=chunk)
        phases = phase_times(fabric, device, r)["route"]
        wait = phases["send"] + phases["attention"] + phases["return"]
        extra = (260e-6 + 64 * 2 * 0.25e-6) * -math.expm1(-wait / 5e-3)
        assert phases["merge"] == pytest.approx(device.merge(64, 2) + extra, rel=1e-12)
        assert device.merge_after_wait(64, 2, chunk, wait) == pytest.approx(phases["merge"])
        before, after = times(fabric, PRIORS.device, r), times(fabric, device, r)
        assert after[1:] == before[1:]  # fetch and local merge as before (or not at all)
        merges.append(phases["merge"])
    assert merges == sorted(merges) and merges[-1] < device.merge(64, 2) + 292e-6
    # without the terms a merge after a wait is the merge as timed after attention
    assert PRIORS.device.merge_after_wait(64, 2, 512, 1.0) == PRIORS.device.merge(64, 2, 512)
    path = save_profile(dataclasses.replace(PRIORS, device=device), tmp_path / "p.toml")
    back = load_profile(path).device
    for term, coef in WAIT.items():
        assert getattr(back, term) == pytest.approx(coef)
    drop_key(path, tmp_path / "part.toml", "device", "merge_wait_tau")
    with pytest.raises(ProfileError, match="part of the merge-wait term"):
        load_profile(tmp_path / "part.toml")
