"""FlashInfer (``flashinfer.mla.BatchMLAPagedAttentionWrapper``) as a backend.

Attention only, dense page tables: latent and RoPE parts as two caches; its LSE is base 2,
converted here to natural log. The rows are one request of ``rows`` query tokens, planned
once per shape and page table (``plan()`` stays outside the timed call). merge, gather and splice come from the torch backend.
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
        self._planned = None
        self.wrapper = BatchMLAPagedAttentionWrapper(
            torch.empty(128 * 2**20, dtype=torch.int8, device="cuda")
        )

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        sel = dense_only(indices, self.name)
        rows, heads, dim = q.shape
        self._plan(sel, rows, heads, dim - v_dim, v_dim, kv_cache, q.dtype, scale)
        result, result_lse = self.wrapper.run(
            q[..., :v_dim].contiguous(),
            q[..., v_dim:].contiguous(),
            kv_cache[..., :v_dim],
            kv_cache[..., v_dim:],
            return_lse=True,
        )
        # FlashInfer's LSE is base 2
        return write_into(out, lse, (result.float(), result_lse.float() * math.log(2.0)))

    def _plan(self, sel, rows, heads, rope, v_dim, kv_cache, q_dtype, scale) -> None:
        """Plan once per shape and page table (planning is outside the timed call): one
        request whose `rows` query tokens attend the same pages, not one per row."""
        torch = self.torch
        dev = kv_cache.device
        key = (rows, heads, sel.num_tokens, sel.pages.data_ptr(), len(sel.pages), q_dtype, scale)
        if key == self._planned:
            return
        pages = sel.pages.to(device=dev, dtype=torch.int32)
        self.wrapper.plan(
            torch.tensor([0, rows], dtype=torch.int32, device=dev),  # qo_indptr
            torch.tensor([0, len(pages)], dtype=torch.int32, device=dev),  # kv_indptr
            pages,  # kv_indices
            torch.tensor([sel.num_tokens], dtype=torch.int32, device=dev),  # kv_len
            heads,
            v_dim,
            rope,
            kv_cache.shape[1],
            False,  # causal
            scale,
            q_dtype,
            kv_cache.dtype,
        )
        self._planned = key
