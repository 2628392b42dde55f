"""bf16 MLA partial attention on CPUs with AVX512-BF16 (``cpu_bf16.c``), built with gcc;
the same library merges partial results in one pass (:func:`merge`).

Used by the torch backend when the cache is bf16, the CPU has ``avx512_bf16`` and a group
has at least ``MIN_ROWS`` query rows; everything else keeps torch's fp32 path. Both
products accumulate in fp32 (torch's CPU bf16 matmul rounds its output to bf16), the
probabilities enter the second product in bf16 as in FlashMLA, and selected cache rows are
read in place (no gathered copy of a sparse selection). Threads: OpenMP in the C code, on torch's own runtime: torch has loaded its
``libgomp.so.1`` before this library, so ours resolves to it and the two share one thread
pool. (Python threads around a ctypes call, tried first, raced torch's spinning OpenMP
workers for the two cores and lost half the rate.) Where a second OpenMP runtime would be
loaded (a torch built with another one), the kernel is not used.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_bf16.c")
# below 4 rows the fp32 path is as fast (too few rows to fill the bf16 dot products' panels)
MIN_ROWS = 4
PANEL = 32  # NR in cpu_bf16.c
ROW_BLOCK = 64  # RB in cpu_bf16.c
ISA_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma")
# Which CPU path bf16 attention, merge and splice take (``--cpu-attention``, inherited by
# launched ranks through the environment): "c-bf16" this library, "torch" torch's fp32
# products, "auto" this library where the CPU and gcc allow it.
CPU_PATHS = ("auto", "c-bf16", "torch")
PATH_ENV = "XBENCH_CPU_ATTENTION"


def requested_path() -> str:
    if os.environ.get("XBENCH_NO_BF16_KERNEL"):  # the older switch, kept
        return "torch"
    return os.environ.get(PATH_ENV, "auto") or "auto"


def unavailable_because() -> str | None:
    """Why this library cannot run here (None where it can)."""
    if not cpu_has_bf16():
        return "this CPU has no AVX512-BF16"
    if shutil.which("gcc") is None:
        return "gcc is not on PATH to build it"
    return None


def choose_path(path: str) -> str:
    """Select the CPU attention path for this process and the ranks it launches.

    Returns the path that will run (c-bf16 or torch); raises ValueError naming why a
    requested c-bf16 cannot run here.
    """
    if path not in CPU_PATHS:
        raise ValueError(f"unknown CPU attention path {path!r}; pick {', '.join(CPU_PATHS)}")
    if path == "c-bf16" and unavailable_because():
        raise ValueError(f"--cpu-attention c-bf16: {unavailable_because()}")
    os.environ[PATH_ENV] = path
    os.environ.pop("XBENCH_NO_BF16_KERNEL", None)
    load.cache_clear()
    return active_path()


def active_path() -> str:
    """The path bf16 work takes in this process: c-bf16 (from MIN_ROWS query rows) or torch."""
    return "c-bf16" if load() is not None else "torch"


def cpu_has_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where the CPU or the compiler cannot provide it."""
    if requested_path() == "torch" or unavailable_because():
        return None
    from xbench.native import cache_dir

    flags = [*ISA_FLAGS, "-fopenmp"]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"xbench-bf16-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
        os.close(fd)
        built = subprocess.run(
            [
                "gcc",
                "-O3",
                *flags,
                "-shared",
                "-fPIC",
                "-o",
                tmp,
                str(SOURCE),
            ],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, target)
    import torch  # noqa: F401 - its libgomp.so.1 must be the one ours resolves to

    lib = ctypes.CDLL(str(target))
    if len(_openmp_runtimes()) > 1:
        return None
    vp, i, f, lg = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
    lib.xb_pack_kv.argtypes = [vp, vp, lg, i, i, i, vp, vp, i]
    lib.xb_pack_kv.restype = None
    lib.xb_scores.argtypes = [vp, vp, vp, i, i, i, f, i]
    lib.xb_scores.restype = None
    lib.xb_attention.argtypes = [vp, i, vp, vp, lg, i, i, i, f, vp, vp, vp, vp, vp, i, vp, i]
    lib.xb_attention.restype = None
    lib.xb_merge.argtypes = [vp, vp, i, lg, i, vp, vp, i]
    lib.xb_merge.restype = None
    lib.xb_merge_parts.argtypes = [vp, vp, vp, i, lg, i, vp, vp, i]
    lib.xb_merge_parts.restype = None
    lib.xb_splice.argtypes = [vp, vp, i, vp, lg, i, i, vp, ctypes.c_double]
    lib.xb_splice.restype = None
    return lib


