"""FlashInfer (``flashinfer.mla.BatchMLAPagedAttentionWrapper``) as a backend.

Attention only, dense page tables: latent and RoPE parts as two caches; its LSE is base 2,
converted here to natural log. merge, gather and splice come from the torch backend.
"""

from __future__ import annotations

import math

from xbench.kernels.adapter_common import dense_only, need_cuda
from xbench.kernels.backend import BackendUnavailable, TorchFallbacks, write_into


class FlashInferBackend(TorchFallbacks):
    name = "flashinfer"

    def __init__(self):
        torch = need_cuda(self.name)
        try:
            from flashinfer.mla import BatchMLAPagedAttentionWrapper
        except ImportError:
            raise BackendUnavailable(
                "flashinfer: the flashinfer package is not installed",
                "pip install flashinfer-python on a GPU machine",
            ) from None
        self.torch = torch
        self.wrapper = BatchMLAPagedAttentionWrapper(
            torch.empty(128 * 2**20, dtype=torch.int8, device="cuda")
        )

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        sel = dense_only(indices, self.name)
        torch = self.torch
        rows, heads, dim = q.shape
        rope = dim - v_dim
        dev = q.device
        pages = sel.pages.to(device=dev, dtype=torch.int32)
        n_pages = len(pages)
        qo_indptr = torch.arange(rows + 1, dtype=torch.int32, device=dev)
        kv_indptr = torch.arange(rows + 1, dtype=torch.int32, device=dev) * n_pages
        kv_indices = pages.repeat(rows)
        kv_len = torch.full((rows,), sel.num_tokens, dtype=torch.int32, device=dev)
        self.wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_len,
            heads,
            v_dim,
            rope,
            kv_cache.shape[1],
            False,
            scale,
            q.dtype,
            kv_cache.dtype,
        )
        result, result_lse = self.wrapper.run(
            q[..., :v_dim].contiguous(),
            q[..., v_dim:].contiguous(),
            kv_cache[..., :v_dim],
            kv_cache[..., v_dim:],
            return_lse=True,
        )
        # FlashInfer's LSE is base 2
        return write_into(out, lse, (result.float(), result_lse.float() * math.log(2.0)))
