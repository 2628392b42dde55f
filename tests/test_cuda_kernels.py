"""CUDA kernels: NVRTC compilation for sm_90 here; numerics on a GPU (marked gpu)."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench.kernels import BackendUnavailable, DensePages, cuda_backend, get_backend, random_topk
from xbench.kernels.cuda_backend import KERNELS, SOURCES, CudaBackend, compile_source, cuda_dir

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

ELF_MAGIC = b"\x7fELF"


def test_every_source_is_registered():
    """NVRTC's modules, and the one program nvcc builds (the device-initiated probe)."""
    from xbench.fabric import device_probe

    found = sorted(p.name for p in cuda_dir().glob("*.cu"))
    assert found == sorted((*SOURCES, device_probe.SOURCE))


@pytest.mark.parametrize("source", SOURCES)
def test_compiles_for_sm90_without_a_gpu(source, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))  # a real compile, not a cached cubin
    cubin = compile_source(source, "sm_90")
    assert cubin.startswith(ELF_MAGIC)
    for name in KERNELS[source]:
        assert name.encode() in cubin
    assert any(tmp_path.glob("*.cubin"))  # cached for the next run
    assert compile_source(source, "sm_90") == cubin


def test_older_nvrtc_compiles_with_the_toolkit_headers(tmp_path, monkeypatch):
    """NVRTC < 13.3 (a CUDA 13.0 image) has no bundled headers: cuda_bf16.h comes from the
    CUDA runtime headers that cuda.pathfinder finds, and the cubin still builds."""
    from cuda.pathfinder import find_nvidia_header_directory

    if find_nvidia_header_directory("cudart") is None:
        pytest.skip("no CUDA runtime headers here (wheel or toolkit) to stand in for NVRTC 13.0")
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_backend, "nvrtc_version", lambda: (13, 0))
    assert "use_bundled_headers" not in cuda_backend.header_options("inc")
    assert compile_source("mla_partial_attention.cu", "sm_90").startswith(ELF_MAGIC)


# Loads NVRTC 12.4 as a CUDA 12 build of torch does on import (cuda.bindings then takes the
# one loaded), compiles through xbench, and reports what Python's text I/O uses afterwards
_NVRTC12_COMPILE = """
import ctypes, locale, subprocess, sys
ctypes.CDLL(sys.argv[1], ctypes.RTLD_GLOBAL)
from xbench.kernels.cuda_backend import compile_source, nvrtc_version
before = locale.getpreferredencoding(False)
compile_source("merge_partials.cu", "sm_90")
child = subprocess.run([sys.executable, "-c", "print('2.5 \u00b5s \u00d7 4')"],
                       capture_output=True, text=True).stdout.strip()
print(nvrtc_version()[0], before, locale.getpreferredencoding(False), child)
"""


def test_a_compile_by_nvrtc_12_leaves_pythons_text_encoding_as_it_was(tmp_path):
    """NVRTC 12.0-12.5 leave the compiling thread in the C locale: afterwards Python read
    and wrote text as ASCII, and a child's "µs" was a UnicodeDecodeError (on a CUDA 12.4
    site, in any command that compiled; 24 tests here under torch 2.1). ``make nvrtc12``
    unpacks the 12.4 library beside the environment's packages."""
    from cuda.pathfinder import find_nvidia_header_directory

    library = Path(sys.prefix) / "nvrtc12" / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    if not library.exists():
        pytest.skip(f"no NVRTC 12.4 at {library} (make nvrtc12 puts it there)")
    if find_nvidia_header_directory("cudart") is None:
        pytest.skip("no CUDA runtime headers here (wheel or toolkit) for NVRTC 12 to compile with")
    r = subprocess.run(
        [sys.executable, "-c", _NVRTC12_COMPILE, str(library)],
        capture_output=True,
        text=True,
        # a real compile; a UTF-8 locale, not UTF-8 mode (where the locale is not read)
        env={
            **os.environ,
            "XBENCH_CACHE_DIR": str(tmp_path),
            "LC_ALL": "C.UTF-8",
            "PYTHONUTF8": "0",
        },
    )
    assert r.returncode == 0, r.stderr[-2000:]
    major, before, after, child = r.stdout.strip().split(maxsplit=3)
    assert major == "12", r.stdout  # the compile went through the NVRTC loaded first
    assert before == after == "UTF-8" and child == "2.5 µs × 4", r.stdout


