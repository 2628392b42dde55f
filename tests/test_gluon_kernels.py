"""The gluon backend: which calls its warp-specialized kernel takes, and its bits on a GPU.

Gluon has no interpreter: on a CPU the backend runs the triton backend's kernels and says
so in its plan; the kernel's numerics are checked on a Hopper GPU (``gpu`` tests, run by
gpu_check's ``gluon`` step in a process of their own: a kernel whose barriers deadlock would
stop only that step). Its compile facts: tests/test_gluon_sm90.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_kernels import BS, D, assert_matches, make_cache, reference

from xbench.kernels import DensePages, backend

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

pytest.importorskip("triton.experimental.gluon", reason="this triton has no Gluon")

SCALE = 1 / math.sqrt(D)
HOPPER_BF16 = dict(
    device_type="cuda", capability=(9, 0), q_dtype="bfloat16", cache_dtype="bfloat16", page=64,
    n_selected=32768, cache_rows=1 << 20,
)  # fmt: skip


def _dense(pages: list[int], tokens: int, rows: int, heads: int, dtype, device, seed=0):
    """A query and a cache whose selected tokens hold random values and every other row NaN
    (the last page's rows past ``tokens`` among them)."""
    gen = torch.Generator().manual_seed(seed)
    sel = DensePages(torch.tensor(pages), tokens)
    token_rows = sel.token_indices(BS)
    cache = make_cache(max(pages) + 1, dtype, token_rows, gen)
    q = torch.randn(rows, heads, D, generator=gen).to(dtype)
    ref_out, ref_lse = reference(q, cache, [token_rows] * rows, SCALE)  # of the bf16 values
    return q.to(device), cache.to(device), sel, ref_out, ref_lse


def test_it_says_which_calls_its_kernel_does_not_take(monkeypatch):
    from xbench.kernels.gluon_backend import not_covered

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not_covered(**HOPPER_BF16) == ""
    reasons = {
        "device_type": ("cpu", "a cpu tensor"),
        "capability": ((10, 0), "Hopper's (compute capability 9.x), this GPU is 10.0"),
        "q_dtype": ("float32", "bf16 only, not float32 x bfloat16"),
        "page": (0, "token indices (a sparse selection)"),
        "n_selected": (0, "no token selected"),
        "cache_rows": (2**31, "TMA coordinates are int32"),
    }
    for field, (value, why) in reasons.items():
        assert why in not_covered(**{**HOPPER_BF16, field: value}), field
    assert "pages of 16 tokens" in not_covered(**{**HOPPER_BF16, "page": 16})
    assert not_covered(**{**HOPPER_BF16, "page": 128}) == ""  # two tiles a page
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not_covered(**HOPPER_BF16) == "Gluon has no interpreter"


def test_a_kernel_it_does_not_have_is_refused_in_one_line(monkeypatch):
    from xbench.kernels.gluon_backend import KERNELS, kernel_name

    monkeypatch.delenv("XBENCH_GLUON_KERNEL", raising=False)
    assert kernel_name() == "scorer" == next(iter(KERNELS))  # the default
    for name in KERNELS:
        monkeypatch.setenv("XBENCH_GLUON_KERNEL", name)
        assert kernel_name() == name
    monkeypatch.setenv("XBENCH_GLUON_KERNEL", "fast")
    with pytest.raises(backend.BackendUnavailable) as err:
        kernel_name()
    assert str(err.value).count("\n") == 0
    assert "XBENCH_GLUON_KERNEL=fast names no kernel" in err.value.problem
    assert "scorer, overlap" in err.value.fix


def test_where_it_cannot_run_it_says_so_in_its_own_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend.get_backend.cache_clear()
    try:
        with pytest.raises(backend.BackendUnavailable) as err:
            backend.get_backend("gluon")
    finally:
        backend.get_backend.cache_clear()
    assert err.value.problem == "gluon: no CUDA device here", err.value.problem
    assert "TRITON_INTERPRET=1" in err.value.fix


def test_its_grid_is_64_row_tiles_by_splits():
    from xbench.kernels.gluon_backend import launch_shape

    assert launch_shape(128, 64) == (2, 64)
    assert launch_shape(65, 1) == (2, 1)
    assert launch_shape(64 * 128, 1) == (128, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's fallback, on a CPU")
def test_without_its_kernel_it_is_the_triton_backend_and_says_so():
    backend.get_backend.cache_clear()
    gluon, triton = backend.get_backend("gluon"), backend.get_backend("triton")
    q, cache, sel, ref_out, ref_lse = _dense([3, 0, 2], 2 * BS + 5, 2, 4, torch.bfloat16, "cpu")
    out, lse = gluon.partial_attention(q, cache, sel, SCALE, 512)
    assert_matches(out, lse, ref_out, ref_lse, torch.bfloat16)
    plan = gluon.last_plan
    assert plan.startswith("triton (Gluon has no interpreter): tile "), plan
    same_out, same_lse = triton.partial_attention(q, cache, sel, SCALE, 512)
    assert torch.equal(out, same_out) and torch.equal(lse, same_lse)  # the same kernels
    assert plan.endswith(triton.last_plan)


# ---- on a GPU ---------------------------------------------------------------------------


@pytest.fixture(params=["scorer", "overlap"])
def kernel(request, monkeypatch):
    """Each of the backend's split kernels (``XBENCH_GLUON_KERNEL``)."""
    monkeypatch.setenv("XBENCH_GLUON_KERNEL", request.param)
    return request.param


def _gluon_or_skip():
    try:
        impl = backend.get_backend("gluon")
    except backend.BackendUnavailable as exc:
        pytest.skip(str(exc))
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"the warp-specialized kernel is Hopper's; this GPU is {major}.{minor}")
    return impl


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rows, heads, pages, tokens",
    [
        (4, 16, [5, 0, 19, 3, 7, 1, 12, 2], 8 * BS - 9),  # pages out of order, a partial last tile
        (1, 128, list(range(128)), 128 * BS),  # one decode row over many splits
        (1, 128, list(range(130))[::-1], 129 * BS + 1),  # one valid token in the last tile
        (64, 128, list(range(16)), 16 * BS - 31),  # 8,192 query rows, one split
        (3, 16, [0], 1),  # one token
    ],
)
def test_its_kernels_match_the_float64_reference_on_hopper(kernel, rows, heads, pages, tokens):
    impl = _gluon_or_skip()
    q, cache, sel, ref_out, ref_lse = _dense(pages, tokens, rows, heads, torch.bfloat16, "cuda")
    out, lse = impl.partial_attention(q, cache, sel, SCALE, 512)
    assert impl.last_plan.startswith(f"gluon {kernel} 64x64"), impl.last_plan
    assert_matches(out.cpu(), lse.cpu(), ref_out, ref_lse, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3])
