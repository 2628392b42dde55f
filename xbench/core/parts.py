"""One decode step's parts for one request: the record every reader of the model shares.

``decide`` compiles the formulas of :mod:`xbench.core.costmodel` for speed; everything
else that needs a cost (the simulator's decode and prefill engines, ``validate``'s
predictions, ``report``, the span hit rates' time to first token) reads it from here, built
by the same formulas (``device_side``, ``route_legs``, ``wire_costs``, ``route_merge``,
``option_times``), so no module outside ``core`` adds coefficients into an option's time.
A new cost term is its catalogue line (``device_terms``) and its formula in ``costmodel``;
this record carries it to every reader.

Per step of ``layers`` layers over ``holders`` holders: one layer's device times, and one
message of each kind (a query to one holder, one holder's answer, one holder's share of
the step's KV), each split into the time it holds its sender's link (``occupancy``: its
messages' overheads and its bytes) and its latency in flight after it (``flight``). The
step's times (:meth:`StepParts.route`, ``fetch``, ``local``) equal ``decide``'s option
times for the same request (tests/test_parts.py holds them to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from xbench.core.costmodel import (
    SCALAR,
    VALUE,
    Device,
    DeviceSide,
    Fabric,
    Profile,
    Request,
    Step,
    device_side,
    local_time,
    option_times,
    route_legs,
    route_merge,
)
from xbench.core.sharing import Attention


class Leg(NamedTuple):
    """One message kind: the time it holds its sender's link (its messages' overheads and
    its bytes over the segment's rate) and its latency in flight after it leaves."""

    occupancy: float
    flight: float
    overhead: float  # of ``occupancy``, what its messages' overheads are (the rest: its bytes)

    @property
    def time(self) -> float:
        return self.occupancy + self.flight

    def arriving_behind(self, others: int) -> float:
        """The link time of this message and ``others`` more of its kind from other senders
        at once, through one receiver's link: one overhead (each sender pays its own, at
        once), the bytes one after another."""
        return self.occupancy + others * (self.occupancy - self.overhead)


def message_leg(fabric: Fabric, nbytes: float, messages: int = 1, end: int = VALUE) -> Leg:
    """``nbytes`` in ``messages`` messages on ``fabric`` (:meth:`Fabric.wire`, split): a
    fetch of several pages on the fabric's page terms where it has them."""
    o, segments, pages = fabric.terms(end)
    if messages != 1 and pages is not None:
        flight, inv_rate = pages
    else:
        flight, inv_rate = segments[fabric.segment_index(nbytes)]
    return Leg(messages * o + nbytes * inv_rate, flight, messages * o)


