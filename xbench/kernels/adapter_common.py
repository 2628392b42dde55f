"""What the adapters to production MLA kernels share: dense-only checks, the CUDA check."""

from __future__ import annotations

from xbench.kernels.backend import BackendUnavailable
from xbench.kernels.selection import DensePages


def dense_only(indices, name: str) -> DensePages:
    if not isinstance(indices, DensePages):
        raise BackendUnavailable(
            f"{name} adapter takes dense page tables only",
            "use --backend torch or cuda for sparse selections",
        )
    return indices


def need_cuda(name: str):
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"{name}: no CUDA device here", "run on a GPU machine, or use --backend torch"
        )
    return torch
