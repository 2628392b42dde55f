"""FlashMLA (``flash_mla``) as a backend: attention only, dense page tables.

Written from the library's documented API: ``get_mla_metadata`` + ``flash_mla_with_kvcache``
on a cache of shape [blocks, block_size, 1, 576] bf16; returns out and an LSE in natural
log. Each query row becomes one request of one decode token, so the block table repeats
the same pages per row. merge, gather and splice come from the torch backend.
"""

from __future__ import annotations

from xbench.kernels.adapter_common import dense_only, need_cuda
from xbench.kernels.backend import BackendUnavailable, TorchFallbacks, write_into


class FlashMlaBackend(TorchFallbacks):
    name = "flashmla"

    def __init__(self):
        torch = need_cuda(self.name)
        try:
            import flash_mla
        except ImportError:
            raise BackendUnavailable(
                "flashmla: the flash_mla package is not installed",
                "build FlashMLA on a Hopper machine, or use --backend cuda",
            ) from None
        self.torch, self.lib = torch, flash_mla

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        sel = dense_only(indices, self.name)
        torch = self.torch
        rows, heads, dim = q.shape
        pages = sel.pages.to(device=q.device, dtype=torch.int32)
        block_table = pages[None].expand(rows, -1).contiguous()
        seqlens = torch.full((rows,), sel.num_tokens, dtype=torch.int32, device=q.device)
        meta, splits = self.lib.get_mla_metadata(seqlens, heads, 1)
        result, result_lse = self.lib.flash_mla_with_kvcache(
            q[:, None].contiguous(),
            kv_cache[:, :, None, :],
            block_table,
            seqlens,
            v_dim,
            meta,
            splits,
            softmax_scale=scale,
            causal=False,
        )
        # lse is [batch, heads, s_q]
        return write_into(out, lse, (result[:, 0].float(), result_lse[:, :, 0].float()))