def test_older_nvrtc_without_headers_says_what_to_install(monkeypatch):
    import cuda.pathfinder

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", lambda name: None)
    with pytest.raises(BackendUnavailable) as err:
        cuda_backend.header_options("inc", version=(12, 8))
    assert "NVRTC 12.8" in err.value.problem and "nvidia-cuda-runtime-cu12" in err.value.fix
    assert cuda_backend.header_options("inc", version=(13, 5))["use_bundled_headers"]


def test_a_source_that_does_not_compile_is_one_line(tmp_path, monkeypatch):
    broken = tmp_path / "cuda"
    broken.mkdir()
    for f in cuda_dir().iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    with open(broken / "merge_partials.cu", "a") as f:
        f.write("this is not c++;\n")
    monkeypatch.setenv("XBENCH_CUDA_DIR", str(broken))
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(BackendUnavailable) as err:
        compile_source("merge_partials.cu", "sm_90")
    assert "\n" not in str(err.value) and "merge_partials.cu(" in err.value.problem


def test_backend_says_why_it_cannot_run_here():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(BackendUnavailable) as err:
        get_backend("cuda-ref")
    assert "\n" not in str(err.value) and "CUDA" in str(err.value)
    for name in ("flashmla", "flashinfer"):
        with pytest.raises(BackendUnavailable):
            get_backend(name)


def _signature_lengths() -> dict[str, int]:
    """Parameter count of every extern "C" kernel, read from the sources."""
    counts = {}
    for source in SOURCES:
        text = (cuda_dir() / source).read_text()
        text = re.sub(
            r"#ifdef XBENCH_WITH_NVSHMEM.*?#endif", "", text, flags=re.S
        )  # needs NVSHMEM's headers
        for m in re.finditer(
            r'extern "C" __global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)',
            text,
            re.S,
        ):
            counts[m.group(1)] = len([p for p in m.group(2).split(",") if p.strip()])
    return counts


class _Recorder(CudaBackend):
    """The backend up to the launch call: argument packing without a driver (CPU tensors
    stand in for device ones, so the device check is off unless a test turns it on)."""

    def __init__(self, check_device=False):
        self.calls = []
        if not check_device:
            self._on_gpu = lambda *tensors: None

    def _launch(self, name, grid, block, *args):
        self.calls.append((name, grid, block, args))


def test_launch_arguments_match_kernel_signatures():
    counts = _signature_lengths()
    assert set(counts) == {k for names in KERNELS.values() for k in names}
    backend = _Recorder()
    q = torch.randn(3, 8, 576, dtype=torch.bfloat16)
    cache = torch.randn(10, 64, 576, dtype=torch.bfloat16)
    backend.partial_attention(q, cache, random_topk(640, 100, 3), 0.1, 512)
    backend.partial_attention(q.float(), cache.float(), DensePages(torch.arange(4), 200), 0.1, 512)
    backend.merge_partials(torch.zeros(2, 3, 8, 512), torch.zeros(2, 3, 8))
    backend.gather_kv(cache, torch.arange(50))
    backend.splice_kv(cache, torch.zeros(70, 576, dtype=torch.bfloat16), [1, 2], 5)
    names = [c[0] for c in backend.calls]
    assert names == [
        "mla_partial_attention_bf16",
        "mla_partial_attention_f32",
        "merge_partials_f32",
        "gather_kv_bf16",
        "splice_kv_bf16",
    ]
    for name, grid, block, args in backend.calls:
        assert len(args) == counts[name], name
        assert all(isinstance(a, (int, np.integer, np.floating)) for a in args)
        assert not any(isinstance(a, float) for a in args)  # Python floats would pass as doubles
        assert 0 < block <= 1024 and all(g > 0 for g in grid)
    assert backend.calls[0][1] == (8, 3)  # one block per (head, row)


