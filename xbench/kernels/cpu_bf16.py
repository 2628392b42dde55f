"""bf16 x bf16 -> fp32 scores on CPUs with AVX512-BF16 (``cpu_bf16.c``), built with gcc.

Used by the torch backend for the score product when the cache is bf16, the CPU has
``avx512_bf16`` and there are enough query rows to amortise packing the keys; everything
else keeps torch's fp32 path. Threads: row ranges on ``torch.get_num_threads()`` Python
threads (ctypes releases the GIL), so no second OpenMP runtime enters torch's process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_bf16.c")
MIN_ROWS = 128  # below this torch's fp32 matmul is as fast (measured)
KEY_BLOCK = 256  # KB in cpu_bf16.c


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

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = cache_dir() / f"xbench-bf16-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
        os.close(fd)
        built = subprocess.run(
            ["gcc", "-O3", "-mavx512f", "-mavx512bf16", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, target)
    lib = ctypes.CDLL(str(target))
    vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.xb_pack_keys.argtypes = [vp, i, i, vp]
    lib.xb_pack_keys.restype = None
    lib.xb_scores_rows.argtypes = [vp, vp, vp, i, i, i, i, f]
    lib.xb_scores_rows.restype = None
    return lib


@lru_cache(maxsize=4)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="xbench-bf16")


def scores(q, keys, scale: float):
    """fp32 [L, S] = scale * q [L, D] @ keys [S, D]^T for bf16 CPU tensors; None if unavailable."""
    import torch

    lib = load()
    L, D = q.shape
    S = keys.shape[0]
    if lib is None or L < MIN_ROWS or S == 0 or D % 2:
        return None
    q, keys = q.contiguous(), keys.contiguous()
    blocks = -(-S // KEY_BLOCK)
    packed = torch.empty(blocks * (D // 2) * KEY_BLOCK, dtype=torch.int32)
    lib.xb_pack_keys(keys.data_ptr(), S, D, packed.data_ptr())
    out = torch.empty(L, S, dtype=torch.float32)
    threads = max(1, min(torch.get_num_threads(), L // 6))
    step = -(-L // threads)
    jobs = [(lo, min(L, lo + step)) for lo in range(0, L, step)]
    args = (q.data_ptr(), packed.data_ptr(), out.data_ptr())
    if len(jobs) == 1:
        lib.xb_scores_rows(*args, 0, L, S, D, scale)
    else:
        list(
            _pool(len(jobs)).map(
                lambda job: lib.xb_scores_rows(*args, job[0], job[1], S, D, scale), jobs
            )
        )
    return out
