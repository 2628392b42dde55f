"""Adapters to the production MLA decode kernels, used when importable on a GPU machine.

Written from the libraries' documented APIs and not run on this project's machines (no
GPU): the tests marked ``gpu`` compare them with the torch backend where they import.
Both take dense page tables only (every query row attends the same pages); sparse
selections go to the ``torch`` or ``cuda`` backends. Each query row becomes one request of
one decode token, so block tables repeat the same pages per row.

- FlashMLA (``flash_mla``): ``get_mla_metadata`` + ``flash_mla_with_kvcache`` on a cache of
  shape [blocks, block_size, 1, 576] bf16; returns out and an LSE in natural log.
- FlashInfer (``flashinfer.mla.BatchMLAPagedAttentionWrapper``): latent and RoPE parts as
  two caches; its LSE is base 2, converted here to natural log.
"""

from __future__ import annotations

import math

from xbench.kernels.api import BackendUnavailable
from xbench.kernels.selection import DensePages


def _dense_only(indices, name: str) -> DensePages:
    if not isinstance(indices, DensePages):
        raise BackendUnavailable(
            f"{name} adapter takes dense page tables only",
            "use --backend torch or cuda for sparse selections",
        )
    return indices


def _need_cuda(name: str):
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"{name}: no CUDA device here", "run on a GPU machine, or use --backend torch"
        )
    return torch


class FlashMlaBackend:
    name = "flashmla"

    def __init__(self):
        torch = _need_cuda(self.name)
        try:
            import flash_mla
        except ImportError:
            raise BackendUnavailable(
                "flashmla: the flash_mla package is not installed",
                "build FlashMLA on a Hopper machine, or use --backend cuda",
            ) from None
        self.torch, self.lib = torch, flash_mla

    def partial_attention(self, q, kv_cache, indices, scale, v_dim):
        sel = _dense_only(indices, self.name)
        torch = self.torch
        rows, heads, dim = q.shape
        pages = sel.pages.to(device=q.device, dtype=torch.int32)
        block_table = pages[None].expand(rows, -1).contiguous()
        seqlens = torch.full((rows,), sel.num_tokens, dtype=torch.int32, device=q.device)
        meta, splits = self.lib.get_mla_metadata(seqlens, heads, 1)
        out, lse = self.lib.flash_mla_with_kvcache(
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
        return out[:, 0].float(), lse[:, :, 0].float()  # lse is [batch, heads, s_q]

    def merge_partials(self, outs, lses):
        from xbench.kernels import torch_backend

        return torch_backend.merge_partials(outs, lses)

    def gather_kv(self, kv_cache, indices):
        from xbench.kernels import torch_backend

        return torch_backend.gather_kv(kv_cache, indices)

    def splice_kv(self, *args):
        from xbench.kernels import torch_backend

        return torch_backend.splice_kv(*args)


class FlashInferBackend(FlashMlaBackend):
    name = "flashinfer"

    def __init__(self):
        torch = _need_cuda(self.name)
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

    def partial_attention(self, q, kv_cache, indices, scale, v_dim):
        sel = _dense_only(indices, self.name)
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
        out, lse = self.wrapper.run(
            q[..., :v_dim].contiguous(),
            q[..., v_dim:].contiguous(),
            kv_cache[..., :v_dim],
            kv_cache[..., v_dim:],
            return_lse=True,
        )
        return out.float(), lse.float() * math.log(2.0)
