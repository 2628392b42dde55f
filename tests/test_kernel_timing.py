"""How kernels are chosen and timed: the auto backend, launch modes, the production-kernel
adapters called as a serving engine calls them (fakes that record what they were asked,
since FlashMLA and FlashInfer need a Hopper GPU), and the GPU benchmark script on a CPU."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch
from conftest import ROOT

from xbench.kernels import DensePages, backend
from xbench.results.schema import KERNEL_SAMPLES
from xbench.results.store import read_table

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def test_auto_is_triton_on_cuda_and_torch_on_cpu():
    pytest.importorskip("triton")
    assert backend.resolve("auto", "cuda") == "triton"
    assert backend.resolve("auto", torch.device("cuda", 1)) == "triton"
    assert backend.resolve("auto", "cpu") == "torch"
    assert backend.resolve("cuda-ref", "cpu") == "cuda-ref"  # a named one is never replaced
    with pytest.raises(backend.XbenchError):
        backend.get_backend("auto")


def test_kernel_cli_resolves_auto_and_refuses_graphs_on_cpu(xbench, tmp_path):
    r = xbench("kernel", "--launch", "graph", "--device", "cpu", "--out", tmp_path / "g")
    assert r.returncode == 2 and "--launch graph needs a CUDA device" in r.stderr
    out = tmp_path / "k"
    r = xbench(
        "kernel",
        "--kernels",
        "partial_attention",
        "--rows",
        "1",
        "--chunk",
        "128",
        "--heads",
        "16",
        "--samples",
        "2",
        "--no-ceilings",
        "--device",
        "cpu",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    samples = read_table(out, KERNEL_SAMPLES)
    assert set(samples.backend) == {"torch"}
    # every sample says how its calls ran and what the backend chose (torch: nothing)
    assert set(samples.launch) == {"eager"} and set(samples.plan) == {""}
    meta = json.loads((out / "run.json").read_text())
    assert meta["backend"] == "torch" and meta["launch"] == "eager"


class _FakeFlashMla(types.ModuleType):
    """flash_mla's two calls, recording their arguments; returns zeros of the right shapes."""

    def __init__(self):
        super().__init__("flash_mla")
        self.metadata_calls, self.kernel_calls = [], []

    def get_mla_metadata(self, seqlens, q_per_kv, h_kv):
        self.metadata_calls.append((seqlens.tolist(), q_per_kv, h_kv))
        return torch.zeros(1), torch.zeros(2)

    def flash_mla_with_kvcache(self, q, kv, block_table, seqlens, dv, meta, splits, **kw):
        self.kernel_calls.append((tuple(q.shape), tuple(kv.shape), block_table.tolist(), kw))
        b, s_q, h, _ = q.shape
        return torch.zeros(b, s_q, h, dv), torch.zeros(b, h, s_q)


