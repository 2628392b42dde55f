"""The reference backend: PyTorch on CPU or CUDA.

Numerics follow FlashMLA's: scores accumulate in fp32, probabilities enter the second
product in the cache dtype, the output is normalised in fp32. On CPU torch has no
bf16 x bf16 -> fp32 matmul (a bf16-rounded score would lose the accuracy the tests demand),
so bf16 attention runs in ``cpu_bf16.c`` (AVX512-BF16, fp32 accumulation of both products)
where the CPU has it, else as fp32 products of the bf16 values (both products: torch's own
CPU bf16 matmul ran at about 1 GFLOP/s on an AMD EPYC without AVX512-BF16, 55 GFLOP/s in
fp32). Keys are processed in tiles whose partial results are combined with
:func:`merge_partials`, so memory stays bounded for long chunks.
"""

from __future__ import annotations

import numpy as np
import torch

from xbench.kernels import cpu_bf16
from xbench.kernels.rope import inv_freq, rotate, shift_on
from xbench.kernels.selection import DensePages, token_indices

SCORE_BUDGET = 2**24  # fp32 score elements per tile (64 MiB)


def _attend(
    q: torch.Tensor, keys: torch.Tensor, scale: float, v_dim: int, valid: torch.Tensor | None
):
    """q [G, L, D], keys [G, S, D], valid [G, S] or None -> out [G, L, v_dim] fp32, lse [G, L]."""
    if keys.is_cuda:  # bf16 products accumulated in fp32 by the tensor cores
        scores = _bmm_fp32(q, keys.transpose(1, 2))
    else:
        keys32 = keys.float()
        scores = torch.bmm(q.float(), keys32.transpose(1, 2))
    scores.mul_(scale)
    if valid is not None:
        scores.masked_fill_(~valid[:, None, :], float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    empty = torch.isneginf(m)
    m = torch.where(empty, torch.zeros_like(m), m)
    scores.sub_(m).exp_()
    denom = scores.sum(dim=-1, keepdim=True)
    if keys.is_cuda:  # probabilities in the cache dtype, the product accumulated in fp32
        out = _bmm_fp32(scores.to(keys.dtype), keys[..., :v_dim])
    else:  # probabilities rounded to the cache dtype, multiplied in fp32
        out = torch.bmm(scores.to(keys.dtype).float(), keys32[..., :v_dim])
    out.div_(torch.where(empty, torch.ones_like(denom), denom))
    lse = (m + denom.log()).squeeze(-1)
    return out, lse.masked_fill(empty.squeeze(-1), float("-inf"))


def _bmm_fp32(a, b):
    """a @ b with fp32 output: bf16 operands stay bf16 where torch can accumulate them in
    fp32 straight into an fp32 result (CUDA, torch >= 2.8); else both are upcast first."""
    if a.dtype == b.dtype and a.dtype != torch.float32:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            pass
    return torch.bmm(a.float(), b.float())


def merge_partials(outs, lses):
    """Combine P partial results [P, ..., v] with their LSEs [P, ...] into one.

    ``outs`` and ``lses`` may also be sequences of P tensors (an output may be bf16, as a
    partial received in the wire format): on CPU they are then read in place, not stacked.
    """
    stacked = isinstance(outs, torch.Tensor)
    device = (outs if stacked else outs[0]).device
    if device.type == "cpu":
        merged = cpu_bf16.merge(outs, lses) if stacked else cpu_bf16.merge_parts(outs, lses)
        if merged is not None:
            return merged
    if not stacked:
        outs = torch.stack([o.float() for o in outs])
        lses = torch.stack([s.float() for s in lses])
    return _merge_torch(outs, lses)


def _merge_torch(outs: torch.Tensor, lses: torch.Tensor):
    """merge_partials in torch operators: on GPUs, and on CPUs without the C kernel."""
    m = lses.amax(dim=0)
    empty = torch.isneginf(m)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    w = torch.exp(lses - m_safe)  # exp(-inf) = 0 for empty partials
    total = w.sum(dim=0)
    out = (w[..., None] * outs.float()).sum(dim=0) / torch.where(
        empty, torch.ones_like(total), total
    )[..., None]
    lse = torch.where(
        empty, m, m_safe + torch.log(torch.where(empty, torch.ones_like(total), total))
    )
    return out, lse


def _cpu_bf16_attention(
    q, flat, indices, block_size: int, scale: float, v_dim: int, out=None, lse=None
):
    """The AVX512-BF16 kernel's answer (out, lse), or None where it does not apply.

    Each group of query rows sharing a key set is one kernel call, which reads the selected
    cache rows in place: a sparse selection is never gathered into a copy first. Given
    ``out`` and ``lse`` (contiguous), one key set for all rows is written straight into them.
    """
    rows, heads, dim = q.shape
    if not (flat.is_contiguous() and cpu_bf16.usable(heads, dim, v_dim)):
        return None
    if isinstance(indices, DensePages):
        groups = [(q.reshape(rows * heads, dim), _dense_selection(indices, block_size))]
    else:
        idx = token_indices(indices, block_size)
        if idx.dim() == 1:
            groups = [(q.reshape(rows * heads, dim), {"index": idx[idx >= 0]})]
        else:
            if idx.shape[0] != rows:
                raise ValueError(
                    f"2-D indices need one row per query row ({rows}), got {idx.shape[0]}"
                )
            groups = [(q[r], {"index": idx[r][idx[r] >= 0]}) for r in range(rows)]
    if out is not None:
        queries, selection = groups[0]
        if (
            len(groups) != 1
            or _selected(selection) == 0
            or not (out.is_contiguous() and lse.is_contiguous())
        ):
            return None  # computed, then copied, by the caller
        into = {"out": out.view(rows * heads, v_dim), "lse": lse.view(rows * heads)}
        cpu_bf16.attention(queries, flat, scale, v_dim, **selection, **into)
        return out, lse
    outs, lses = [], []
    for queries, selection in groups:
        if _selected(selection) == 0:
            outs.append(torch.zeros(queries.shape[0], v_dim))
            lses.append(torch.full((queries.shape[0],), float("-inf")))
            continue
        out, lse = cpu_bf16.attention(queries, flat, scale, v_dim, **selection)
        outs.append(out)
        lses.append(lse)
    if len(outs) > 1:
        outs, lses = [torch.cat(outs)], [torch.cat(lses)]
    return outs[0].reshape(rows, heads, v_dim), lses[0].reshape(rows, heads)


def _dense_selection(indices: DensePages, block_size: int) -> dict:
    """The bf16 kernel's rows for whole pages: a start and count when the pages are
    consecutive, else the token index, built in numpy: decode calls are short, and the
    torch operators for it (token_indices, a -1 mask) took 25 of a 16-token call's 45 us."""
    pages = indices.pages.cpu().numpy().astype(np.int64, copy=False)
    n = indices.num_tokens
    if len(pages) and (len(pages) == 1 or bool((np.diff(pages) == 1).all())):
        return {"start": int(pages[0]) * block_size, "count": n}
    return {"index": _token_rows(pages, block_size, n)}


def _token_rows(pages: np.ndarray, block_size: int, n: int) -> torch.Tensor:
    """DensePages.token_indices in numpy, for the CPU paths where torch's operators cost
    more than the work: the first n rows of the int64 pages, in order."""
    return torch.from_numpy((pages[:, None] * block_size + np.arange(block_size)).ravel()[:n])


def _selected(selection: dict) -> int:
    """Rows a bf16 kernel selection covers (a start and count, or an index)."""
    return selection["count"] if "count" in selection else selection["index"].numel()


def partial_attention(q, kv_cache, indices, scale: float, v_dim: int, out=None, lse=None):
    """(out [rows, heads, v_dim], lse [rows, heads]); written into ``out`` and ``lse`` when
    given (``out`` fp32 or bf16: a holder's message buffer in the wire format), in place
    where the bf16 kernel takes the shape, else computed and copied (one rounding either way)."""
    if out is None and lse is None:
        return _partial_attention(q, kv_cache, indices, scale, v_dim)
    rows, heads, dim = q.shape
    if (
        out is None
        or lse is None
        or out.shape != (rows, heads, v_dim)
        or lse.shape != (rows, heads)
    ):
        raise ValueError(f"out must be [{rows}, {heads}, {v_dim}] and lse [{rows}, {heads}]")
    flat = kv_cache.reshape(-1, dim)
    if q.dtype == torch.bfloat16 and flat.dtype == torch.bfloat16 and q.device.type == "cpu":
        fast = _cpu_bf16_attention(q, flat, indices, kv_cache.shape[1], scale, v_dim, out, lse)
        if fast is not None:
            return fast
    o, s = _partial_attention(q, kv_cache, indices, scale, v_dim)
    out.copy_(o)
    lse.copy_(s)
    return out, lse


def _partial_attention(q, kv_cache, indices, scale: float, v_dim: int):
    rows, heads, dim = q.shape
    block_size = kv_cache.shape[1]
    flat = kv_cache.reshape(-1, dim)
    if q.dtype == torch.bfloat16 and flat.dtype == torch.bfloat16 and q.device.type == "cpu":
        fast = _cpu_bf16_attention(q, flat, indices, block_size, scale, v_dim)
        if fast is not None:
            return fast
    queries, keys, valid = _select(q, flat, indices, block_size, on_device=flat.is_cuda)
    groups, queries_per_group, num_keys = queries.shape[0], queries.shape[1], keys.shape[1]
    if num_keys == 0:
        out = torch.zeros(rows, heads, v_dim, dtype=torch.float32, device=q.device)
        return out, torch.full((rows, heads), float("-inf"), device=q.device)
    tile = max(256, SCORE_BUDGET // max(groups * queries_per_group, 1))
    parts = []
    for s in range(0, num_keys, tile):
        v = None if valid is None else valid[:, s : s + tile]
        parts.append(_attend(queries, keys[:, s : s + tile], scale, v_dim, v))
    if len(parts) == 1:
        out, lse = parts[0]
    else:
        out, lse = merge_partials(
            torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        )
    return out.reshape(rows, heads, v_dim), lse.reshape(rows, heads)


def _select(q, flat, indices, block_size: int, *, on_device: bool):
    """(queries [G, L, D], keys [G, S, D], valid [G, S] or None): what each group attends.

    ``on_device`` (CUDA) builds the selection without a host synchronisation: no page ids
    read back, no data-dependent shapes, padding masked rather than dropped, so a decode
    call queues its kernels and returns (and can be captured in a CUDA graph). On the CPU a
    consecutive page run is sliced and padding is dropped, which is cheaper there.
    """
    rows, heads, dim = q.shape
    if not on_device and isinstance(indices, DensePages) and indices.contiguous_start() is not None:
        start = indices.contiguous_start() * block_size
        return q.reshape(1, rows * heads, dim), flat[start : start + indices.num_tokens][None], None
    idx = token_indices(indices, block_size).to(flat.device)
    if idx.dim() == 1:  # every row attends the same tokens: one group
        queries = q.reshape(1, rows * heads, dim)
        if isinstance(indices, DensePages):  # whole pages: no padding
            # index_select: one gather; flat[idx] goes through advanced indexing's checks
            return queries, flat.index_select(0, idx)[None], None
        if not on_device:
            return queries, flat.index_select(0, idx[idx >= 0])[None], None
        valid = (idx >= 0)[None]
        keys = flat.index_select(0, idx.clamp(min=0))[None]
        return queries, keys.masked_fill_(~valid[..., None], 0), valid
    # per-row selections: one group per row, heads share its keys
    if idx.shape[0] != rows:
        raise ValueError(f"2-D indices need one row per query row ({rows}), got {idx.shape[0]}")
    valid = idx >= 0
    keys = flat.index_select(0, idx.clamp(min=0).flatten()).view(*idx.shape, dim)
    if not on_device and bool(valid.all()):
        return q, keys, None
    # padding must not read through: 0 x NaN would poison the output
    return q, keys.masked_fill_(~valid[..., None], 0), valid


def gather_kv(kv_cache, indices, out=None):
    """Pack the selected tokens [n, D] contiguously (the holder's side of a fetch), into
    ``out`` when given (a staging buffer allocated once, as a holder keeps one registered)."""
    block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
    if isinstance(indices, DensePages):  # whole pages: one copy per page, no token index
        pages = indices.pages.to(device=kv_cache.device)  # index_select takes int32 or int64
        n = indices.num_tokens
        if out is None:
            return kv_cache.index_select(0, pages).view(-1, dim)[:n]
        if out.shape != (n, dim):
            raise ValueError(f"out must be [{n}, {dim}], got {tuple(out.shape)}")
        full = n // block_size
        if full:
            torch.index_select(
                kv_cache, 0, pages[:full], out=out[: full * block_size].view(full, block_size, dim)
            )
        if n > full * block_size:
            out[full * block_size :].copy_(kv_cache[int(pages[full]), : n - full * block_size])
        return out
    idx = token_indices(indices, block_size).to(kv_cache.device).flatten()
    idx = idx[idx >= 0]
    if out is None:
        return kv_cache.reshape(-1, dim).index_select(0, idx)
    if out.shape != (len(idx), dim):
        raise ValueError(f"out must be [{len(idx)}, {dim}], got {tuple(out.shape)}")
    return torch.index_select(kv_cache.reshape(-1, dim), 0, idx, out=out)


def splice_kv(kv_cache, packed, free_pages, position_shift, rope_dim: int = 64, freqs=None):
    """Write packed tokens into free pages, re-rotating RoPE by ``position_shift``.

    Returns the flat token slots written, in order. The non-RoPE part is copied bit-exact.
    """
    block_size, dim = kv_cache.shape[1], kv_cache.shape[2]
    n = packed.shape[0]
    pages = torch.as_tensor(free_pages, dtype=torch.int64)
    if len(pages) * block_size < n:
        raise ValueError(f"{n} tokens need {-(-n // block_size)} free pages, got {len(pages)}")
    freqs = inv_freq(rope_dim, device=kv_cache.device) if freqs is None else freqs
    if kv_cache.device.type == "cpu" and packed.is_contiguous() and _scalar(position_shift):
        # in numpy: the slots and the bounds as torch operators cost more than the C splice
        used = pages.numpy()[: -(-n // block_size)]
        if n and (used.min() < 0 or used.max() >= kv_cache.shape[0]):
            raise IndexError(f"free pages outside a cache of {kv_cache.shape[0]} pages")
        slots = _token_rows(used, block_size, n)
        if cpu_bf16.splice(kv_cache, packed, used, freqs, int(position_shift), rope_dim):
            return slots
    slots = DensePages(pages, n).token_indices(block_size).to(kv_cache.device)
    flat = kv_cache.view(-1, dim)
    # One shift for the whole block (the usual splice) stays a scalar: rotate() then takes
    # cos and sin of rope_dim / 2 angles, not of n x rope_dim / 2 (half the splice's time).
    rotated = rotate(packed[:, dim - rope_dim :], shift_on(position_shift, packed.device), freqs)
    flat[slots, : dim - rope_dim] = packed[:, : dim - rope_dim]
    flat[slots, dim - rope_dim :] = rotated
    return slots


def _scalar(shift) -> bool:
    """An integer shift for the whole block (a Python int or a 0-d integer tensor)."""
    if isinstance(shift, torch.Tensor):
        return shift.dim() == 0 and not shift.is_floating_point() and not shift.is_complex()
    return isinstance(shift, int | np.integer)


class TorchBackend:
    """The reference backend behind the registry: this module's functions."""

    name = "torch"
    last_plan = ""  # one formulation, nothing chosen per shape

    def partial_attention(self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None):
        return partial_attention(q, kv_cache, indices, scale, v_dim, out=out, lse=lse)

    def merge_partials(self, outs, lses):
        return merge_partials(outs, lses)

    def gather_kv(self, kv_cache, indices, *, out=None):
        return gather_kv(kv_cache, indices, out=out)

    def splice_kv(self, kv_cache, packed, free_pages, position_shift, rope_dim=64, freqs=None):
        return splice_kv(kv_cache, packed, free_pages, position_shift, rope_dim, freqs)
