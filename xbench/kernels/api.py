"""The public kernel API: one signature per primitive, backends chosen by name.

Shapes are those of absorbed MLA decode: ``q`` [rows, heads, D] with D = 576 (512 latent +
64 RoPE) for DeepSeek-V3-class models; ``kv_cache`` paged [blocks, block_size, D]; the
output is [rows, heads, v_dim] fp32 and the LSE [rows, heads] fp32 natural log, ``-inf``
where nothing was attended.
"""

from __future__ import annotations

from xbench.errors import XbenchError

BACKENDS = ("torch", "cuda", "flashmla", "flashinfer")


class BackendUnavailable(XbenchError):
    """A backend that cannot run here; the message says why in one line."""


def get_backend(name: str):
    """The module or object implementing ``name``; raises BackendUnavailable with the reason."""
    if name == "torch":
        from xbench.kernels import torch_backend

        return torch_backend
    if name == "cuda":
        from xbench.kernels.cuda_backend import CudaBackend

        return CudaBackend.instance()
    if name == "flashmla":
        from xbench.kernels.adapters import FlashMlaBackend

        return FlashMlaBackend()
    if name == "flashinfer":
        from xbench.kernels.adapters import FlashInferBackend

        return FlashInferBackend()
    raise XbenchError(f"unknown kernel backend {name!r}", f"pick one of {', '.join(BACKENDS)}")


def mla_partial_attention(
    q,
    kv_cache,
    indices,
    scale: float,
    *,
    v_dim: int = 512,
    backend: str = "torch",
    out=None,
    lse=None,
):
    """Attention of ``q`` over the selected tokens of ``kv_cache`` -> (out, lse).

    ``out`` [rows, heads, v_dim] (fp32, or the cache dtype as a partial is shipped) and
    ``lse`` [rows, heads] fp32, when given, receive the result: a holder attends straight
    into the message it returns. The torch backend writes them in place on CPU; the others
    compute and copy.
    """
    if q.dim() != 3 or kv_cache.dim() != 3 or q.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(
            f"q must be [rows, heads, D] and kv_cache [blocks, block_size, D]; got {tuple(q.shape)} and {tuple(kv_cache.shape)}"
        )
    impl = get_backend(backend)
    if out is None and lse is None:
        return impl.partial_attention(q, kv_cache, indices, scale, v_dim)
    if backend == "torch":
        return impl.partial_attention(q, kv_cache, indices, scale, v_dim, out=out, lse=lse)
    o, s = impl.partial_attention(q, kv_cache, indices, scale, v_dim)
    out.copy_(o)
    lse.copy_(s)
    return out, lse


def merge_partials(outs, lses, *, backend: str = "torch"):
    """Log-sum-exp combine of P partial results: outs [P, rows, heads, v], lses [P, rows, heads]
    (the torch backend also takes sequences of P tensors, bf16 outputs included)."""
    return get_backend(backend).merge_partials(outs, lses)


def gather_kv(kv_cache, indices, *, backend: str = "torch", out=None):
    """Pack the selected tokens into a contiguous [n, D] buffer (the holder's side of a fetch).

    ``out`` [n, D], when given, is that buffer (a holder's staging buffer, registered once):
    the torch backend packs into it directly; the others pack and copy.
    """
    impl = get_backend(backend)
    if out is None:
        return impl.gather_kv(kv_cache, indices)
    if backend == "torch":
        return impl.gather_kv(kv_cache, indices, out=out)
    return out.copy_(impl.gather_kv(kv_cache, indices))


def splice_kv(
    kv_cache,
    packed,
    free_pages,
    position_shift,
    *,
    rope_dim: int = 64,
    freqs=None,
    backend: str = "torch",
):
    """Write packed tokens into free pages of ``kv_cache``; re-rotate RoPE to the new positions."""
    return get_backend(backend).splice_kv(
        kv_cache, packed, free_pages, position_shift, rope_dim, freqs
    )
