"""The ``mpi --device cuda`` transport: CUDA-aware MPI, the compiled loop handed device
pointers.

Written from the MPI libraries' documentation; needs a CUDA-aware MPI and a GPU.
"""

from __future__ import annotations

from xbench.errors import XbenchError
from xbench.fabric.gpu import torch_module
from xbench.fabric.mpi_host import MpiHostTransport


class MpiDeviceTransport(MpiHostTransport):
    """CUDA-aware MPI: the same compiled loops, handed device pointers."""

    device = "cuda"

    def __init__(self, pair, plan, *, loop: str = "auto", seed: int = 0):
        torch = torch_module()
        if not torch.cuda.is_available():
            raise XbenchError(
                "--device cuda needs CUDA GPUs, and torch sees none here",
                "run on GPU nodes, or use --device host",
            )
        super().__init__(pair, plan, loop=loop, seed=seed)
        if self.lib is None:
            raise XbenchError(
                "CUDA-aware MPI probes need the compiled loop",
                "install an MPI with mpicc, built with CUDA support",
            )

    def _buffer(self, nbytes, fill):
        torch = torch_module()
        return torch.full((max(int(nbytes), 1),), fill & 0xFF, dtype=torch.uint8, device="cuda")

    def _addr(self, buf, offset: int = 0) -> int:
        return buf.data_ptr() + offset
