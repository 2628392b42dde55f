"""What each term of a profile implies about the hardware: a time per token is a bandwidth
(the bytes it must move over the time), a time per row-token a FLOP rate, a fabric's beta a
link rate. Read at the fast end of each interval and set against the profile's
``[ceilings]``, a term faster than the hardware it names is impossible, whoever wrote it.

Every term and every segment is checked, shipped or fitted:

- attention, each piece: the KV of a token read once, at the fewest rows a query has (one:
  ``per_token + per_row_token``), against the memory bandwidth; its row-token's FLOPs
  against the matmul rate;
- the merge: each fp32 partial row and its LSE read, against the memory bandwidth;
- the move (gather at the holder, splice at the requester), each piece: each token read
  and written at both ends; the splice, each piece: read and written once;
- the prefill: a layer's matmuls (2 x active parameters / layers FLOP a token) against the
  matmul rate of the model's weights' dtype (FP8 for DeepSeek-V3's), and its attention's
  token pairs (heads x (qk + v) FLOP a pair) against the 16-bit rate attention runs at;
- each fabric's beta, every segment, and its page rate: against its link's rate times the
  fraction of the wire its protocol leaves to payload (``PROTOCOL_EFFICIENCY``).

The bytes and FLOPs are the least a term's work must move or do for a model's shapes
(DeepSeek-V3.2's by default). A term at 0 implies an infinite rate: it fails its check.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from xbench.core.costmodel import Coef, Profile
from xbench.core.models import DTYPE_BYTES, LSE_BYTES, ModelPreset, get_model

# The fraction of a link's rate that carries payload, for a full-size message: what the
# headers, trailers and gaps of each packet leave. A fabric not named keeps its link rate
# (NVLink publishes no per-packet figure; shared memory has no link).
PROTOCOL_EFFICIENCY = {
    # a 1500-byte MTU: 1448 payload bytes (IP and TCP headers with timestamps taken off)
    # in 1538 bytes on the wire (Ethernet header, FCS, preamble and inter-frame gap)
    "tcp": 1448 / 1538,
    # RoCE v2 at a 4096-byte MTU: Ethernet, IP, UDP, BTH, ICRC, FCS, preamble and gap (82 B)
    "roce": 4096 / 4178,
    # InfiniBand at a 4096-byte MTU: LRH, BTH, ICRC and VCRC (26 B); IBGDA rides the same
    "ib": 4096 / 4122,
    "ibgda": 4096 / 4122,
}


class ImpliedRate(NamedTuple):
    term: str  # "device compute_per_token", "fabric ib beta (>= 0 B)"
    rate: float  # at the fast end of the term's interval, in the unit below
    unit: str  # "B/s" or "FLOP/s"
    ceiling: float  # the profile's, same unit (a link's times its protocol's efficiency)
    why: str  # what the term must move or do, per what it counts
    # the coefficient it reads: ("device", field, piece start or None) or (fabric name,
    # "beta" or "block_beta", segment start or None)
    coef: tuple = ()

    @property
    def within(self) -> bool:
        return self.rate <= self.ceiling * (1 + 1e-9)

    def line(self) -> str:
        """One line: the term, what it implies, and the ceiling it passes."""
        scale, unit = (1e12, "TFLOP/s") if self.unit == "FLOP/s" else (1e9, "GB/s")
        rate = "an infinite rate" if math.isinf(self.rate) else f"{self.rate / scale:,.1f} {unit}"
        return (
            f"{self.term} implies {rate} ({self.why}), above the hardware's "
            f"{self.ceiling / scale:,.1f} {unit}"
        )


def _per(work: float, *times: Coef) -> float:
    """``work`` over the sum of the times' fast ends (inf where they add up to 0)."""
    total = sum(t.low for t in times)
    return work / total if total > 0 else math.inf


def implied_rates(profile: Profile, model: ModelPreset | None = None) -> list[ImpliedRate]:
    """Every bandwidth- or FLOP-bound term and segment's implied rate against the
    profile's ceilings (inf where it has none)."""
    model = model or get_model("deepseek-v3.2")
    return _device_rates(profile, model) + _fabric_rates(profile)