def test_cpu_tensors_are_refused_before_a_launch():
    """Host pointers in a kernel faulted the H100 (CUDA_ERROR_ILLEGAL_ADDRESS, and every
    later call of the process with it) when gpu_kernels.py ran with --device cpu there."""
    backend = _Recorder(check_device=True)
    q = torch.randn(1, 8, 576, dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 576, dtype=torch.bfloat16)
    calls = (
        lambda: backend.partial_attention(q, cache, torch.arange(10), 0.1, 512),
        lambda: backend.merge_partials(torch.zeros(2, 1, 8, 512), torch.zeros(2, 1, 8)),
        lambda: backend.gather_kv(cache, torch.arange(10)),
        lambda: backend.splice_kv(cache, torch.zeros(10, 576, dtype=torch.bfloat16), [1], 0),
    )
    for call in calls:
        with pytest.raises(BackendUnavailable, match="take CUDA tensors, not cpu ones"):
            call()
    assert backend.calls == []


# ---- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda-ref", "triton", "flashmla", "flashinfer"])
def test_gpu_backends_match_torch_reference(backend):
    try:
        impl = get_backend(backend)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 16, 576, generator=gen).bfloat16().cuda()
    cache = torch.randn(64, 64, 576, generator=gen).bfloat16().cuda()
    sel = DensePages(torch.randperm(64, generator=gen)[:20], 20 * 64 - 9)
    scale = 1 / math.sqrt(576)
    out, lse = impl.partial_attention(q, cache, sel, scale, 512)
    ref_out, ref_lse = get_backend("torch").partial_attention(
        q.double().cpu(), cache.double().cpu(), sel, scale, 512
    )
    err = (out.double().cpu() - ref_out.double()).abs()
    assert (err <= 8e-4 + 1.6e-2 * ref_out.double().abs()).all()
    assert torch.allclose(lse.double().cpu(), ref_lse.double(), rtol=1.2e-4)


