"""The public kernel API: one signature per primitive, backends chosen by name.

Shapes are those of absorbed MLA decode: ``q`` [rows, heads, D] with D = 576 (512 latent +
64 RoPE) for DeepSeek-V3-class models; ``kv_cache`` paged [blocks, block_size, D]; the
output is [rows, heads, v_dim] fp32 and the LSE [rows, heads] fp32 natural log, ``-inf``
where nothing was attended.
"""

from __future__ import annotations

from xbench.kernels.backend import AUTO, BACKENDS, BackendUnavailable, get_backend, resolve

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "gather_kv",
    "get_backend",
    "merge_partials",
    "mla_partial_attention",
    "splice_kv",
]


def mla_partial_attention(
    q,
    kv_cache,
    indices,
    scale: float,
    *,
    v_dim: int = 512,
    backend: str = AUTO,
    out=None,
    lse=None,
):
    """Attention of ``q`` over the selected tokens of ``kv_cache`` -> (out, lse).

    ``out`` [rows, heads, v_dim] (fp32, or the cache dtype as a partial is shipped) and
    ``lse`` [rows, heads] fp32, when given, receive the result: a holder attends straight
    into the message it returns (the torch backend writes them in place on CPU; others
    compute and copy). ``backend``: a name from ``BACKENDS``, or ``auto``: triton on CUDA
    devices, torch elsewhere.
    """
    if q.dim() != 3 or kv_cache.dim() != 3 or q.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(
            f"q must be [rows, heads, D] and kv_cache [blocks, block_size, D]; got {tuple(q.shape)} and {tuple(kv_cache.shape)}"
        )
    return get_backend(resolve(backend, q.device)).partial_attention(
        q, kv_cache, indices, scale, v_dim, out=out, lse=lse
    )


def merge_partials(outs, lses, *, backend: str = "torch"):
    """Log-sum-exp combine of P partial results: outs [P, rows, heads, v], lses [P, rows, heads]
    (the torch backend also takes sequences of P tensors, bf16 outputs included)."""
    return get_backend(backend).merge_partials(outs, lses)


def gather_kv(kv_cache, indices, *, backend: str = "torch", out=None):
    """Pack the selected tokens into a contiguous [n, D] buffer (the holder's side of a fetch).

    ``out`` [n, D], when given, is that buffer (a holder's staging buffer, registered once):
    the torch backend packs into it directly; the others pack and copy.
    """
    return get_backend(backend).gather_kv(kv_cache, indices, out=out)


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
