"""The kernel backend protocol, and the registry that names every backend.

A backend is one module with one class implementing :class:`KernelBackend`; adding one is
that file plus one line in ``REGISTRY``. The registry holds import paths, not classes, so
naming a backend never imports another one's libraries (FlashMLA, cuda.core, ...).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Protocol

from xbench.errors import XbenchError

REGISTRY = {
    "torch": "xbench.kernels.torch_backend:TorchBackend",
    "triton": "xbench.kernels.triton_backend:TritonBackend",
    # triton's, with a warp-specialized Gluon split kernel where it applies (Hopper, dense bf16)
    "gluon": "xbench.kernels.gluon_backend:GluonBackend",
    # a correctness reference (one block per head and row, no tensor cores): fits skip it
    "cuda-ref": "xbench.kernels.cuda_backend:CudaBackend",
    "flashmla": "xbench.kernels.flashmla_backend:FlashMlaBackend",
    "flashinfer": "xbench.kernels.flashinfer_backend:FlashInferBackend",
}
BACKENDS = tuple(REGISTRY)
REFERENCE_ONLY = ("cuda-ref",)  # backends whose timings no fit may use
AUTO = "auto"  # triton on CUDA devices where it imports, torch elsewhere


def resolve(name: str, device) -> str:
    """The backend ``name`` stands for on ``device`` (a torch device or its name)."""
    if name != AUTO:
        return name
    if str(device).startswith("cuda"):
        try:
            import triton  # noqa: F401

            return "triton"
        except ImportError:
            return "torch"
    return "torch"


class BackendUnavailable(XbenchError):
    """A backend that cannot run here; the message says why in one line."""


class KernelBackend(Protocol):
    """What every backend implements. Shapes: see :mod:`xbench.kernels.api`.

    ``out`` / ``lse`` (attention) and ``out`` (gather), when given, receive the result: a
    backend that cannot write into them computes and copies (:func:`write_into`).
    """

    name: str
    # what the last attention call chose where a backend chooses (tile, splits), stored with
    # every sample; "" where it chooses nothing
    last_plan: str

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None): ...

    def merge_partials(self, outs, lses): ...

    def gather_kv(self, kv_cache, indices, *, out=None): ...

    def splice_kv(self, kv_cache, packed, free_pages, position_shift, rope_dim=64, freqs=None): ...


def write_into(out, lse, result):
    """Deliver ``result`` (out, lse) into the caller's buffers when it gave them."""
    if out is None and lse is None:
        return result
    o, s = result
    if out is not None:
        out.copy_(o)
    if lse is not None:
        lse.copy_(s)
    return (out if out is not None else o), (lse if lse is not None else s)


class TorchFallbacks:
    """merge, gather and splice through the torch backend, for attention-only adapters."""

    last_plan = ""  # the adapters' libraries choose their own tiles, unseen

    def merge_partials(self, outs, lses):
        return get_backend("torch").merge_partials(outs, lses)

    def gather_kv(self, kv_cache, indices, *, out=None):
        return get_backend("torch").gather_kv(kv_cache, indices, out=out)

    def splice_kv(self, kv_cache, packed, free_pages, position_shift, rope_dim=64, freqs=None):
        return get_backend("torch").splice_kv(
            kv_cache, packed, free_pages, position_shift, rope_dim, freqs
        )


@cache
def get_backend(name: str) -> KernelBackend:
    """The backend ``name``, built once per process; BackendUnavailable says why it cannot run."""
    target = REGISTRY.get(name)
    if target is None:
        raise XbenchError(f"unknown kernel backend {name!r}", f"pick one of {', '.join(BACKENDS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