@pytest.mark.gpu
def test_cuda_sparse_merge_gather_splice_on_gpu():
    try:
        impl = get_backend("cuda-ref")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    ref = get_backend("torch")
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 8, 576, generator=gen).cuda()
    cache = torch.randn(20, 64, 576, generator=gen).cuda()
    idx = random_topk(20 * 64, 200, 3, generator=gen)
    idx[1, 150:] = -1
    out, lse = impl.partial_attention(q, cache, idx, 0.05, 512)
    r_out, r_lse = ref.partial_attention(q.cpu(), cache.cpu(), idx, 0.05, 512)
    assert torch.allclose(out.cpu(), r_out, rtol=1e-4, atol=1e-5) and torch.allclose(
        lse.cpu(), r_lse, rtol=1e-5
    )
    m_out, m_lse = impl.merge_partials(torch.stack([out, out]), torch.stack([lse, lse]))
    assert torch.allclose(m_out, out, rtol=1e-5, atol=1e-6) and torch.allclose(
        m_lse, lse + math.log(2), rtol=1e-6
    )
    packed = impl.gather_kv(cache, idx[0])
    assert torch.equal(packed.cpu(), ref.gather_kv(cache.cpu(), idx[0]))
    dst_gpu, dst_cpu = torch.zeros_like(cache), torch.zeros_like(cache).cpu()
    impl.splice_kv(dst_gpu, packed, [3, 4, 9, 11], 77)
    ref.splice_kv(dst_cpu, packed.cpu(), [3, 4, 9, 11], 77)
    assert torch.equal(dst_gpu[..., :-64].cpu(), dst_cpu[..., :-64])
    assert torch.allclose(dst_gpu.cpu(), dst_cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_triton_combine_launched_dependent_on_the_split_kernel_gives_the_same_bits():
    """Programmatic dependent launch (``triton_mla.COMBINE_PDL``): the combine starts while
    the split kernel runs and waits in the GPU for its partials. Eagerly and replayed from a
    CUDA graph, at one row x 32K tokens (64 splits, the shape it is for), the output and LSE
    are those of the combine launched after the split kernel, bit for bit. Two queries
    alternate, so the partial buffers (reused by the caching allocator, and by a graph's
    replays) hold the other query's partials when a call starts: a combine that read a
    partial before the split kernel wrote it would give the other query's answer."""
    from xbench.kernels.triton_backend import pdl_unavailable

    try:
        impl = get_backend("triton")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    why_not = pdl_unavailable(torch, torch.device("cuda"))
    if why_not:
        pytest.skip(why_not)
    gen = torch.Generator().manual_seed(3)
    queries = [torch.randn(1, 128, 576, generator=gen).bfloat16().cuda() for _ in range(2)]
    cache = torch.randn(512, 64, 576, generator=gen).bfloat16().cuda()
    sel = DensePages(torch.randperm(512, generator=gen).int(), 512 * 64)
    scale = 1 / math.sqrt(576)
    after = [impl.partial_attention(q, cache, sel, scale, 512, pdl=False) for q in queries]
    assert "pdl" not in impl.last_plan and "combine" in impl.last_plan
    assert not torch.equal(after[0][0], after[1][0])
    for k in (0, 1, 0, 1):  # each call after the other query's
        dependent = impl.partial_attention(queries[k], cache, sel, scale, 512, pdl=True)
        assert impl.last_plan.endswith(" pdl"), impl.last_plan
        assert all(torch.equal(a, d) for a, d in zip(after[k], dependent, strict=True))
    q = queries[0].clone()  # the graph's input, rewritten before each replay
    out, lse = torch.empty_like(after[0][0]), torch.empty_like(after[0][1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm outside the capture: the tuner has run already
        impl.partial_attention(q, cache, sel, scale, 512, out=out, lse=lse, pdl=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        impl.partial_attention(q, cache, sel, scale, 512, out=out, lse=lse, pdl=True)
    for k in (1, 0, 1, 0):
        q.copy_(queries[k])
        out.zero_()
        lse.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, after[k][0]) and torch.equal(lse, after[k][1])


@pytest.mark.gpu
def test_triton_page_lookahead_gives_the_same_bits_on_the_tensor_cores():
    """The preferred tile with its page lookahead (a candidate ``triton_mla.GPU_TILES``
    holds) computes what the tile without it computes, bit for bit: one row of 128 heads
    over 64 and 3 splits, 64 rows in one split, pages out of order and a last page partly
    used (a partial tile read through pointers after the copied ones)."""
    from xbench.kernels import triton_mla

    try:
        impl = get_backend("triton")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    plain, ahead = triton_mla.GPU_TILES[0], (*triton_mla.GPU_TILES[0][:5], 1)
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(160, 64, 576, generator=gen).bfloat16().cuda()
    sel = DensePages(torch.randperm(160, generator=gen).int(), 160 * 64 - 37)
    scale = 1 / math.sqrt(576)
    for rows, splits in ((1, 64), (1, 3), (64, 1)):
        q = torch.randn(rows, 128, 576, generator=gen).bfloat16().cuda()
        want = impl.partial_attention(q, cache, sel, scale, 512, splits=splits, tile=plain)
        assert " la," not in impl.last_plan, impl.last_plan
        got = impl.partial_attention(q, cache, sel, scale, 512, splits=splits, tile=ahead)
        assert " la," in impl.last_plan, impl.last_plan
        assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True)), (rows, splits)