@dataclass(frozen=True, slots=True)
class StepParts:
    """A request's decode step on one fabric at one end of the intervals, part by part."""

    request: Request
    device: Device
    side: DeviceSide  # one layer's device times, as decide reads them
    query: Leg  # one query to one holder (a layer's)
    answer: Leg  # one holder's answer (a layer's)
    kv: Leg  # one holder's share of the step's KV, ``segments`` messages
    probe: float  # the probe's round trip where the request pays it, else 0
    route: float  # per use, as decide's t_route
    fetch: float  # per use (amortised over 1 + reuse uses), as decide's t_fetch
    local: float  # as decide's t_local (inf without a recompute cost, blocks remote)

    # the step's shape (the request's) ------------------------------------------------
    @property
    def layers(self) -> int:
        return self.request.layers

    @property
    def holders(self) -> int:
        return self.request.holders

    @property
    def wired(self) -> int:
        """Route's round trips a step: the layers, or 1 when pipelined."""
        return 1 if self.request.pipeline_layers else self.request.layers

    # the request's message sizes ------------------------------------------------------
    @property
    def query_bytes(self) -> float:
        """S_q: one round trip's query to one holder."""
        return self.request.rows * self.request.heads * self.request.payload_bytes

    @property
    def answer_bytes(self) -> float:
        """S_o: one holder's answer."""
        return self.request.rows * self.request.heads * self.request.return_bytes

    @property
    def kv_bytes(self) -> float:
        """The step's KV of the chunk, every layer's (the holders' shares together)."""
        r = self.request
        return r.layers * r.chunk_tokens * r.kv_bytes_per_token

    # one layer's device times -------------------------------------------------------
    @property
    def attention(self) -> float:
        """T_c(R, c): attention over the whole chunk at the requester (fetch, local)."""
        return self.side.t_c

    @property
    def attention_share(self) -> float:
        """T_c(R, c / k): each holder's attention over its share (route)."""
        return self.side.t_c_route

    @property
    def merge(self) -> float:
        """T_m(R, 2, c): fetch's merge, after its attention over the chunk."""
        return self.side.t_cm - self.side.t_c

    @property
    def route_merge(self) -> float:
        """Route's merge of its k + 1 partials after the requester waited a layer's round
        trip (the holder's attention and both legs)."""
        return route_merge(SCALAR, self.side, self.query_link + self.answer_link)

    @property
    def move(self) -> float:
        """T_move (T_splice for a page-by-page fetch where measured; the request's fetch
        cost where it gives one)."""
        return self.side.t_move

    @property
    def splice(self) -> float:
        """Of :attr:`move`, the splice at the requester (T_splice where measured, else all
        of it); the rest is the gather at the holder."""
        return min(self.device.splice(self.request.chunk_tokens), self.side.t_move)

    @property
    def saved(self) -> float:
        """S(c): what a fetch's first attention saves on the chunk it has just spliced."""
        return self.side.saved

    @property
    def recompute(self) -> float:
        """T_recompute(c): prefilling the chunk here (inf without a recompute cost)."""
        return self.device.recompute(self.request.chunk_tokens)

    # one layer's wire, per round trip -------------------------------------------------
    @property
    def query_link(self) -> float:
        """One round trip's queries: the k leave this link one after another, then fly."""
        return self.holders * self.query.occupancy + self.query.flight

    @property
    def answer_link(self) -> float:
        """One round trip's answers: k holders send at once, through this link in turn."""
        return self.answer.arriving_behind(self.holders - 1) + self.answer.flight

    @property
    def kv_link(self) -> float:
        """The step's KV: k holders send their shares at once, through this link in turn."""
        return self.kv.arriving_behind(self.holders - 1) + self.kv.flight

    # the step's, by phase (these add up to route, fetch and local) --------------------
    def phases(self) -> dict:
        """Each option's time over the step split into phases (those of ``validate``):
        route: send, attention, return, merge; fetch (per use): transfer, move, attention,
        merge; local: attention (and recompute where the blocks are not here); route and
        fetch carry ``probe`` where the request pays it."""
        layers, per_use, side = self.layers, self.side.per_use, self.side
        route = {
            "send": self.wired * self.query_link,
            "attention": layers * side.t_c_route,
            "return": self.wired * self.answer_link,
            "merge": layers * self.route_merge,
        }
        fetch = {
            "transfer": self.kv_link * per_use,
            "move": layers * side.t_move * per_use,
            # the first use's on its spliced chunk, amortised
            "attention": layers * (side.t_c - side.saved * per_use),
            "merge": layers * self.merge,
        }
        if self.probe:
            route["probe"] = self.probe
            fetch["probe"] = self.probe * per_use
        local = {"attention": layers * side.t_c}
        if side.local != side.t_c:
            local["recompute"] = layers * (side.local - side.t_c)
        return {"route": route, "fetch": fetch, "local": local}

    # another batch of rows on the same chunk, over the step ---------------------------
    def attention_for(self, query_rows: float, tokens: float | None = None) -> float:
        """The step's T_c for ``query_rows`` rows over ``tokens`` (the chunk by default):
        a batched call's."""
        chunk = self.request.chunk_tokens if tokens is None else tokens
        return self.layers * self.device.compute(query_rows, chunk)

    def merge_for(self, query_rows: float, partials: int) -> float:
        """The step's T_m for ``query_rows`` rows of ``partials`` partials each, after an
        attention over the chunk: a batched merge's."""
        return self.layers * self.device.merge(query_rows, partials, self.request.chunk_tokens)

    def merge_after_wait_for(self, query_rows: float, partials: int, wait: float) -> float:
        """The step's route merge for ``query_rows`` rows after each layer waited ``wait``."""
        merge = self.device.merge_after_wait(query_rows, partials, self.request.chunk_tokens, wait)
        return self.layers * merge


def step_parts(profile: Profile, request: Request, end: int = VALUE) -> StepParts:
    """The parts of ``request``'s step on its fabric (the profile's first when it names
    none), at the coefficients' value (``end`` 0), low (1) or high (2) end."""
    fabric = profile.fabric(request.fabric) if request.fabric else profile.fabrics[0]
    return fabric_parts(fabric, profile.device, request, end)


def fabric_parts(fabric: Fabric, device: Device, r: Request, end: int = VALUE) -> StepParts:
    """:func:`step_parts` on a given fabric."""
    rows = r.rows * r.heads
    fetch_cost = math.nan if r.fetch_cost is None else r.fetch_cost
    side = device_side(
        SCALAR, device.terms(end), rows, r.chunk_tokens, r.reuse, r.segments, fetch_cost,
        r.blocks_local, r.holders,
    )  # fmt: skip
    s_q, s_o = rows * r.payload_bytes, rows * r.return_bytes
    s_kv = r.chunk_tokens * r.kv_bytes_per_token
    step = Step(r.layers, r.holders, r.pipeline_layers)
    terms = fabric.terms(end)
    o = terms[0]
    _, _, (a_q, ib_q), (a_o, ib_o) = route_legs(SCALAR, fabric.breaks, terms, s_q, s_o, r.holders)
    probe_bytes = r.probe_bytes if r.include_probe else None
    route, fetch = option_times(
        SCALAR, fabric.breaks, terms, side, s_q, s_o, s_kv, r.segments, probe_bytes, step
    )
    probe = 0.0
    if probe_bytes is not None:
        a_p, ib_p = SCALAR.piece(fabric.breaks, terms[1], probe_bytes)
        probe = 2 * (a_p + probe_bytes * ib_p)
    return StepParts(
        request=r,
        device=device,
        side=side,
        query=Leg(o + s_q * ib_q, a_q, o),
        answer=Leg(o + s_o * ib_o, a_o, o),
        kv=message_leg(fabric, r.layers * s_kv / r.holders, r.segments, end),
        probe=probe,
        route=route,
        fetch=fetch,
        local=local_time(side, r.layers),
    )