def test_its_kernels_write_the_callers_bf16_output_as_the_triton_backend(kernel, splits):
    """Into the caller's bf16 buffers (one split: the kernel's own rounding; several: the
    combine's), and replayed from a CUDA graph as the benchmarks time it."""
    impl = _gluon_or_skip()
    triton = backend.get_backend("triton")
    q, cache, sel, ref_out, ref_lse = _dense(
        list(range(40)), 40 * BS - 3, 2, 128, torch.bfloat16, "cuda", seed=1
    )
    out = torch.empty(2, 128, 512, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(2, 128, device="cuda")
    impl.partial_attention(q, cache, sel, SCALE, 512, out=out, lse=lse, splits=splits)
    assert impl.last_plan.startswith(f"gluon {kernel} "), impl.last_plan
    assert f"{splits} split" in impl.last_plan
    want_out, want_lse = triton.partial_attention(q, cache, sel, SCALE, 512, splits=splits)
    # the same attention within a bf16 rounding of the output (the products' orders differ)
    assert torch.allclose(out.float(), want_out, rtol=1.6e-2, atol=8e-4)
    assert torch.allclose(lse, want_lse, rtol=1.2e-4)
    graph = torch.cuda.CUDAGraph()
    replayed = torch.empty_like(out)
    with torch.cuda.graph(graph):
        impl.partial_attention(q, cache, sel, SCALE, 512, out=replayed, lse=lse, splits=splits)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, out)
