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
128) per query head).
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

    @classmethod
    def for_preset(
        cls, device, heads: int, preset, kv_format, reference_bytes: float, reference_flops: float
    ):
        """``preset`` in ``kv_format`` on terms fitted on a kernel whose token held
        ``reference_bytes`` and whose row-token cost ``reference_flops``."""
        return cls(
            device,
            heads,
            preset.kv_bytes_per_token(kv_format) / reference_bytes,
            preset.flops_per_row_token() / reference_flops,
        )

    def call(self, rows: float, tokens: float) -> float:
        """One call of ``rows`` query rows over ``tokens`` tokens."""
        d = self.device
        base = d.compute(0, 0)
        memory = d.compute(0, tokens) - base
        flops = d.compute(rows, tokens) - base - memory
        return base + self.bytes_ratio * memory + self.flops_ratio * flops

    def knee(self, tokens: float) -> float:
        """B where a batched call's row term equals its token term (memory- to
        compute-bound, in the model's terms)."""
        d = self.device
        memory = self.bytes_ratio * (d.compute(0, tokens) - d.compute(0, 0))
        per_query = self.flops_ratio * (d.compute(self.heads, tokens) - d.compute(0, tokens))
        return memory / per_query if per_query > 0 else math.inf


def ridge_batch(ceilings, preset, kv_format, heads: int) -> float | None:
    """The hardware's ridge point in queries a call: matmul rate / memory bandwidth FLOP per
    byte, over what one query adds (heads x FLOPs a row-token per KV byte a token)."""
    if ceilings is None:
        return None
    per_query = heads * preset.flops_per_row_token() / preset.kv_bytes_per_token(kv_format)
    return ceilings.matmul / ceilings.memory / per_query


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