def _device_rates(profile: Profile, model: ModelPreset) -> list:
    c, inf = profile.ceilings, math.inf
    memory, matmul = (c.memory, c.matmul) if c else (inf, inf)
    weights = c.matmul_for(model.matmul_dtype) if c else inf  # the prefill's linear layers
    d = profile.device
    kv = model.kv_bytes_per_token()
    partial = model.v_dim * DTYPE_BYTES["fp32"] + LSE_BYTES
    flops = model.flops_per_row_token()
    rates = []

    def add(term, work, times, unit, ceiling, why, start=None):
        field = term.split(" ")[0]
        rate = _per(work, *times)
        rates.append(
            ImpliedRate(f"device {term}", rate, unit, ceiling, why, ("device", field, start))
        )

    compute = [(None, d.compute_per_token, d.compute_per_row_token)]
    compute += [(m, a, k) for m, _, a, k in d.compute_segments]
    for start, per_token, per_row_token in compute:
        where = "" if start is None else f" (>= {int(start)} tokens)"
        add(f"compute_per_token{where}", kv, (per_token, per_row_token), "B/s", memory,
            f"{kv} B of KV read a token, at one query row", start)  # fmt: skip
        add(f"compute_per_row_token{where}", flops, (per_row_token,), "FLOP/s", matmul,
            f"{flops} FLOP a row-token", start)  # fmt: skip
    add("merge_per_row_partial", partial, (d.merge_per_row_partial,), "B/s", memory,
        f"{partial} B read a row-partial")  # fmt: skip
    for kind, times, why in (
        ("move", 4, f"4 x {kv} B: read and write at both ends"),
        ("splice", 2, f"2 x {kv} B: read and write once"),
    ):
        first = getattr(d, f"{kind}_per_token")
        if first is None:
            continue
        pieces = [(None, first)] + [(m, a) for m, _, a in getattr(d, f"{kind}_segments")]
        for start, per_token in pieces:
            where = "" if start is None else f" (>= {int(start)} tokens)"
            add(f"{kind}_per_token{where}", times * kv, (per_token,), "B/s", memory, why, start)
    if d.recompute_per_token is not None and model.active_params:
        layer = 2 * model.active_params / model.layers
        add("recompute_per_token", layer, (d.recompute_per_token,), "FLOP/s", weights,
            f"{layer / 1e9:.2f} GFLOP a token: 2 x {model.active_params:.3g} active "
            f"parameters / {model.layers} layers, in {model.matmul_dtype.upper()}")  # fmt: skip
    if d.recompute_per_token2 is not None:
        pair = model.q_heads * (model.prefill_qk_dim + model.prefill_v_dim)
        add("recompute_per_token2", pair, (d.recompute_per_token2,), "FLOP/s", matmul,
            f"{pair:,} FLOP a token pair of causal attention")  # fmt: skip
    return rates


def _fabric_rates(profile: Profile) -> list:
    c = profile.ceilings
    rates = []
    for f in profile.fabrics:
        link = c.links.get(f.name, math.inf) if c else math.inf
        share = PROTOCOL_EFFICIENCY.get(f.name, 1.0)
        why = "bytes a second on the wire" + (
            f", {100 * share:.1f} % of the link's rate left to payload" if share < 1 else ""
        )
        betas = [("beta", s.min_bytes, s.beta) for s in f.segments]
        betas += [("block_beta", None, f.block_beta)] if f.block_beta is not None else []
        for name, start, beta in betas:
            shown = name if start is None else f"{name} (>= {int(start)} B)"
            where = (f.name, name, start)
            rates.append(
                ImpliedRate(f"fabric {f.name} {shown}", beta.high, "B/s", link * share, why, where)
            )
    return rates


def beyond_ceilings(profile: Profile, model: ModelPreset | None = None) -> list[ImpliedRate]:
    """The terms that imply more than the hardware can (empty where all pass)."""
    return [r for r in implied_rates(profile, model) if not r.within]
