"""Shared-KV batching (MoSKA, arXiv 2511.06010), in the cost model's terms.

B concurrent decode queries that attend one shared context can read it once, as one batched
call over B x heads rows, instead of B calls of ``heads`` rows each reading it again. On the
device terms, T_c(R, c) = t0 + c (per_token + R per_row_token): B separate calls cost
B t0 + B c per_token + B c heads per_row_token, the batched one t0 + c per_token + B c heads
per_row_token; the gain is bounded by how much of a call is its token (memory) term. The
call turns from memory-bound to compute-bound where its row term overtakes the token term,
at B = per_token / (heads per_row_token) (the model's knee); the hardware's ridge point, where
a call's FLOPs per byte read reach the matmul rate over the memory bandwidth, is the same
B on the profile's [ceilings] with the preset's bytes and FLOPs.

A whole decode step, as MoSKA splits it: every request attends its unique KV alone (U tokens,
B separate calls), the shared context (S tokens, in chunks) batched, a top-k router keeping
a fraction ``keep`` of the chunks per query, so each chunk's call holds the queries that chose
it and a chunk no query chose is not read; the partials merged at the requester in one
batched call. Against it, the same B requests each holding its own copy of the whole context
(S + U tokens, dense, B separate calls). Every time is the profile's, scaled from the model
its terms were fitted on to the preset asked: the token term by the KV bytes a token, the row
term by the FLOPs a row-token (2 (qk + v) elements: MLA's 2 x (576 + 512), GQA's 2 x (128 +
128) per query head) and by the matmul rate of the KV's dtype (an FP8 KV attended on FP8
tensor cores: twice the BF16 rate the terms were fitted at, where the profile's [ceilings]
give it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Attention:
    """T_c of one layer for a preset, from a device fitted on another (``reference``)."""

    device: object  # costmodel.Device
    heads: int  # query rows per decode token (per head group the device ran)
    bytes_ratio: float = 1.0  # KV bytes a token: preset / reference
    flops_ratio: float = 1.0  # FLOPs a row-token: preset / reference
    # the reference kernel's matmul rate over this setup's: 1/2 where an FP8 KV is attended
    # on FP8 tensor cores (twice BF16's dense rate) and the terms were fitted in BF16
    rate_ratio: float = 1.0

    @classmethod
    def for_preset(
        cls,
        device,
        heads: int,
        preset,
        kv_format,
        reference_bytes: float,
        reference_flops: float,
        ceilings=None,
    ):
        """``preset`` in ``kv_format`` on terms fitted on a BF16 kernel whose token held
        ``reference_bytes`` and whose row-token cost ``reference_flops``; its row term at
        ``kv_format``'s matmul rate on ``ceilings`` (the BF16 rate's where they give none)."""
        rate = 1.0
        if ceilings is not None:
            rate = ceilings.matmul / ceilings.matmul_for(kv_format)
        return cls(
            device,
            heads,
            preset.kv_bytes_per_token(kv_format) / reference_bytes,
            preset.flops_per_row_token() / reference_flops,
            rate,
        )

    def terms(self, rows: float, tokens: float) -> tuple[float, float, float]:
        """One call's (fixed, token (memory), row (FLOPs)) terms, scaled to the preset."""
        d = self.device
        base = d.compute(0, 0)
        memory = d.compute(0, tokens) - base
        flops = d.compute(rows, tokens) - base - memory
        return base, self.bytes_ratio * memory, self.flops_ratio * self.rate_ratio * flops

    def call(self, rows: float, tokens: float) -> float:
        """One call of ``rows`` query rows over ``tokens`` tokens."""
        return sum(self.terms(rows, tokens))

    def knee(self, tokens: float) -> float:
        """B where a batched call's row term equals its token term (memory- to
        compute-bound, in the model's terms)."""
        _, memory, per_query = self.terms(self.heads, tokens)
        return memory / per_query if per_query > 0 else math.inf


def ridge_batch(ceilings, preset, kv_format, heads: int) -> float | None:
    """The hardware's ridge point in queries a call: ``kv_format``'s matmul rate / memory
    bandwidth FLOP per byte, over what one query adds (heads x FLOPs a row-token per KV byte
    a token)."""
    if ceilings is None:
        return None
    per_query = heads * preset.flops_per_row_token() / preset.kv_bytes_per_token(kv_format)
    return ceilings.matmul_for(kv_format) / ceilings.memory / per_query


def batched_against_separate(att: Attention, tokens: float, batches) -> list[dict]:
    """Per B: one call of B x heads rows over ``tokens`` against B calls of heads rows."""
    rows = []
    for b in batches:
        batched = att.call(b * att.heads, tokens)
        separate = b * att.call(att.heads, tokens)
        rows.append(
            {
                "batch": b,
                "batched_s": batched,
                "separate_s": separate,
                "gain": separate / batched,
            }
        )
    return rows


def chunks_read(chunks: int, keep: float, batch: int) -> float:
    """Expected shared chunks at least one of ``batch`` queries chose, each keeping
    ``keep`` of ``chunks`` at random (a top-k router over uniform chunks)."""
    return chunks * (1 - (1 - keep) ** batch)


