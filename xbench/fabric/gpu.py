"""What the device-buffer transports share: the rank's GPU, one GPU per rank, the timer.

The transports themselves are one file each: ``nccl.py`` (torch.distributed),
``nvshmem.py`` (nvshmem4py) and ``mpi_device.py`` (CUDA-aware MPI). Timing: CUDA events
on the transport's stream around the loop for device work, never host clocks around
asynchronous calls; device buffers are written before timing.
"""

from __future__ import annotations

import os
import socket
import time

from xbench.errors import XbenchError


def torch_module():
    import torch

    return torch


class DeviceTimer:
    """CUDA events for device work, perf_counter for synchronous CPU work."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def run(self, body) -> float:
        torch = torch_module()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            body()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        body()
        return time.perf_counter() - t0


def local_gpu(world_comm) -> int:
    """This rank's GPU: the launcher's local rank modulo the GPUs it sees."""
    torch = torch_module()
    local = int(
        os.environ.get("LOCAL_RANK")
        or os.environ.get("SLURM_LOCALID")
        or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        or os.environ.get("MPI_LOCALRANKID")
        or world_comm.Get_rank()
    )
    return local % max(torch.cuda.device_count(), 1)


def ranks_sharing_a_gpu(idents: list[tuple[str, str]]) -> list[int]:
    """World ranks whose (host, GPU UUID) another rank also holds, from an allgather."""
    return [r for r, ident in enumerate(idents) if idents.count(ident) > 1]


def claim_own_gpu(world_comm, gpu: int, transport: str, fix: str | None = None) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected") and NVSHMEM's host
    barriers refuse it ("limited MPG"); say so before either library starts. Compared by
    UUID, so ranks that each see one different GPU (srun --gpus-per-task=1) pass."""
    torch = torch_module()
    uuid = str(getattr(torch.cuda.get_device_properties(gpu), "uuid", gpu))
    host = socket.gethostname()
    shared = ranks_sharing_a_gpu(world_comm.allgather((host, uuid)))
    if shared:
        raise XbenchError(
            f"the {transport} transport needs one GPU per rank, and ranks {shared} share "
            f"a GPU ({torch.cuda.device_count()} visible on {host})",
            fix
            or "launch at most one rank per GPU (--np, or srun --gpus-per-task=1), "
            "or use --transport mpi",
        )