def phase_times(fabric: Fabric, device: Device, r: Request, end: int = VALUE) -> dict:
    """Each option's time over ``r``'s step split into phases (:meth:`StepParts.phases`)."""
    return fabric_parts(fabric, device, r, end).phases()


class PrefillScale(NamedTuple):
    """A served model's prefill against the model whose terms the device holds (the
    reference), FLOP for FLOP (``ModelPreset.prefill_flops``): its matmuls' FLOPs a token
    over the reference's, its full-attention FLOPs a token pair over the reference's, and a
    token's windowed attention in the reference's token pairs (a hybrid model's sliding
    window: window x its FLOPs a windowed token over the reference's a pair)."""

    matmul: float = 1.0
    attention: float = 1.0
    window: float = 0.0

    @classmethod
    def of(cls, reference, served, ceilings=None) -> PrefillScale:
        """``served``'s prefill FLOPs over ``reference``'s (both ``ModelPreset``), its
        matmuls at its weights' dtype's rate against the reference's where ``ceilings``
        give both (a BF16 model's at half the FP8 rate)."""
        r, s = reference.prefill_flops(), served.prefill_flops()
        rates = 1.0
        if ceilings is not None:
            rates = ceilings.matmul_for(reference.matmul_dtype) / ceilings.matmul_for(
                served.matmul_dtype
            )
        return cls(s[0] / r[0] * rates, s[1] / r[1], served.window_tokens * s[2] / r[1])


def prefill_time(
    device: Device,
    tokens: float,
    context: float = 0.0,
    layers: int = 1,
    gpus: int = 1,
    speed: float = 1.0,
    scale: PrefillScale | None = None,
) -> float:
    """A prefill of ``tokens`` new tokens after ``context`` cached ones (which they attend)
    over ``layers`` layers, split over ``gpus`` GPUs at ``speed`` of the profile's device:
    layers x T_recompute(tokens after context) / (gpus x speed), of another model than the
    terms' where ``scale`` says how (:func:`prefill_terms`); inf without a recompute cost.
    Every device term is one layer's on one GPU."""
    if scale is None:
        return layers * device.recompute(tokens, context) / (gpus * speed)
    return sum(prefill_terms(device, tokens, context, layers, gpus, speed, scale))


def prefill_terms(
    device: Device,
    tokens: float,
    context: float = 0.0,
    layers: int = 1,
    gpus: int = 1,
    speed: float = 1.0,
    scale: PrefillScale | None = None,
) -> tuple:
    """:func:`prefill_time`'s terms, each scaled as it is: (the calls' fixed time, the
    matmuls', attention's), summing to it where the profile has a recompute cost. A
    ``scale`` multiplies the matmuls' and the full attention's by its FLOP ratios, and adds
    each token's windowed attention at the full attention's time a token pair."""
    fixed, matmul, attention = device.recompute_terms(tokens, context)
    if scale is not None:
        per_pair = device.recompute_per_token2.value if device.recompute_per_token2 else 0.0
        matmul *= scale.matmul
        attention = attention * scale.attention + tokens * scale.window * per_pair
    factor = layers / (gpus * speed)
    return fixed * factor, matmul * factor, attention * factor


def decode_step_terms(
    device: Device,
    batch: float,
    attended: float,
    *,
    rows: int,
    layers: int,
    gpus: int,
    weight_bytes_read: float,
    flops: float,
    memory_rate: float,
    matmul_rate: float,
    memory_speed: float = 1.0,
    compute_speed: float = 1.0,
) -> tuple[float, float]:
    """One decode step of ``batch`` requests on an instance of ``gpus`` GPUs, each request's
    new token attending ``attended`` tokens: (the linear layers' time, attention's).

    Linear layers: the weights the batch's tokens use, read once (``weight_bytes_read``) at
    ``memory_rate``, or their ``flops`` at ``matmul_rate``, whichever takes longer (a
    roofline), spread evenly over the GPUs. Attention: data-parallel, each GPU attending its
    own requests with every query row, the busiest GPU ceil(batch / gpus) of them, in one
    batched call a layer: the device's T_c(rows, attended) split
    (:class:`xbench.core.sharing.Attention`), its fixed term once, its token (memory) term at
    ``memory_speed`` and its row (FLOPs) term at ``compute_speed`` of the profile's device
    for each request."""
    linear = max(
        weight_bytes_read / (memory_rate * memory_speed), flops / (matmul_rate * compute_speed)
    )
    fixed, memory, row = Attention(device, rows).terms(rows, attended)
    busiest = math.ceil(batch / gpus)
    attention = layers * (fixed + busiest * (memory / memory_speed + row / compute_speed))
    return linear / gpus, attention
