"""bf16 scores and softmax on CPUs with AVX512-BF16 (``cpu_bf16.c``), built with gcc.

Used by the torch backend when the cache is bf16, the CPU has ``avx512_bf16`` and there
are enough query rows to amortise packing the keys; everything else keeps torch's fp32
path. Threads: OpenMP in the C code, on torch's own runtime: torch has loaded its
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
MIN_ROWS = (
    4  # 1-2 rows: the fp32 path is as fast; from 4 rows this kernel is 1.7-2.6x faster (measured)
)
PANEL = 32  # NR in cpu_bf16.c
ROW_BLOCK = 64  # RB in cpu_bf16.c
ISA_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma")


def cpu_has_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where the CPU or the compiler cannot provide it."""
    if os.environ.get("XBENCH_NO_BF16_KERNEL") or not cpu_has_bf16() or shutil.which("gcc") is None:
        return None
    from xbench.fabric.cloop import cache_dir

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
    vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.xb_pack_keys.argtypes = [vp, i, i, vp, i]
    lib.xb_pack_keys.restype = None
    lib.xb_scores.argtypes = [vp, vp, vp, i, i, i, f, i]
    lib.xb_scores.restype = None
    lib.xb_attend_rows.argtypes = [vp, vp, vp, vp, vp, vp, i, i, i, f, i]
    lib.xb_attend_rows.restype = None
    return lib


def _openmp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    names = ("libgomp", "libiomp", "libomp.so")
    return {line.split()[-1] for line in maps if any(n in line for n in names)}


def _usable(q, keys) -> bool:
    return q.shape[0] >= MIN_ROWS and keys.shape[0] > 0 and q.shape[1] % 2 == 0


def _packed(keys):
    import torch

    S, D = keys.shape
    packed = torch.empty(-(-S // PANEL) * (D // 2) * PANEL, dtype=torch.int32)
    threads = max(1, min(torch.get_num_threads(), S // (4 * PANEL)))
    load().xb_pack_keys(keys.data_ptr(), S, D, packed.data_ptr(), threads)
    return packed


def _threads(rows: int) -> int:
    import torch

    return max(1, min(torch.get_num_threads(), -(-rows // ROW_BLOCK)))


def scores(q, keys, scale: float):
    """fp32 [L, S] = scale * q [L, D] @ keys [S, D]^T for bf16 CPU tensors; None if unavailable."""
    import torch

    if load() is None or not _usable(q, keys):
        return None
    q, keys = q.contiguous(), keys.contiguous()
    (L, D), S = q.shape, keys.shape[0]
    out = torch.empty(L, S, dtype=torch.float32)
    packed = _packed(keys)
    load().xb_scores(q.data_ptr(), packed.data_ptr(), out.data_ptr(), L, S, D, scale, _threads(L))
    return out


def attend(q, keys, scale: float):
    """Softmax numerator and statistics of scale * q @ keys^T, or None if unavailable.

    Returns ``p`` [L, S] bf16 = exp(s - max) rounded to bf16, ``rowmax`` [L] and ``rowsum``
    [L] (fp32 sum of the unrounded exponentials), so out = (p @ V) / rowsum and
    lse = rowmax + log(rowsum).
    """
    import torch

    if load() is None or not _usable(q, keys):
        return None
    q, keys = q.contiguous(), keys.contiguous()
    (L, D), S = q.shape, keys.shape[0]
    threads = _threads(L)
    packed = _packed(keys)
    scratch = torch.empty(threads * ROW_BLOCK * S, dtype=torch.float32)
    p = torch.empty(L, S, dtype=torch.bfloat16)
    rowmax = torch.empty(L, dtype=torch.float32)
    rowsum = torch.empty(L, dtype=torch.float32)
    load().xb_attend_rows(
        q.data_ptr(),
        packed.data_ptr(),
        scratch.data_ptr(),
        p.data_ptr(),
        rowmax.data_ptr(),
        rowsum.data_ptr(),
        L,
        S,
        D,
        scale,
        threads,
    )
    return p, rowmax, rowsum