def test_flashmla_is_one_request_of_rows_tokens_planned_once(monkeypatch):
    fake = _FakeFlashMla()
    monkeypatch.setitem(sys.modules, "flash_mla", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from xbench.kernels.flashmla_backend import FlashMlaBackend

    impl = FlashMlaBackend()
    q = torch.zeros(8, 128, 576, dtype=torch.bfloat16)
    cache = torch.zeros(10, 64, 576, dtype=torch.bfloat16)
    sel = DensePages(torch.tensor([3, 7, 1]), 150)
    for _ in range(3):
        out, lse = impl.partial_attention(q, cache, sel, 0.1, 512)
    assert out.shape == (8, 128, 512) and lse.shape == (8, 128)
    q_shape, kv_shape, table, kw = fake.kernel_calls[0]
    assert q_shape == (1, 8, 128, 576)  # one request, s_q = rows: the KV is read once
    assert kv_shape == (10, 64, 1, 576) and table == [[3, 7, 1]]
    assert kw == {"softmax_scale": 0.1, "causal": False}
    assert fake.metadata_calls == [([150], 8 * 128, 1)]  # planned once, outside the timed calls


def test_flashinfer_plans_once_per_shape(monkeypatch):
    plans, runs = [], []

    class Wrapper:
        def __init__(self, workspace):
            pass

        def plan(
            self, qo_indptr, kv_indptr, kv_indices, kv_len, heads, v, rope, page, causal, *rest
        ):
            plans.append(
                (
                    qo_indptr.tolist(),
                    kv_indptr.tolist(),
                    kv_indices.tolist(),
                    kv_len.tolist(),
                    causal,
                )
            )

        def run(self, q_nope, q_pe, ckv, kpe, return_lse):
            runs.append((tuple(q_nope.shape), tuple(q_pe.shape)))
            return torch.zeros(*q_nope.shape[:2], 512), torch.zeros(q_nope.shape[:2])

    mla = types.ModuleType("flashinfer.mla")
    mla.BatchMLAPagedAttentionWrapper = Wrapper
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.mla", mla)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_empty = torch.empty
    monkeypatch.setattr(
        torch, "empty", lambda *a, device=None, **k: real_empty(*a, **k)
    )  # the workspace, on the CPU here
    from xbench.kernels.flashinfer_backend import FlashInferBackend

    impl = FlashInferBackend()
    q = torch.zeros(4, 16, 576, dtype=torch.bfloat16)
    cache = torch.zeros(6, 64, 576, dtype=torch.bfloat16)
    sel = DensePages(torch.tensor([2, 5]), 100)
    for _ in range(3):
        out, lse = impl.partial_attention(q, cache, sel, 0.1, 512)
    assert plans == [([0, 4], [0, 2], [2, 5], [100], False)]  # one request of 4 query tokens
    assert len(runs) == 3 and runs[0] == ((4, 16, 512), (4, 16, 64))


def test_gpu_benchmark_script_says_when_nothing_ran_and_writes_no_empty_run(
    tmp_path, monkeypatch, capsys
):
    """No backend that runs here: one line, exit 1, no folder (it printed its table's header,
    then a pandas KeyError). Backends that run but refuse every case (a dense-only adapter
    at sparse cases, CPU tensors on a GPU machine): one line, exit 1, no empty table."""
    import importlib.util

    shapes = ["--device", "cpu", "--rows", "1", "--tokens", "64", "--topk", "0"]
    shapes += ["--heads", "16", "--samples", "1", "--min-sample-time", "0"]
    script = ROOT / "benchmarks" / "gpu_kernels.py"
    r = subprocess.run(
        [sys.executable, str(script), *shapes, "--backends", "cuda-ref"]
        + ["--out", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == "gpu_kernels: none of --backends runs here (why: above)\n"
    assert r.stdout.startswith("cuda-ref ") and not (tmp_path / "none").exists()

    spec = importlib.util.spec_from_file_location("gpu_kernels_refusing", script)
    gpu_kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_kernels)
    asked = []

    def refuse(case, name, *args, **kwargs):
        asked.append((name, case.chunk))
        raise backend.BackendUnavailable(f"{name}: dense calls only")

    monkeypatch.setattr(gpu_kernels, "time_case", refuse)
    out = tmp_path / "refused"
    assert gpu_kernels.main([*shapes, "--backends", "torch", "--out", str(out)]) == 1
    printed = capsys.readouterr()
    assert asked == [("torch", 64)]
    assert "torch: dense calls only" in printed.out and "bound = max" not in printed.out
    assert printed.err == f"gpu_kernels: no case ran (why: above); the ceilings in {out}\n"
    assert set(read_table(out, KERNEL_SAMPLES).kernel) == {"ceiling_copy", "ceiling_matmul"}


def test_gpu_benchmark_script_runs_on_a_cpu(tmp_path):
    """The script a GPU machine runs, exercised end to end on tiny shapes here."""
    out = tmp_path / "gk"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_kernels.py"),
            "--device",
            "cpu",
            "--rows",
            "1,2",
            "--tokens",
            "96",
            "--topk",
            "48",
            "--heads",
            "16",
            "--samples",
            "2",
            "--min-sample-time",
            "0.002",
            "--backends",
            "torch,triton,plain-torch-eager,cuda-ref",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        # triton's kernels on CPU tensors run under the interpreter, on a GPU machine too
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # why a backend is absent: no GPU here, or (on a GPU machine) CPU tensors it refuses
    assert (
        "cuda backend: torch sees no CUDA device here" in r.stdout
        or "cuda-ref" in r.stdout
        and "take CUDA tensors, not cpu ones" in r.stdout
    )
    samples = read_table(out, KERNEL_SAMPLES)
    timed = samples[~samples.kernel.str.startswith("ceiling_")]
    expected = {"torch", "plain-torch-eager"} | ({"triton"} if _has_triton() else set())
    assert set(timed.backend) == expected
    assert {"ceiling_copy", "ceiling_matmul"} <= set(samples.kernel)
    assert "bound" in r.stdout and "%" in r.stdout
    # the triton samples name the tile and split count that ran, the others nothing
    plans = timed.groupby("backend").plan.agg(set)
    assert all(p.startswith("tile 16x16 w4 s1 p2, ") for p in plans.get("triton", set()))
    assert plans["torch"] == {""} and set(timed.launch) == {"eager"}


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401

        return True
    except ImportError:
        return False


def test_a_slow_first_call_does_not_leave_samples_of_one_call():
    """The first call compiles, tunes and allocates (here: sleeps 0.3 s); the calls a
    sample needs are counted from the second, so samples still hold many calls."""
    import time

    from xbench.kernels.bench import KernelCase, time_case

    calls = []

    def runner(inputs):
        calls.append(inputs)
        if len(calls) == 1:
            time.sleep(0.3)

    case = KernelCase("merge", 1, 16, 64, 576, 512, "fp32", False)
    timings = time_case(
        case, "torch", "cpu", 1.0, samples=3, warmups=1, min_sample_s=0.01, runner=runner
    )
    assert timings[0][:2] == (1, True) and timings[0][2] >= 0.3
    assert [warm for _, warm, _ in timings] == [True, True, True, False, False, False]
    assert all(n > 100 for n, _, _ in timings[2:])


def test_an_attention_after_its_splice_reads_the_pages_just_written(monkeypatch):
    """A fetch's first use: each timed attention follows a splice of its chunk into the very
    pages it attends (the real splice, recorded on the way through), so those pages hold
    the landed tokens; only the attention is timed."""
    from xbench.kernels.bench import KernelCase, time_case

    torch_backend = backend.get_backend("torch")
    real_splice = torch_backend.splice_kv
    events = []

    def splice(kv_cache, packed, free_pages, *rest):
        events.append(("splice", kv_cache, list(free_pages), packed))
        return real_splice(kv_cache, packed, free_pages, *rest)

    def attend(inputs):
        events.append(("attend", inputs["cache"], inputs["indices"].pages.tolist(), None))

    monkeypatch.setattr(torch_backend, "splice_kv", splice)
    case = KernelCase("partial_attention", 1, 16, 128, 576, 512, "bf16", False, after_splice=128)
    timings = time_case(
        case, "torch", "cpu", 1.0, samples=2, warmups=1, min_sample_s=0.001, runner=attend
    )
    assert len(timings) == 4 and all(t > 0 for _, _, t in timings)
    assert [e[0] for e in events[:4]] == ["splice", "attend", "splice", "attend"]
    for spliced, attended in zip(events[0::2], events[1::2], strict=True):
        assert spliced[0] == "splice" and attended[0] == "attend"
        assert spliced[1] is attended[1] and spliced[2] == attended[2]  # same cache, pages
        landed = spliced[1][spliced[2]].reshape(-1, 576)[:128, :512]
        assert torch.equal(landed, spliced[3][:, :512])  # the non-RoPE part copied exactly


def test_an_attention_after_its_splice_is_timed_next_to_its_twin_on_its_rank():
    """The pair the fit subtracts (cold attention, attention after a splice) is planned
    back to back and takes the twin's turn, so both halves run on one core close in time,
    whatever number of cases lie between (the sweep in validate_mape.py put 21 there, and
    the two ranks took the halves)."""
    from xbench.core.models import get_model
    from xbench.kernels.bench import plan_cases, timing_turns

    cases = plan_cases(
        get_model("deepseek-v3"), ["partial_attention", "merge"], [1, 4, 16],
        [128, 256, 512, 1024, 2048, 4096, 8192], "bf16", False, 16, 64, in_context=True,
        idle_us=[1000],
    )  # fmt: skip
    turns = timing_turns(cases)
    spliced = [i for i, case in enumerate(cases) if case.after_splice]
    assert len(spliced) == 7
    for i in spliced:
        twin = cases[i - 1]
        assert (twin.rows, twin.chunk, twin.after_splice, twin.idle_us) == (
            1, cases[i].chunk, 0, 0
        )  # fmt: skip
        assert turns[i] == turns[i - 1] == i - 1
    assert all(turns[i] == i for i, case in enumerate(cases) if not case.after_splice)
    assert not any(
        c.after_splice
        for c in plan_cases(
            get_model("deepseek-v3"), ["partial_attention"], [1], [256], "bf16", False, 16, 64
        )
    )  # back to back (a GPU's default): no splice before attention


@pytest.mark.gpu
def test_every_sweep_kernel_replays_from_a_cuda_graph(xbench, tmp_path):
    """The default sweep on a GPU: the splice copied its page list and RoPE frequencies from
    the host inside the graph's capture and stopped ``xbench kernel`` on an H100."""
    out = tmp_path / "k"
    r = xbench(
        "kernel", "--kernels", "partial_attention,merge,gather,splice", "--rows", "1",
        "--chunk", "1024", "--samples", "2", "--launch", "graph", "--out", out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    samples = read_table(out, KERNEL_SAMPLES)
    assert {"partial_attention", "merge", "gather", "splice"} <= set(samples.kernel)


def test_the_tile_benchmark_times_each_tile_and_split_count(tmp_path):
    """benchmarks/triton_tiles.py, what GPU_TILES and the split estimate were chosen from,
    exercised on tiny shapes under the interpreter; a malformed tile is one line."""
    pytest.importorskip("triton")
    script = [sys.executable, str(ROOT / "benchmarks" / "triton_tiles.py"), "--device", "cpu"]
    out = tmp_path / "tiles.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [*script, "--rows", "1", "--tokens", "40", "--topk", "0", "--heads", "16",
         "--tiles", "16,16,4,1,2,1", "64,16,8,2,1", "64,16,8,2,1,1", "--samples", "1",
         "--dense-indices", "pages", "tokens", "--min-sample-time", "0.001", "--out", str(out),
         "--pdl", "off", "on"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "best partial_attention rows=1 chunk=40 dense" in r.stdout
    # where the best timing's tile was also timed with the other page lookahead, all else the
    # same: both times (wrapped at words), and whether the samples of the two lie apart. Only
    # a page table's timings have a lookahead to compare; under the interpreter which of the
    # two index forms wins is the machine's load, so the line expected follows the best
    timings = json.loads(out.read_text())["timings"]
    best = min(timings, key=lambda t: t["us"])
    best_line = " ".join(r.stdout.split("best partial_attention", 1)[1].split("\n\n")[0].split())
    both = r"lookahead o(n|ff) \([\d.,]+ us off, [\d.,]+ on: samples (apart|overlap)\)"
    if best["indices"] == "pages":
        assert re.search(both, best_line), r.stdout
    else:
        assert "lookahead" not in best_line and best_line.endswith("splits, tokens"), r.stdout
    # the dependent launch of the combine is timed only where a GPU can do it: said, not
    # timed as something it is not
    assert "--pdl on: not timed here: programmatic dependent launch needs a CUDA GPU" in r.stdout
    # a lookahead is timed only where it changes the kernel (a 64-row tile's TMA loop over a
    # page table): not for the 16-row tile, nor for token indices
    assert {(tuple(t["tile"]), t["lookahead"]) for t in timings} == {
        ((64, 16, 8, 2, 1), False),
        ((64, 16, 8, 2, 1), True),
    }
    assert {t["indices"] for t in timings if t["lookahead"]} == {"pages"}
    assert all(t["us"] > 0 and t["splits"] >= 1 for t in timings)
    # each timing keeps its samples, the median printed and stored among them
    assert all(len(t["samples_us"]) == 1 and t["us"] == t["samples_us"][0] for t in timings)
    # each tile and split count of the dense shape timed both ways the selection can arrive
    # (the lookahead: as a page table only)
    ways = collections.Counter((tuple(t["tile"]), t["lookahead"], t["splits"]) for t in timings)
    assert {n for (*_, ahead, _s), n in ways.items() if not ahead} == {2}
    assert {n for (*_, ahead, _s), n in ways.items() if ahead} == {1}
    assert {t["indices"] for t in timings} == {"pages", "tokens"}
    assert not any(t["pdl"] for t in timings)
    r = subprocess.run([*script, "--tiles", "16,16,4"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "--tiles: a tile is rows,tokens,warps,stages,parts" in r.stderr
    # split counts asked for besides the usual ones (at most one a tile of tokens)
    r = subprocess.run(
        [*script, "--rows", "1", "--tokens", "40", "--topk", "0", "--heads", "16",
         "--tiles", "16,16,4,1,1", "--splits", "2,9", "--samples", "1",
         "--min-sample-time", "0.001", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert {t["splits"] for t in json.loads(out.read_text())["timings"]} >= {2, 3}
    r = subprocess.run([*script, "--splits", "many"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "whole numbers" in r.stderr


def test_the_tile_benchmark_says_whether_two_ways_samples_lie_apart(monkeypatch):
    """A candidate is kept where its samples and the plain kernel's lie apart
    (docs/gpu-check.md): the best line says which, from each timing's samples."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import triton_tiles

    def timing(pdl, samples):
        way = {"case": "c", "tile": [64, 64, 8, 2, 1], "splits": 64, "indices": "pages"}
        return {**way, "lookahead": False, "pdl": pdl, "samples_us": samples, "us": samples[1]}

    off, on = timing(False, [50.0, 50.2, 50.9]), timing(True, [48.1, 48.3, 49.0])
    assert triton_tiles.both_ways([off, on], on, "pdl") == (
        ", pdl on (50.2 us off, 48.3 on: samples apart)"
    )
    close = timing(True, [49.0, 49.5, 50.1])
    assert triton_tiles.both_ways([off, close], close, "pdl").endswith("samples overlap)")
    # timed one way only: the switch named where it is on, no comparison
    assert triton_tiles.both_ways([on], on, "pdl") == ", pdl"
    assert triton_tiles.both_ways([off], off, "lookahead") == ""


class _FakeGpuClock:
    """A GPU's clock without a GPU: records what the timing asked of it (captures, replays,
    calls timed), so the launch of each timed call can be checked."""

    cuda = True

    def __init__(self):
        self.log = []

    def capture(self, body):
        self.log.append("capture")
        body()  # capture runs the body once (its eager warm-up)
        log = self.log

        class Graph:
            def replay(self):
                log.append("replay")
                body()

        return Graph()

    def time(self, fn, calls):
        self.log.append("timed")
        for i in range(calls):
            fn(i)
        return 1e-6


@pytest.mark.parametrize("launch", ["graph", "eager"])
def test_a_call_after_idle_on_a_gpu_is_launched_as_its_back_to_back_twin(launch):
    """On a GPU the back-to-back samples are graph replays: a call after idle, a wait, an
    attention or a splice is then the replay of a graph holding that one call (captured
    once per input set, untimed), not an eager call whose launch would pass for idle."""
    from xbench.kernels.bench import _SingleCalls

    clock, ran = _FakeGpuClock(), []
    sets = [{"k": 0}, {"k": 1}]
    one = _SingleCalls(clock, sets, lambda x: ran.append(x["k"]), launch)
    for i in range(4):
        assert one.timed(i % 2) == 1e-6
    if launch == "graph":
        # each set captured (and replayed) once, untimed, before its first timed call;
        # every timed call a replay
        first = ["capture", "replay", "timed", "replay"]
        assert clock.log == first + first + ["timed", "replay"] * 2
        assert ran == [0, 0, 0, 1, 1, 1, 0, 1]
    else:
        assert clock.log == ["timed"] * 4 and ran == [0, 1, 0, 1]


def test_a_sparse_attentions_rows_select_from_contexts_of_their_own():
    """Each decode row's selection comes from a region of its own, so the rows x chunk tokens
    the bound counts are distinct (one shared pool of 4 x chunk stayed in a GPU's L2)."""
    from xbench.kernels.bench import SPARSE_CONTEXT, KernelCase, make_inputs

    case = KernelCase("partial_attention", 3, 16, 64, 576, 512, "bf16", True)
    x = make_inputs(case, "cpu", seed=0)
    region = SPARSE_CONTEXT * case.chunk
    assert x["cache"].shape[0] * x["cache"].shape[1] == 3 * region
    idx = x["indices"]
    assert idx.shape == (3, 64)
    for row in range(3):
        assert (idx[row] >= row * region).all() and (idx[row] < (row + 1) * region).all()
    assert len(set(idx.flatten().tolist())) == 3 * 64  # every token read once


def test_the_triton_backend_says_which_tile_and_splits_it_ran(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from xbench.kernels.triton_backend import TritonBackend

    b = TritonBackend()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, 576, generator=gen).bfloat16()
    cache = torch.randn(4, 64, 576, generator=gen).bfloat16()
    idx = torch.arange(200, dtype=torch.int32)
    b.partial_attention(q, cache, idx, 0.04, 512, tile=(16, 16, 4, 1, 1), splits=3)
    assert b.last_plan == "tile 16x16 w4 s1 p1, 3 splits, combine 128x4 w4"
    b.partial_attention(q, cache, idx, 0.04, 512, tile=(16, 16, 4, 1, 2), splits=1)
    assert b.last_plan == "tile 16x16 w4 s1 p2, 1 split"  # one split: no combine ran
    # a combine launched dependent on the split kernel needs a GPU: asked for here, the plan
    # says it was launched after it, as it was
    b.partial_attention(q, cache, idx, 0.04, 512, tile=(16, 16, 4, 1, 1), splits=3, pdl=True)
    assert b.last_plan == "tile 16x16 w4 s1 p1, 3 splits, combine 128x4 w4"


def test_each_kernel_is_one_spec_whose_parts_agree():
    """A kernel is one KernelSpec (bytes, FLOPs, inputs, the call timed) and its line in
    SPECS: every spec's input set feeds its own call on this CPU (a key or a shape its call
    does not take fails), and only a merge records the partials it combines."""
    from xbench.kernels.bench import SPECS, KernelCase, case_runner, make_inputs, sample_rows

    assert all(name == spec.name for name, spec in SPECS.items())
    for name in SPECS:
        case = KernelCase(name, 2, 16, 64, 576, 512, "bf16", False, partials=3)
        case_runner(case, "torch", 0.05)(make_inputs(case, "cpu", 0))
        (row,) = sample_rows(case, [(1, False, 1e-6)], "r", "torch", "cpu", "m")
        assert row["partials"] == (3 if name == "merge" else 1), name
    assert SPECS["gather"].flops(KernelCase("gather", 1, 16, 64, 576, 512, "bf16", False)) == 0


def test_a_dependent_launch_is_asked_only_of_a_gpu_that_has_it(monkeypatch):
    """Programmatic dependent launch: a CUDA GPU of compute capability 9.0 or more, compiled;
    elsewhere one sentence says why (what triton_tiles.py prints instead of a timing)."""
    pytest.importorskip("triton")
    from xbench.kernels import triton_backend

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    why = triton_backend.pdl_unavailable(torch, torch.device("cpu"))
    assert why.startswith("programmatic dependent launch needs a CUDA GPU")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    capability = {"value": (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability["value"])
    assert "compute capability 9.0, this GPU has 8.0" in triton_backend.pdl_unavailable(
        torch, torch.device("cuda", 0)
    )
    capability["value"] = (9, 0)
    assert triton_backend.pdl_unavailable(torch, torch.device("cuda", 0)) == ""
