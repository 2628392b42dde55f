"""The ``cuda-ref`` backend: CUDA C++ from ``cuda/*.cu``, compiled at run time through NVRTC.

A correctness reference, not a fast path: one thread block per (row, head) walks the whole
selection without tiles or tensor cores (on an H100 it ran 10-1,600x slower than the bound),
so ``xbench fit`` never takes its timings; the ``triton`` backend is the GPU's fast path.

Compilation needs no GPU: :func:`compile_sources` turns every source into a cubin for an
explicit architecture (``sm_90`` for H100/H200), cached by a hash of the sources and the
architecture. Loading and launching need the driver; :class:`CudaBackend` says in one line
why it cannot run when there is none. Kernels run on torch's current CUDA stream, with
torch tensors for memory.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np

from xbench.kernels.backend import BackendUnavailable, write_into

SOURCES = ("mla_partial_attention.cu", "merge_partials.cu", "gather_splice.cu", "probe_device.cu")
KERNELS = {
    "mla_partial_attention.cu": ("mla_partial_attention_bf16", "mla_partial_attention_f32"),
    "merge_partials.cu": ("merge_partials_f32",),
    "gather_splice.cu": ("gather_kv_bf16", "gather_kv_f32", "splice_kv_bf16", "splice_kv_f32"),
    "probe_device.cu": (
        "peer_pingpong",
        "peer_put_loop",
    ),  # nvshmem_* only with XBENCH_WITH_NVSHMEM
}
WARPS = 4  # must match cuda/mla_partial_attention.cu


def cuda_dir() -> Path:
    """The kernel sources: ``$XBENCH_CUDA_DIR``, else the ``cuda/`` folder xbench ships."""
    from xbench.resources import cuda_dir as shipped

    return Path(os.environ.get("XBENCH_CUDA_DIR") or shipped())


def _cache_path(source: str, arch: str) -> Path:
    from xbench.native import cache_dir

    folder = cuda_dir()
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith((".cu", ".cuh")):
            digest.update(name.encode() + (folder / name).read_bytes())
    digest.update(arch.encode())
    return cache_dir() / f"{Path(source).stem}-{arch}-{digest.hexdigest()[:16]}.cubin"


BUNDLED_HEADERS_NVRTC = (13, 3)  # cuda.core refuses use_bundled_headers on older NVRTC


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendUnavailable(f"nvrtcVersion failed: {err}", "pip install nvidia-cuda-nvrtc")
    return major, minor


def header_options(*include_path: str, version: tuple[int, int] | None = None) -> dict:
    """Where ``cuda_bf16.h`` comes from: NVRTC's bundled headers (NVRTC >= 13.3), else the
    CUDA runtime headers of a wheel or toolkit that cuda.pathfinder finds (older NVRTC, as in
    a CUDA 12.x or 13.0 image)."""
    version = version or nvrtc_version()
    if version >= BUNDLED_HEADERS_NVRTC:
        return {"use_bundled_headers": True, "include_path": list(include_path)}
    from cuda.pathfinder import find_nvidia_header_directory

    cudart = find_nvidia_header_directory("cudart")
    if cudart is None:
        major, minor = version
        raise BackendUnavailable(
            f"NVRTC {major}.{minor} has no bundled headers and no CUDA runtime headers were found",
            f"pip install nvidia-cuda-runtime-cu{major} (or set CUDA_HOME), or NVRTC >= 13.3",
        )
    return {"include_path": [*include_path, cudart]}


@contextmanager
def thread_locale_kept():
    """Put the calling thread's locale back after what NVRTC does to it: NVRTC 12.0 to 12.5
    leaves the thread in the C locale after a compile (12.0, 12.1, 12.2, 12.4 and 12.5 did
    here; 12.6, 12.8, 12.9 and 13.5 did not; NVIDIA/cuda-python#29). Python then reads and
    writes text as ASCII (open(), a child's output), so the first non-ASCII byte after a
    compile was a UnicodeDecodeError. A CUDA 12 build of torch loads its NVRTC on import,
    and cuda.bindings takes the one loaded. PyTorch restores the locale the same way."""
    uselocale = getattr(ctypes.CDLL(None), "uselocale", None)
    if uselocale is None:  # (no POSIX thread locales: nothing for NVRTC to change)
        yield
        return
    uselocale.restype = ctypes.c_void_p
    uselocale.argtypes = [ctypes.c_void_p]
    saved = uselocale(None)  # (0 asks, changing nothing)
    try:
        yield
    finally:
        if saved:
            uselocale(saved)


def compile_source(source: str, arch: str = "sm_90") -> bytes:
    """NVRTC-compile one source to a cubin (no GPU needed); cached on disk."""
    target = _cache_path(source, arch)
    if target.exists():
        return target.read_bytes()
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError as exc:
        raise BackendUnavailable(
            f"cuda.core is not importable ({exc})",
            "pip install cuda-core cuda-bindings nvidia-cuda-nvrtc",
        ) from None
    options = ProgramOptions(arch=arch, std="c++17", name=source, **header_options(str(cuda_dir())))
    program = Program((cuda_dir() / source).read_text(), code_type="c++", options=options)
    try:
        with thread_locale_kept():
            cubin = program.compile("cubin").code
    except Exception as exc:  # noqa: BLE001 - NVRTC's errors carry the compiler log
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else repr(exc))
        raise BackendUnavailable(
            f"NVRTC could not compile {source} for {arch}: {first}",
            "check the CUDA headers (xbench env) or set XBENCH_CUDA_DIR to intact sources",
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_bytes(cubin)
    os.replace(tmp, target)
    return cubin


def compile_sources(arch: str = "sm_90") -> dict[str, bytes]:
    return {source: compile_source(source, arch) for source in SOURCES}


class CudaBackend:
    """Loads the cubins on the current device and launches them on torch's stream."""

    name = "cuda-ref"
    last_plan = ""  # one block per head and row, nothing chosen per shape

    def __init__(self):
        try:
            import torch

            if not torch.cuda.is_available():
                raise BackendUnavailable(
                    "cuda backend: torch sees no CUDA device here",
                    "run on a machine with an NVIDIA GPU, or use --backend torch",
                )
            from cuda.core import Device, ObjectCode
        except ImportError as exc:
            raise BackendUnavailable(f"cuda backend: {exc}", "pip install cuda-core") from None
        try:
            self.device = Device(torch.cuda.current_device())
            self.device.set_current()
        except Exception as exc:  # noqa: BLE001 - the driver's own error types
            raise BackendUnavailable(
                f"cuda backend: no usable CUDA driver ({type(exc).__name__})",
                "run on a machine with an NVIDIA GPU",
            ) from None
        arch = f"sm_{self.device.arch}"
        self.kernels = {}
        for source, names in KERNELS.items():
            module = ObjectCode.from_cubin(compile_source(source, arch), name=source)
            for name in names:
                self.kernels[name] = module.get_kernel(name)

    @staticmethod
    def _on_gpu(*tensors) -> None:
        """Host pointers handed to a kernel fault the device (CUDA_ERROR_ILLEGAL_ADDRESS, and
        every later call in the process with it): CPU tensors are refused first."""
        found = {t.device.type for t in tensors if t is not None}
        if found - {"cuda"}:
            raise BackendUnavailable(
                f"cuda backend: its kernels take CUDA tensors, not {', '.join(sorted(found - {'cuda'}))} ones",
                "use --device cuda, or --backend torch for CPU tensors",
            )

    def _launch(self, name: str, grid, block: int, *args) -> None:
        import torch
        from cuda.core import LaunchConfig, launch

        stream = self.device.create_stream(torch.cuda.current_stream())
        launch(stream, LaunchConfig(grid=grid, block=block), self.kernels[name], *args)

    @staticmethod
    def _suffix(t) -> str:
        import torch

        if t.dtype == torch.bfloat16:
            return "bf16"
        if t.dtype == torch.float32:
            return "f32"
        raise TypeError(f"cuda backend supports bf16 and fp32, not {t.dtype}")

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        import torch

        from xbench.kernels.selection import token_indices

        self._on_gpu(q, kv_cache, out, lse)
        rows, heads, dim = q.shape
        idx = (
            token_indices(indices, kv_cache.shape[1])
            .to(device=q.device, dtype=torch.int64)
            .contiguous()
        )
        stride = 0 if idx.dim() == 1 else idx.shape[1]
        n_idx = idx.shape[-1]
        result = torch.empty(rows, heads, v_dim, device=q.device, dtype=torch.float32)
        result_lse = torch.empty(rows, heads, device=q.device, dtype=torch.float32)
        q, kv_cache = q.contiguous(), kv_cache.contiguous()
        self._launch(
            f"mla_partial_attention_{self._suffix(q)}",
            (heads, rows),
            WARPS * 32,
            q.data_ptr(),
            kv_cache.data_ptr(),
            idx.data_ptr(),
            np.int64(stride),
            np.int32(n_idx),
            np.int32(heads),
            np.int32(dim),
            np.int32(v_dim),
            np.float32(scale),
            result.data_ptr(),
            result_lse.data_ptr(),
        )
        return write_into(out, lse, (result, result_lse))

    def merge_partials(self, outs, lses):
        import torch

        self._on_gpu(outs, lses)
        parts, v_dim = outs.shape[0], outs.shape[-1]
        shape = outs.shape[1:-1]
        n = int(np.prod(shape))
        outs, lses = outs.float().contiguous(), lses.float().contiguous()
        out = torch.empty(*shape, v_dim, device=outs.device, dtype=torch.float32)
        lse = torch.empty(*shape, device=outs.device, dtype=torch.float32)
        self._launch(
            "merge_partials_f32",
            (n,),
            128,
            outs.data_ptr(),
            lses.data_ptr(),
            np.int32(parts),
            np.int64(n),
            np.int32(v_dim),
            out.data_ptr(),
            lse.data_ptr(),
        )
        return out, lse

    def gather_kv(self, kv_cache, indices, *, out=None):
        import torch

        from xbench.kernels.selection import token_indices

        self._on_gpu(kv_cache, out)
        dim = kv_cache.shape[-1]
        idx = (
            token_indices(indices, kv_cache.shape[1])
            .to(device=kv_cache.device, dtype=torch.int64)
            .flatten()
        )
        idx = idx[idx >= 0].contiguous()
        packed = torch.empty(len(idx), dim, device=kv_cache.device, dtype=kv_cache.dtype)
        if len(idx):
            self._launch(
                f"gather_kv_{self._suffix(kv_cache)}",
                (min(4096, (len(idx) * dim + 255) // 256),),
                256,
                kv_cache.data_ptr(),
                idx.data_ptr(),
                np.int64(len(idx)),
                np.int32(dim),
                packed.data_ptr(),
            )
        return packed if out is None else out.copy_(packed)

    def splice_kv(self, kv_cache, packed, free_pages, position_shift, rope_dim=64, freqs=None):
        import torch

        from xbench.kernels.rope import inv_freq, shift_on
        from xbench.kernels.selection import DensePages

        self._on_gpu(kv_cache, packed)
        block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
        n = packed.shape[0]
        pages = torch.as_tensor(free_pages, dtype=torch.int64)
        if len(pages) * block_size < n:
            raise ValueError(f"{n} tokens need {-(-n // block_size)} free pages, got {len(pages)}")
        dev = kv_cache.device
        slots = DensePages(pages, n).token_indices(block_size).to(dev).contiguous()
        # shift and frequencies made on the device, not copied there (a graph's capture
        # refuses host-to-device copies)
        shift = shift_on(position_shift, dev).expand(n).contiguous()
        freqs = (
            (inv_freq(rope_dim, device=dev) if freqs is None else freqs)
            .to(device=dev, dtype=torch.float64)
            .contiguous()
        )
        width = dim - rope_dim + rope_dim // 2
        if n:
            self._launch(
                f"splice_kv_{self._suffix(kv_cache)}",
                (min(4096, (n * width + 255) // 256),),
                256,
                kv_cache.data_ptr(),
                packed.contiguous().data_ptr(),
                slots.data_ptr(),
                shift.data_ptr(),
                freqs.data_ptr(),
                np.int64(n),
                np.int32(dim),
                np.int32(rope_dim),
            )
        return slots


@lru_cache(maxsize=1)
def nvrtc_status() -> str:
    """One line for ``xbench env``: can this machine compile the kernels for sm_90?"""
    try:
        sizes = {k: len(v) for k, v in compile_sources("sm_90").items()}
        return f"compiles {len(sizes)} sources to sm_90 cubins ({sum(sizes.values()) // 1024} KiB)"
    except Exception as exc:  # noqa: BLE001
        return f"cannot compile: {exc}"
