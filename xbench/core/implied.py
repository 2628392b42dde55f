"""What each term of a profile implies about the hardware: a time per token is a bandwidth
(the bytes it must move over the time), a time per row-token a FLOP rate, a fabric's beta a
link rate. Read at the fast end of each interval and set against the profile's
``[ceilings]``, a term faster than the hardware it names is impossible, whoever wrote it.

The bytes and FLOPs are the least a term's work must move or do for a model's shapes
(DeepSeek-V3.2's by default): attention reads each cached token once; a merge reads each
fp32 partial row and its LSE; a move (gather at the holder, splice at the requester) reads
and writes each token at both ends, a splice at one.
"""

from __future__ import annotations

from typing import NamedTuple

from xbench.core.costmodel import Profile
from xbench.core.models import DTYPE_BYTES, LSE_BYTES, ModelPreset, get_model


class ImpliedRate(NamedTuple):
    term: str  # "device compute_per_token", "fabric ib beta"
    rate: float  # at the fast end of the term's interval, in the unit below
    unit: str  # "B/s" or "FLOP/s"
    ceiling: float  # the profile's, same unit; inf without [ceilings]
    why: str  # what the term must move or do, per what it counts

    @property
    def within(self) -> bool:
        return self.rate <= self.ceiling * (1 + 1e-9)


def implied_rates(profile: Profile, model: ModelPreset | None = None) -> list[ImpliedRate]:
    """Every bandwidth- or FLOP-bound term's implied rate against the profile's ceilings."""
    model = model or get_model("deepseek-v3.2")
    kv = model.kv_bytes_per_token()
    partial = model.v_dim * DTYPE_BYTES["fp32"] + LSE_BYTES
    flops = 2 * (model.qk_dim + model.v_dim)
    inf = float("inf")
    c = profile.ceilings
    memory, matmul = (c.memory, c.matmul) if c else (inf, inf)
    d = profile.device
    bound = [
        ("compute_per_token", kv, "B/s", memory, f"{kv} B of KV read a token"),
        ("compute_per_row_token", flops, "FLOP/s", matmul, f"{flops} FLOP a row-token"),
        ("merge_per_row_partial", partial, "B/s", memory, f"{partial} B read a row-partial"),
        ("move_per_token", 4 * kv, "B/s", memory, f"4 x {kv} B: read and write at both ends"),
        ("splice_per_token", 2 * kv, "B/s", memory, f"2 x {kv} B: read and write once"),
    ]
    rates = [
        ImpliedRate(f"device {name}", work / coef.low, unit, ceiling, why)
        for name, work, unit, ceiling, why in bound
        if (coef := getattr(d, name)) is not None and coef.low > 0
    ]
    for f in profile.fabrics:
        link = c.links.get(f.name, inf) if c else inf
        for s in f.segments:
            rates.append(
                ImpliedRate(
                    f"fabric {f.name} beta (>= {int(s.min_bytes)} B)",
                    s.beta.high,
                    "B/s",
                    link,
                    "bytes a second on the wire",
                )
            )
    return rates