def _openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    names = ("libgomp", "libiomp", "libomp.so")
    return {line.split()[-1] for line in maps if any(n in line for n in names)}


def usable(rows: int, dim: int, v_dim: int) -> bool:
    """Whether the kernel takes this shape on this machine (rows: query rows of one group)."""
    return (
        load() is not None
        and rows >= MIN_ROWS
        and dim % 2 == 0
        and v_dim % 32 == 0
        and v_dim <= dim
    )


def _threads(rows: int) -> int:
    import torch

    return max(1, min(torch.get_num_threads(), -(-rows // ROW_BLOCK)))


def _pack_threads(tokens: int) -> int:
    import torch

    return max(1, min(torch.get_num_threads(), tokens // (4 * PANEL)))


def scores(q, keys, scale: float):
    """fp32 [L, S] = scale * q [L, D] @ keys [S, D]^T for bf16 CPU tensors; None if unavailable.

    The first product alone, so tests and diagnostics can check it in isolation.
    """
    import torch

    (L, D), S = q.shape, keys.shape[0]
    if not usable(L, D, 32) or S == 0:
        return None
    q, keys = q.contiguous(), keys.contiguous()
    lib = load()
    packed = torch.empty(-(-S // PANEL) * (D // 2) * PANEL, dtype=torch.int32)
    lib.xb_pack_kv(keys.data_ptr(), None, 0, S, D, 0, packed.data_ptr(), None, _pack_threads(S))
    out = torch.empty(L, S, dtype=torch.float32)
    lib.xb_scores(q.data_ptr(), packed.data_ptr(), out.data_ptr(), L, S, D, scale, _threads(L))
    return out


def attention(
    q,
    cache_rows,
    scale: float,
    v_dim: int,
    *,
    index=None,
    start: int = 0,
    count=None,
    out=None,
    lse=None,
):
    """Attention of q [L, D] over rows of ``cache_rows`` [N, D], both bf16 on the CPU.

    The rows are ``index`` (an int64 tensor of row numbers: a sparse selection, read in
    place) or ``start .. start + count``. Returns (out [L, v_dim] fp32, lse [L] fp32), or
    None where the kernel does not take the shape. At least one row must be selected.
    ``out`` (contiguous [L, v_dim], fp32 or bf16) and ``lse`` (contiguous [L] fp32), when
    given, receive the result: a holder writes its partial straight into the message it
    returns, in the wire dtype, with no conversion pass.
    """
    import torch

    L, D = q.shape
    if not usable(L, D, v_dim) or not cache_rows.is_contiguous():
        return None
    n_rows = cache_rows.shape[0]
    if index is not None:
        index = index.to(torch.int64).contiguous()
        S = index.numel()
        if S and (int(index.min()) < 0 or int(index.max()) >= n_rows):
            raise IndexError(f"token index out of range for a cache of {n_rows} tokens")
    else:
        S = n_rows - start if count is None else count
        if start < 0 or start + S > n_rows:
            raise IndexError(f"tokens {start}..{start + S} outside a cache of {n_rows} tokens")
    if S <= 0:
        raise ValueError("attention over an empty selection: the caller returns -inf LSE")
    q = q.contiguous()
    threads = _threads(L)
    S2 = -(-S // 2)
    kp = torch.empty(-(-S // PANEL) * (D // 2) * PANEL, dtype=torch.int32)
    vp = torch.empty(v_dim * S2, dtype=torch.int32)
    sc = torch.empty(threads * ROW_BLOCK * S, dtype=torch.float32)
    pb = torch.empty(threads * ROW_BLOCK * 2 * S2, dtype=torch.bfloat16)
    if out is None:
        out = torch.empty(L, v_dim, dtype=torch.float32)
    if lse is None:
        lse = torch.empty(L, dtype=torch.float32)
    if (
        out.shape != (L, v_dim)
        or out.dtype not in (torch.float32, torch.bfloat16)
        or not out.is_contiguous()
        or lse.shape != (L,)
        or lse.dtype != torch.float32
        or not lse.is_contiguous()
    ):
        raise ValueError(
            f"out must be contiguous [{L}, {v_dim}] fp32 or bf16 and lse contiguous [{L}] fp32"
        )
    load().xb_attention(
        q.data_ptr(),
        L,
        cache_rows.data_ptr(),
        None if index is None else index.data_ptr(),
        start,
        S,
        D,
        v_dim,
        scale,
        kp.data_ptr(),
        vp.data_ptr(),
        sc.data_ptr(),
        pb.data_ptr(),
        out.data_ptr(),
        out.dtype == torch.bfloat16,
        lse.data_ptr(),
        threads,
    )
    return out, lse


MERGE_PARALLEL = 1 << 16  # output elements from which the merge uses torch's threads


def merge(outs, lses):
    """Combine partials (outs [P, ..., V], lses [P, ...]) in one C pass; None if unavailable.

    torch's CPU merge is a dozen small operators of 4-8 us dispatch each: 37 us for one row
    of 16 heads here, more than the arithmetic by far, and more again inside a routed query
    whose attention has just evicted the operators' code. Same result to fp32 rounding.
    """
    import torch

    lib = load()
    if lib is None or outs.device.type != "cpu" or outs.dim() < 2:
        return None
    if outs.dtype is not torch.float32 or not outs.is_contiguous():
        outs = outs.float().contiguous()
    if lses.dtype is not torch.float32 or not lses.is_contiguous():
        lses = lses.float().contiguous()
    shape = outs.shape
    P, V = shape[0], shape[-1]
    R = lses.numel() // P
    if lses.numel() != P * R or outs.numel() != P * R * V:
        return None
    out = torch.empty(shape[1:], dtype=torch.float32)
    lse = torch.empty(shape[1:-1], dtype=torch.float32)
    threads = 1 if R * V < MERGE_PARALLEL else max(1, min(torch.get_num_threads(), R))
    lib.xb_merge(outs.data_ptr(), lses.data_ptr(), P, R, V, out.data_ptr(), lse.data_ptr(), threads)
    return out, lse


def merge_parts(outs, lses):
    """:func:`merge` of partials given as sequences (outs[p] [..., V] fp32 or bf16, lses[p]
    [...] fp32), each read where it lies: a received bf16 partial straight from its message,
    the local fp32 one from where attention left it. None if unavailable or mismatched.
    """
    import torch

    lib = load()
    if lib is None or len(outs) != len(lses) or not outs:
        return None
    shape = outs[0].shape
    V = shape[-1]
    for o, s in zip(outs, lses, strict=True):
        if (
            o.device.type != "cpu"
            or o.shape != shape
            or s.shape != shape[:-1]
            or o.dtype not in (torch.float32, torch.bfloat16)
            or s.dtype != torch.float32
            or not (o.is_contiguous() and s.is_contiguous())
        ):
            return None
    P, R = len(outs), outs[0].numel() // V
    out = torch.empty(shape, dtype=torch.float32)
    lse = torch.empty(shape[:-1], dtype=torch.float32)
    threads = 1 if R * V < MERGE_PARALLEL else max(1, min(torch.get_num_threads(), R))
    ptrs = (ctypes.c_void_p * P)(*(o.data_ptr() for o in outs))
    bf16 = (ctypes.c_int * P)(*(o.dtype == torch.bfloat16 for o in outs))
    lse_ptrs = (ctypes.c_void_p * P)(*(s.data_ptr() for s in lses))
    lib.xb_merge_parts(ptrs, bf16, lse_ptrs, P, R, V, out.data_ptr(), lse.data_ptr(), threads)
    return out, lse


def splice(kv_cache, packed, pages, freqs, shift: int, rope_dim: int) -> bool:
    """The splice in one C pass (see ``xb_splice``); False where it does not apply.

    ``pages``: int64 numpy array of the free pages used, in order, already bounds-checked;
    ``freqs``: the RoPE frequencies (rope_dim / 2 of them); ``shift``: positions moved.
    torch's version (an index_put per part, a rotation in seven operators) took 173 us for
    256 tokens here, 7x the time to move its bytes.
    """
    import torch

    lib = load()
    if (
        lib is None
        or kv_cache.dtype != torch.bfloat16
        or packed.dtype != torch.bfloat16
        or kv_cache.device.type != "cpu"
        or packed.device.type != "cpu"
        or not (kv_cache.is_contiguous() and packed.is_contiguous())
        or rope_dim % 2
        or rope_dim > packed.shape[1]
        or freqs.numel() != rope_dim // 2
    ):
        return False
    freqs = freqs.to(dtype=torch.float64, device="cpu").contiguous()
    block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
    lib.xb_splice(
        kv_cache.data_ptr(),
        pages.ctypes.data,
        block_size,
        packed.data_ptr(),
        packed.shape[0],
        dim,
        rope_dim,
        freqs.data_ptr(),
        float(shift),
    )
    return True