def step(
    att: Attention,
    merge,
    *,
    batch: int,
    shared: float,
    unique: float,
    chunk: float,
    keep: float = 1.0,
    layers: int = 1,
) -> dict:
    """One decode step of ``batch`` requests, MoSKA's split against each request holding
    its own copy: the times (s), their parts, and throughputs (tokens/s).

    ``merge(rows, partials, tokens)``: the device's T_m."""
    h = att.heads
    chunks = max(1, math.ceil(shared / chunk))
    per_chunk = shared / chunks
    read = chunks_read(chunks, keep, batch)
    # each chosen chunk's call holds the queries that chose it: batch x keep of them on
    # average over the chunks read (at least one each)
    queries = batch * keep * chunks / read if read else 0.0
    shared_s = read * att.call(queries * h, per_chunk)
    unique_s = batch * att.call(h, unique)
    merged_s = merge(batch * h, 2, 0.0)
    separate_s = batch * att.call(h, shared + unique)
    moska = layers * (shared_s + unique_s + merged_s)
    alone = layers * separate_s
    return {
        "batch": batch,
        "shared_tokens": shared,
        "unique_tokens": unique,
        "keep": keep,
        "chunks_read": read,
        "queries_per_chunk": queries,
        "shared_s": layers * shared_s,
        "unique_s": layers * unique_s,
        "merge_s": layers * merged_s,
        "step_s": moska,
        "separate_step_s": alone,
        "throughput_per_s": batch / moska,
        "separate_throughput_per_s": batch / alone,
        "gain": alone / moska,
    }


def _gpus(kv_bytes: float, free: float) -> int:
    """GPUs whose free memory holds ``kv_bytes`` (at least one)."""
    return max(1, math.ceil(kv_bytes / free))


def on_gpus(
    att: Attention, row: dict, preset, kv_format, *, chunk: float, hbm: float, weights: float
) -> dict:
    """One :func:`step` row (every layer's times; ``chunk``: its router's chunk tokens)
    placed on GPUs of ``hbm`` bytes that each hold the model's ``weights`` besides KV.

    The KV each setup needs room for: MoSKA's shared context once and each request's unique
    KV, on the same GPUs (``moska``) or the unique KV on GPUs of its own (``apart``); a copy
    of both each (``copies``: as many a GPU as fit, or a copy larger than a GPU's free memory
    spread over several). A step's wall time on G GPUs is its device time over G, never less
    than its longest call, which one GPU runs (a spread copy's read split over its GPUs;
    apart, the slower of the two groups): per setup the GPUs, the share of their memory
    used, the compute utilisation (device time over G walls) and the requests a second per
    GPU, and MoSKA's gains per GPU over the copies'."""
    per_token = preset.kv_bytes_per_token(kv_format) * preset.layers
    free = hbm - weights
    if free <= 0:
        raise ValueError(f"the weights ({weights:.3g} B) fill a GPU of {hbm:.3g} B")
    batch, shared, unique, layers = (
        row["batch"], row["shared_tokens"], row["unique_tokens"], preset.layers
    )  # fmt: skip
    shared_bytes, unique_bytes = shared * per_token, batch * unique * per_token
    copy_bytes = (shared + unique) * per_token
    per_copy = _gpus(copy_bytes, free)
    per_chunk = shared / max(1, math.ceil(shared / chunk))
    one_chunk = layers * att.call(row["queries_per_chunk"] * att.heads, per_chunk)
    one_unique = layers * att.call(att.heads, unique)
    shared_gpus, unique_gpus = _gpus(shared_bytes, free), _gpus(unique_bytes, free)
    copies_gpus = batch * per_copy if per_copy > 1 else math.ceil(batch / (free // copy_bytes))
    moska_gpus = _gpus(shared_bytes + unique_bytes, free)
    setups = {  # name: (KV bytes, GPUs, device time, wall time)
        "copies": (
            batch * copy_bytes,
            copies_gpus,
            row["separate_step_s"],
            max(
                row["separate_step_s"] / copies_gpus,
                layers * att.call(att.heads, (shared + unique) / per_copy),
            ),
        ),
        "moska": (
            shared_bytes + unique_bytes,
            moska_gpus,
            row["step_s"],
            max(row["step_s"] / moska_gpus, one_chunk, one_unique),
        ),
        # the shared context's GPUs and the unique KV's at once: the slower group's time
        "apart": (
            shared_bytes + unique_bytes,
            shared_gpus + unique_gpus,
            row["step_s"],
            max(
                (row["shared_s"] + row["merge_s"]) / shared_gpus,
                one_chunk,
                row["unique_s"] / unique_gpus,
                one_unique,
            ),
        ),
    }
    out = {"kv_bytes_per_token": per_token, "copy_bytes": copy_bytes, "gpus_per_copy": per_copy}
    for name, (kv, gpus, device_s, wall) in setups.items():
        out[f"{name}_gpus"] = gpus
        out[f"{name}_hbm_share"] = (kv / gpus + weights) / hbm
        out[f"{name}_utilisation"] = device_s / (gpus * wall)
        out[f"{name}_per_gpu_per_s"] = batch / (wall * gpus)
    for name in ("moska", "apart"):
        out[f"{name}_gain_per_gpu"] = out[f"{name}_per_gpu_per_s"] / out["copies_per_gpu_per_s"]
    return out
