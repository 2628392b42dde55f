"""The ``mpi --device cuda`` transport: CUDA-aware MPI, the compiled loop handed device
pointers.

Whether the MPI can take device pointers is asked of the MPI itself, not assumed: Open MPI
answers ``MPIX_Query_cuda_support()`` (mpi-ext.h), MPICH ``MPIX_GPU_query_support(
MPIX_GPU_SUPPORT_CUDA, &flag)``; an MPI that says no, or offers neither query, is refused in
one line before any device pointer reaches it (Debian's Open MPI 4.1, not built for CUDA,
killed both ranks with SIGSEGV). Each rank drives the GPU of its local rank. Needs a GPU;
the check and the refusals are tested with fakes of the MPI library.
"""

from __future__ import annotations

import ctypes
import os

from xbench.errors import XbenchError
from xbench.fabric.gpu import local_gpu, torch_module
from xbench.fabric.mpi_host import MpiHostTransport

MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's mpi_proto.h / mpix.h
ASSUME_ENV = "XBENCH_ASSUME_CUDA_AWARE"  # for an MPI that is CUDA-aware but offers no query


def _libmpi_paths() -> list[str]:
    """The MPI libraries this process has mapped (after mpi4py loaded one)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "/libmpi." in line})
    except OSError:
        return []


def _libmpi_symbol(name: str):
    """A function of the MPI library mpi4py loaded, or None.

    Looked up in that library itself: mpi4py loads it without RTLD_GLOBAL, so the process's
    global namespace (``CDLL(None)``) does not show its symbols (both PyPI wheels' queries
    were invisible that way)."""
    try:
        from mpi4py import MPI  # noqa: F401 - loads and initialises the library
    except ImportError:
        return None
    for path in [*_libmpi_paths(), None]:
        try:
            return getattr(ctypes.CDLL(path), name)
        except (AttributeError, OSError):
            continue
    return None


def _mpi_started() -> bool:
    try:
        from mpi4py import MPI
    except ImportError:
        return False
    return MPI.Is_initialized() and not MPI.Is_finalized()


def cuda_aware_mpi(lookup=_libmpi_symbol) -> tuple[bool | None, str]:
    """(supported, how we know): True/False from the MPI's own query, None if it has none.

    Asked of a started MPI only: MPICH's ``MPIX_GPU_query_support`` aborts a process that
    has not called ``MPI_Init`` (``xbench env`` asks from a child that starts MPI)."""
    if lookup is _libmpi_symbol and not _mpi_started():
        return None, "MPI is not started in this process, so its CUDA query was not asked"
    query = lookup("MPIX_Query_cuda_support")
    if query is not None:
        query.argtypes, query.restype = [], ctypes.c_int
        answer = int(query())
        return bool(answer), f"MPIX_Query_cuda_support() = {answer}"
    query = lookup("MPIX_GPU_query_support")
    if query is not None:
        flag = ctypes.c_int(0)
        query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        query.restype = ctypes.c_int
        rc = int(query(MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag)))
        if rc != 0:
            return None, f"MPIX_GPU_query_support failed ({rc})"
        return bool(flag.value), f"MPIX_GPU_query_support(CUDA) = {flag.value}"
    return None, "the MPI offers neither MPIX_Query_cuda_support nor MPIX_GPU_query_support"


def require_cuda_aware(lookup=_libmpi_symbol, instead: str = "--device host") -> str:
    """One line refusing an MPI that cannot take device pointers; the evidence when it can.
    ``instead``: the caller's option that keeps device memory away from MPI."""
    supported, how = cuda_aware_mpi(lookup)
    if supported:
        return how
    if supported is None and os.environ.get(ASSUME_ENV) == "1":
        return f"{how}; assumed CUDA-aware ({ASSUME_ENV}=1)"
    if supported is None:
        raise XbenchError(
            f"cannot tell whether this MPI is CUDA-aware: {how}",
            f"use {instead}, or set {ASSUME_ENV}=1 if you know it is",
        )
    raise XbenchError(
        f"this MPI is not CUDA-aware ({how}): device buffers would crash it",
        f"use an MPI built with CUDA (e.g. Open MPI with UCX and CUDA), or {instead}",
    )


class MpiDeviceTransport(MpiHostTransport):
    """CUDA-aware MPI: the same compiled loops, handed device pointers."""

    device = "cuda"

    @staticmethod
    def setup_world(world_comm, cfg, plan) -> None:
        torch = torch_module()
        if not torch.cuda.is_available():
            raise XbenchError(
                "--device cuda needs CUDA GPUs, and torch sees none here",
                "run on GPU nodes, or use --device host",
            )
        require_cuda_aware()
        torch.cuda.set_device(local_gpu(world_comm))  # each rank its own GPU, by local rank

    def __init__(self, pair, plan, *, loop: str = "auto", seed: int = 0):
        super().__init__(pair, plan, loop=loop, seed=seed)
        if self.lib is None:
            raise XbenchError(
                "CUDA-aware MPI probes need the compiled loop",
                "install an MPI with mpicc, built with CUDA support",
            )

    def fetch(self, mode, k, block, iters):
        if mode == "packed":  # the C loop packs with memcpy, which device pointers crash
            raise XbenchError(
                "gather packed is not measured on device buffers (the pack would need a "
                "device copy kernel)",
                "probe gather on --device host, or read the messages and contiguous modes",
            )
        return super().fetch(mode, k, block, iters)

    def _buffer(self, nbytes, fill):
        torch = torch_module()
        return torch.full((max(int(nbytes), 1),), fill & 0xFF, dtype=torch.uint8, device="cuda")

    def _addr(self, buf, offset: int = 0) -> int:
        return buf.data_ptr() + offset
