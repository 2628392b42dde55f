"""The cost model and the route / fetch / local predicate (``docs/cost-model.md``).

Pure Python over frozen dataclasses: a serving scheduler can import this module without
MPI, torch, numpy or a GPU. Times are in seconds, sizes in bytes, rates in bytes/s.

Per layer, with b decode tokens of h query rows each routed together, and c tokens of KV:

    wire_f(n, m) = alpha_f(n) + m * o_f + n / beta_f(n)       (piecewise in n)
    wire_f(n, m) = block_t0_f + m * o_f + n / block_beta_f    (a fetch of m > 1 pages, where
                                                               the fabric measured it)
    T_route = T_probe + wire(S_q, 1) + T_c + wire(S_o, 1) + T_m
    T_fetch = T_probe + wire(S_kv, n_seg) + T_move + T_c + T_m
    T_local = T_c                 (blocks already here)
            = T_recompute + T_c   (otherwise, when the profile knows a recompute cost)

With r later reuses of the fetched blocks, a fetch is paid once and serves 1 + r uses, a
route is paid at every use; the times reported are per use:
T_fetch_per_use = (T_fetch + r * (T_c + T_m)) / (1 + r).

Why one extra message per send (``+ o``) and not ``alpha`` twice: LogGP's overhead o is
what each additional message in a batch costs the sender; a single message pays alpha
(its latency) plus one o, which is how the fit measures it (see ``xbench.fit``).

Uncertainty: every coefficient carries a 95 % interval. All terms are monotonic in the
coefficients (times grow with alpha, o and device costs, shrink with beta), so each option's
time has an interval from the coefficients' ends; a decision is ``uncertain`` when the
winner's upper end reaches the runner-up's lower end. This ignores correlation between
coefficients and so errs towards calling a decision uncertain.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

from xbench.core import device_terms, native_code
from xbench.core.tracing import Tracer, TracingOps

INF = math.inf
ROUTE, FETCH, LOCAL = "route", "fetch", "local"


@dataclass(frozen=True, slots=True)
class Coef:
    """A fitted coefficient: value, its 95 % interval, SI unit, whether it is a prior, and
    where its value comes from (a datasheet, a benchmark, a named run; "" when fitted here:
    the profile's provenance says from what). ``bound``: a fit left it at one of its own
    bounds or beyond the hardware's ceilings (``xbench.fit.bounds``): not a measurement,
    so it is also a prior, and every decision resting on it says so."""

    value: float
    low: float
    high: float
    unit: str
    prior: bool = False
    source: str = ""
    bound: bool = False

    @staticmethod
    def exact(value: float, unit: str, prior: bool = False) -> Coef:
        return Coef(value, value, value, unit, prior)


class DeviceTerms(NamedTuple):
    """A device's terms at one end of the intervals, as the formulas read them. Piecewise
    terms are (breaks, pieces); the wait's tau and the saving are taken at the other end (a
    shorter tau is the slower merge, a smaller saving the slower fetch)."""

    compute_breaks: tuple
    compute_pieces: tuple  # (t0, per token, per row-token) per piece
    merge_t0: float
    merge_per_row_partial: float
    move_breaks: tuple
    move_pieces: tuple  # (t0, per token) per piece
    recompute_per_token: float  # inf: the profile knows no recompute cost
    splice_breaks: tuple
    splice_pieces: tuple  # T_move's where the profile has no splice term
    has_splice: bool
    merge_per_token: float
    recompute_per_token2: float
    wait_t0: float  # 0 without the merge-wait terms
    wait_per_row_partial: float
    wait_tau: float  # 0 without the merge-wait terms
    saving_breaks: tuple
    saving_pieces: tuple  # (S0, per token) per piece
    recompute_t0: float  # 0 without the term


@dataclass(frozen=True, slots=True)
class Segment:
    """``alpha + n / beta`` for messages of at least ``min_bytes`` (until the next segment)."""

    min_bytes: float
    alpha: Coef  # s
    beta: Coef  # B/s


@dataclass(frozen=True)
class Fabric:
    name: str  # nvlink, ib, ibgda, roce, tcp, shm, ...
    segments: tuple[Segment, ...]
    overhead: Coef  # o: s per message
    pair_class: str = "inter-node"
    transport: str = "mpi"
    heldout_mape: float | None = None  # error of the fit on sizes held out of it
    # A fetch sent page by page (n_seg > 1), where the probe timed it (``offgather``):
    # block_t0 + n_seg * o + bytes / block_beta. Each page is its own message, out of a
    # cold cache, and pays a rendezvous of its own, which neither the small messages' o nor
    # the large-message rate (one message of megabytes) holds.
    block_t0: Coef | None = None  # s: the request and the first page's latency
    block_beta: Coef | None = None  # B/s
    _breaks: tuple = field(init=False, repr=False, compare=False)
    # (o, ((alpha, 1/beta) per segment), (block_t0, 1/block_beta) or None) at the value,
    # low and high ends: the hot path reads these.
    _val: tuple = field(init=False, repr=False, compare=False)
    _lo: tuple = field(init=False, repr=False, compare=False)
    _hi: tuple = field(init=False, repr=False, compare=False)
    _n_half: float = field(init=False, repr=False, compare=False)
    _prior: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        segs = tuple(sorted(self.segments, key=lambda s: s.min_bytes))
        object.__setattr__(self, "segments", segs)
        object.__setattr__(self, "_breaks", tuple(s.min_bytes for s in segs[1:]))
        if (self.block_t0 is None) != (self.block_beta is None):
            raise ValueError("block_t0 and block_beta come together")
        t0, beta = self.block_t0, self.block_beta
        # the fast end takes each time's low and each rate's high; the slow end the reverse
        for name, time_end, rate_end in (
            ("_val", "value", "value"),
            ("_lo", "low", "high"),
            ("_hi", "high", "low"),
        ):
            segs_end = tuple(
                (getattr(s.alpha, time_end), 1.0 / getattr(s.beta, rate_end)) for s in segs
            )
            pages = None if t0 is None else (getattr(t0, time_end), 1.0 / getattr(beta, rate_end))
            object.__setattr__(self, name, (getattr(self.overhead, time_end), segs_end, pages))
        object.__setattr__(self, "_n_half", self._half_performance())
        coefs = [self.overhead] + [c for seg in segs for c in (seg.alpha, seg.beta)]
        coefs += [t0, beta] if t0 is not None else []
        object.__setattr__(self, "_prior", any(c.prior for c in coefs))

    @property
    def prior(self) -> bool:
        return self._prior

    @property
    def breaks(self) -> tuple:
        """Message sizes where a new segment starts (after the first)."""
        return self._breaks

    def terms(self, end: int = 0) -> tuple:
        """(o, ((alpha, 1/beta) per segment), (block_t0, 1/block_beta) or None) at the
        value (0), low (1) or high (2) end."""
        return (self._val, self._lo, self._hi)[end]

    def segment_index(self, nbytes: float) -> int:
        return bisect_right(self._breaks, nbytes)

    def wire(self, nbytes: float, messages: int = 1) -> float:
        """Time to move ``nbytes`` as ``messages`` messages (alpha + m*o + n/beta; a fetch
        of several pages on the page terms, where measured)."""
        _, segments, blocks = self._val
        if messages != 1 and blocks is not None:
            return blocks[0] + messages * self.overhead.value + nbytes * blocks[1]
        a, inv_b = segments[bisect_right(self._breaks, nbytes)]
        return a + messages * self.overhead.value + nbytes * inv_b

    def half_performance_bytes(self) -> float:
        return self._n_half

    def _half_performance(self) -> float:
        """n_1/2: the size where n / beta = alpha (half the peak rate), on the segment holding it."""
        for i, seg in enumerate(self.segments):
            n = seg.alpha.value * seg.beta.value
            upper = self.segments[i + 1].min_bytes if i + 1 < len(self.segments) else INF
            if seg.min_bytes <= n < upper:
                return n
        return self.segments[0].alpha.value * self.segments[0].beta.value


@dataclass(frozen=True)
class Device:
    """Compute-side terms, fitted from kernel sweeps on the device.

    T_c(R, c) = compute_t0 + c * (compute_per_token + R * compute_per_row_token), R = b*h
        (memory-bound reading of the chunk, plus work that grows with the rows: MoSKA's
        reason routing improves as queries converge on one holder);
    T_m(R, p, c) = merge_t0 + R * p * merge_per_row_partial + c * merge_per_token: the
        last term, where measured, is what a merge pays for following an attention over c
        tokens (its inputs and the caches as that attention left them; on a CPU it is most
        of the merge's time past a few thousand tokens);
    T_move(c) = move_t0 + c * move_per_token (gather at the holder + splice at the requester);
    T_splice(c) = splice_t0 + c * splice_per_token, when measured: the move of a fetch that
        sends each block as its own message straight from the holder's cache (n_seg > 1),
        which packs nothing; without it such a fetch is charged the whole T_move;
    T_recompute(c) = c * recompute_per_token + c^2 * recompute_per_token2 (prefilling the
        chunk locally), when known; the second term, where known, is attention's: each of
        the c tokens attends to those before it, so the work grows with c^2 and a long
        prefill costs more per token than a short one.

    Route's merge follows no attention of the requester's own: it follows the requester's
    wait for the answer (the holder's attention and both messages, g = T_c + wire), and a
    merge after a wait takes T_m(R, p, 0) + (merge_wait_t0 + R * p *
    merge_wait_per_row_partial) * (1 - exp(-g / merge_wait_tau)), when measured (``xbench
    kernel --merge-wait``; on a CPU VM about 0.3 ms more after a few ms, little of it growing
    with the rows); without those terms route's merge is charged as fetch's, T_m(R, p, c).

    A call that starts after the device idled g pays idle_extra * (1 - exp(-g / idle_tau))
    more than back to back (caches, TLBs and clocks gone cold; on a CPU VM about half a
    millisecond after a few ms idle, whatever the call's shape), when measured (``xbench
    kernel --idle``). The decision model compares paths at the same load and leaves it out;
    the simulator, which knows each instance's idle time, charges it and its predicate
    prices it (:meth:`after_idle`).

    A fetch attends the chunk it has just spliced into its cache, part of it still in the
    requester's caches, so its first use's attention takes T_c(R, c) - S(c), where
    ``spliced_saving`` holds S measured at chunk sizes, ``((tokens, Coef), ...)`` (``xbench
    kernel --in-context``: attention right after a splice of its chunk, against the same
    attention over pages from memory; on a CPU VM about 150 us at 1,024 tokens, little past
    the last cache); between them S is interpolated linearly and held flat beyond them (a
    cache keeps no more of a longer chunk). It does not grow with the rows (the chunk is
    read once whatever the rows), so it enters the closed forms as T_move does.

    T_c, T_move and T_splice may change slope where the chunk outgrows a cache (a CPU's
    L2/L3, a GPU's L2): ``compute_segments``, ``move_segments`` and ``splice_segments`` hold
    further pieces, each from a chunk size on, as ``(min_tokens, t0, per_token[,
    per_row_token])``; the flat terms are the piece from 0 tokens.
    """

    name: str
    compute_t0: Coef
    compute_per_token: Coef
    compute_per_row_token: Coef
    merge_t0: Coef
    merge_per_row_partial: Coef
    move_t0: Coef
    move_per_token: Coef
    recompute_per_token: Coef | None = None
    compute_segments: tuple = ()
    move_segments: tuple = ()
    splice_t0: Coef | None = None
    splice_per_token: Coef | None = None
    splice_segments: tuple = ()
    merge_per_token: Coef | None = None
    recompute_per_token2: Coef | None = None
    idle_extra: Coef | None = None
    idle_tau: Coef | None = None
    merge_wait_t0: Coef | None = None
    merge_wait_per_row_partial: Coef | None = None
    merge_wait_tau: Coef | None = None
    spliced_saving: tuple = ()
    recompute_t0: Coef | None = None
    _ends: tuple = field(init=False, repr=False, compare=False)
    _named_ends: tuple = field(init=False, repr=False, compare=False)
    _prior: bool = field(init=False, repr=False, compare=False)
    _prior_by_option: tuple = field(init=False, repr=False, compare=False)
    _saves: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_saves", bool(self.spliced_saving))
        object.__setattr__(
            self,
            "compute_segments",
            tuple(sorted(self.compute_segments, key=lambda piece: piece[0])),
        )
        for name in ("move_segments", "splice_segments", "spliced_saving"):
            pieces = tuple(sorted(getattr(self, name), key=lambda piece: piece[0]))
            object.__setattr__(self, name, pieces)
        if len({tokens for tokens, _ in self.spliced_saving}) < len(self.spliced_saving):
            raise ValueError("spliced_saving has two points at one chunk size")
        for names in device_terms.TOGETHER.values():
            if len({getattr(self, name) is None for name in names}) > 1:
                raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} come together")
        named = tuple(self._terms(end) for end in ("value", "low", "high"))
        object.__setattr__(self, "_named_ends", named)
        # plain tuples for the formulas: unpacking a tuple subclass takes the slow path
        object.__setattr__(self, "_ends", tuple(map(tuple, named)))
        coefs = self._all_coefs()
        object.__setattr__(self, "_prior", any(c.prior for c in coefs))
        # Which option's time a prior enters: compute/merge (all), move (fetch), recompute (local).
        shared = any(c.prior for c in self._shared_coefs())
        move = any(c.prior for c in self._move_coefs()) or any(
            c.prior for _, c in self.spliced_saving
        )
        recompute = any(c.prior for c in self._recompute_coefs())
        waited = any(c.prior for c in self._wait_coefs())
        object.__setattr__(
            self, "_prior_by_option", (shared or waited, shared or move, shared or recompute)
        )

    def _flat_coefs(self, option: str) -> list[Coef]:
        """The flat terms present that enter ``option``'s time (device_terms.entering)."""
        return [c for c in map(self.__getattribute__, device_terms.entering(option)) if c]

    def _shared_coefs(self) -> list[Coef]:
        """Compute and merge, every option's: the flat terms and compute's pieces."""
        return self._flat_coefs("all") + [c for piece in self.compute_segments for c in piece[1:]]

    def _wait_coefs(self) -> list[Coef]:
        return self._flat_coefs("route")

    @property
    def prior(self) -> bool:
        return self._prior

    @property
    def saves_on_splice(self) -> bool:
        """Whether a fetch's first attention is charged less than T_c (``spliced_saving``)."""
        return self._saves

    @property
    def prior_by_option(self) -> tuple[bool, bool, bool]:
        """Whether a prior enters route's, fetch's and local's device time."""
        return self._prior_by_option

    def terms(self, end: int = 0) -> tuple:
        """Every device term at the value (0), low (1) or high (2) end, as the model reads
        them (:func:`device_side`): the fields of :class:`DeviceTerms`, a plain tuple."""
        return self._ends[end]

    def _move_pieces(self) -> tuple[list, list]:
        """(T_move pieces, T_splice pieces): a per-block fetch falls back to T_move."""
        move = [(0.0, self.move_t0, self.move_per_token), *self.move_segments]
        if self.splice_t0 is None:
            return move, move
        return move, [(0.0, self.splice_t0, self.splice_per_token), *self.splice_segments]

    def _move_coefs(self) -> list[Coef]:
        move, splice = self._move_pieces()
        return [c for piece in move + (splice if splice is not move else []) for c in piece[1:]]

    def _all_coefs(self) -> list[Coef]:
        return self._shared_coefs() + self._move_coefs() + self._recompute_coefs()

    def _recompute_coefs(self) -> list[Coef]:
        return self._flat_coefs("local")

    def _terms(self, end: str) -> DeviceTerms:
        """The terms at one end (tau 0 and a saving of 0 without those terms)."""
        compute = [
            (0.0, self.compute_t0, self.compute_per_token, self.compute_per_row_token),
            *self.compute_segments,
        ]

        def at_end(pieces):
            breaks = tuple(float(piece[0]) for piece in pieces[1:])
            return breaks, tuple(tuple(getattr(c, end) for c in piece[1:]) for piece in pieces)

        move, splice = self._move_pieces()
        move_end = at_end(move)
        other = {"value": "value", "low": "high", "high": "low"}[end]
        return DeviceTerms(
            *at_end(compute),
            getattr(self.merge_t0, end),
            getattr(self.merge_per_row_partial, end),
            *move_end,
            getattr(self.recompute_per_token, end) if self.recompute_per_token else INF,
            *(move_end if splice is move else at_end(splice)),
            splice is not move,
            getattr(self.merge_per_token, end) if self.merge_per_token else 0.0,
            getattr(self.recompute_per_token2, end) if self.recompute_per_token2 else 0.0,
            getattr(self.merge_wait_t0, end) if self.merge_wait_tau else 0.0,
            getattr(self.merge_wait_per_row_partial, end) if self.merge_wait_tau else 0.0,
            getattr(self.merge_wait_tau, other) if self.merge_wait_tau else 0.0,
            *interpolation_pieces([(t, getattr(c, other)) for t, c in self.spliced_saving]),
            getattr(self.recompute_t0, end) if self.recompute_t0 else 0.0,
        )

    def compute(self, rows: float, chunk: float) -> float:
        terms = self._named_ends[VALUE]
        c0, c1, c2 = terms.compute_pieces[bisect_right(terms.compute_breaks, chunk)]
        return c0 + chunk * (c1 + rows * c2)

    def merge(self, rows: float, partials: int = 2, chunk: float = 0.0) -> float:
        per_token = self.merge_per_token.value if self.merge_per_token else 0.0
        return (
            self.merge_t0.value
            + rows * partials * self.merge_per_row_partial.value
            + chunk * per_token
        )

    def merge_after_wait(self, rows: float, partials: int, chunk: float, wait: float) -> float:
        """A merge that follows its core's wait of ``wait`` seconds for a routed answer;
        without the wait terms, the merge as timed after an attention over ``chunk``."""
        if self.merge_wait_tau is None:
            return self.merge(rows, partials, chunk)
        extra = self.merge_wait_t0.value + rows * partials * self.merge_wait_per_row_partial.value
        return self.merge(rows, partials) - extra * math.expm1(-wait / self.merge_wait_tau.value)

    def recompute(self, tokens: float, context: float = 0.0) -> float:
        """T_recompute: prefilling ``tokens`` after ``context`` cached ones, which they
        attend, in one call (inf when the profile has no recompute cost)."""
        t = self._named_ends[VALUE]
        return recompute_time(
            tokens, t.recompute_per_token, t.recompute_per_token2, t.recompute_t0, context
        )

    def recompute_terms(self, tokens: float, context: float = 0.0) -> tuple:
        """T_recompute's terms (fixed, matmuls, attention) of :meth:`recompute`'s call."""
        t = self._named_ends[VALUE]
        return recompute_terms(
            tokens, t.recompute_per_token, t.recompute_per_token2, t.recompute_t0, context
        )

    def after_idle(self, idle: float) -> float:
        """What a call adds for starting after ``idle`` seconds of the device idle (0
        without the terms)."""
        if self.idle_extra is None or idle <= 0:
            return 0.0
        return self.idle_extra.value * -math.expm1(-idle / self.idle_tau.value)

    def saved_on_splice(self, chunk: float) -> float:
        """S(c): what a fetch's first attention saves over T_c by attending the chunk it
        has just spliced (0 without ``spliced_saving``)."""
        terms = self._named_ends[VALUE]
        breaks, pieces = terms.saving_breaks, terms.saving_pieces
        h0, h1 = pieces[bisect_right(breaks, chunk)] if breaks else pieces[0]
        return h0 + chunk * h1

    def splice(self, chunk: float) -> float:
        """T_splice: landed pages spliced into the cache, one message per block, where the
        profile measured it; else all of T_move (``move`` with several segments)."""
        return self.move(chunk, 2)

    def move(self, chunk: float, segments: int = 1) -> float:
        """T_move of a packed fetch (``segments`` 1), or of one message per block (T_splice)."""
        terms = self._named_ends[VALUE]
        if segments == 1:
            breaks, pieces = terms.move_breaks, terms.move_pieces
        else:
            breaks, pieces = terms.splice_breaks, terms.splice_pieces
        g0, g1 = pieces[bisect_right(breaks, chunk)]
        return g0 + chunk * g1


def _dominates(a: Fabric, b: Fabric, strict: bool) -> bool:
    """Whether ``a`` moves any message at least as fast as ``b`` (faster, when ``strict``).

    Compared at the coefficients' values for every size n >= 0 and message count: o_a <= o_b
    and wire_a(n) <= wire_b(n). The difference of two piecewise-linear functions is linear
    between the union of their breakpoints, so its sign at each breakpoint (both sides) and
    its slope past the last one settle it. A dominated fabric never ranks first in decide():
    its route and fetch times are never below the dominating fabric's. When ``a`` comes
    later in the profile, ties would have gone to ``b``, so only strict dominance counts.
    """
    o_a, segs_a, blocks_a = a._val
    o_b, segs_b, blocks_b = b._val
    if o_a > o_b:
        return False
    # A fetch page by page: where either fabric has page terms, only page terms settle it
    # (a line against the other's segments is left undecided: both stay). At m >= 2 pages
    # of n bytes in all, b's time minus a's is (t0_b - t0_a) + m (o_b - o_a) + n (ib_b -
    # ib_a), smallest at m = 2 and n = 0 when o_a <= o_b and ib_a <= ib_b.
    if (blocks_a is None) != (blocks_b is None):
        return False
    if blocks_a is not None:
        (t0_a, ib_a), (t0_b, ib_b) = blocks_a, blocks_b
        fixed = (t0_b + 2 * o_b) - (t0_a + 2 * o_a)
        if ib_a > ib_b or (fixed <= 0 if strict else fixed < 0):
            return False

    def gap(n: float, side) -> float:
        alpha_a, ib_a = segs_a[side(a._breaks, n)]
        alpha_b, ib_b = segs_b[side(b._breaks, n)]
        return (alpha_b + n * ib_b) - (alpha_a + n * ib_a)

    points = sorted({0.0, *a._breaks, *b._breaks})
    gaps = [gap(n, bisect_right) for n in points] + [gap(n, bisect_left) for n in points if n > 0]
    slope = segs_b[-1][1] - segs_a[-1][1]
    return slope >= 0 and all(g > 0 if strict else g >= 0 for g in gaps)


@dataclass(frozen=True)
class Ceilings:
    """What the hardware a profile describes cannot exceed: its memory bandwidth (B/s), its
    dense matmul rate (FLOP/s) in 16-bit floats and, where given, in FP8, each fabric's
    link rate (B/s, by fabric name) and, where given, a GPU's memory capacity (bytes). A term
    faster than these (``xbench.core.implied``) is impossible, whatever fitted it."""

    memory: float
    matmul: float
    links: dict = field(default_factory=dict)
    source: str = ""
    matmul_fp8: float | None = None
    hbm: float | None = None  # a GPU's memory capacity (bytes), where given

    def matmul_for(self, dtype: str) -> float:
        """The dense matmul rate of ``dtype``'s tensor cores: FP8's where the profile gives
        it; else, and for 16-bit floats, ``matmul`` (the stricter check where FP8's is not
        given)."""
        return self.matmul_fp8 if dtype == "fp8" and self.matmul_fp8 else self.matmul


@dataclass(frozen=True)
class Profile:
    name: str
    fabrics: tuple[Fabric, ...]
    device: Device
    provenance: dict = field(default_factory=dict, compare=False)
    ceilings: Ceilings | None = field(default=None, compare=False)
    _by_name: dict = field(init=False, repr=False, compare=False)
    _candidates: tuple = field(init=False, repr=False, compare=False)
    _decide: dict = field(init=False, repr=False, compare=False)  # decide() compiled, by shape

    def __post_init__(self):
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fabrics})
        object.__setattr__(self, "_decide", {})
        # What decide() ranks when a request names no fabric: the fabrics no other fabric
        # beats at every size, in profile order, with their hot-path terms unpacked.
        kept = [
            f
            for j, f in enumerate(self.fabrics)
            if not any(_dominates(g, f, strict=i > j) for i, g in enumerate(self.fabrics) if i != j)
        ]
        object.__setattr__(self, "_candidates", tuple(kept))

    @property
    def candidates(self) -> tuple[Fabric, ...]:
        """The fabrics no other fabric beats at every size, in profile order: what
        :func:`decide` ranks when a request names no fabric (the others can never win)."""
        return self._candidates

    def fabric(self, name: str) -> Fabric:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"profile {self.name} has no fabric {name!r}; it has {', '.join(self._by_name)}"
            ) from None

    @property
    def rests_on_priors(self) -> bool:
        return self.device.prior or any(f.prior for f in self.fabrics)


class Request(NamedTuple):
    """One routing question: one layer, or a decode step of ``layers``. (An immutable
    record built per request by a scheduler: a NamedTuple builds in a third of a frozen
    dataclass's time.)"""

    rows: int = 1  # b: decode tokens routed together
    heads: int = 128  # h: query rows per token (after tensor parallelism)
    chunk_tokens: int = 2048  # c: tokens of KV the query attends on the holder
    payload_bytes: float = 1152  # S_q per query row (576 bf16)
    return_bytes: float = 1028  # S_o per query row (512 bf16 + fp32 LSE)
    kv_bytes_per_token: float = 1152  # S_kv per token (bf16 MLA)
    reuse: float = 0  # r: later local uses of fetched blocks
    segments: int = 1  # n_seg: 1 = packed fetch; k = one message per block, sent from the cache
    fetch_cost: float | None = None  # T_move override (s); None = the device's fitted T_move(c)
    include_probe: bool = False
    probe_bytes: float = 64
    blocks_local: bool = False
    fabric: str | None = None  # None: every fabric of the profile, best one reported
    layers: int = 1  # L: the step's layers (1: one layer, the unit of every per-layer term)
    holders: int = 1  # k: instances the chunk is spread over (route merges k + 1 partials)
    pipeline_layers: bool = False  # route's round trip once a step, not once a layer


# The most a request field can mean (decide refuses more, and a scenario's workload): above
# 2^40 no request shape means anything (a tebibyte a query row), and past 2^53 a table's
# integer columns cannot hold a value computed in floats (99999 TiB did not); no context
# comes near 2^30 tokens (a billion; the longest windows are ~10^7); no model has 10,000
# layers (the deepest published have ~100-200)
MOST_SHAPE = 2**40
MOST_TOKENS = 2**30
MOST_LAYERS = 10_000


class Decision(NamedTuple):
    """The answer for one request (an immutable record)."""

    choice: str  # route, fetch or local
    fabric: str
    t_route: float  # per use, s
    t_fetch: float  # per use (fetch amortised over 1 + reuse uses), s
    t_local: float  # s (inf when the blocks are remote and no recompute cost is known)
    margin: float  # runner-up time minus winner time, s
    uncertain: bool  # the coefficients' intervals allow another answer
    ranked_by: str  # latency, bandwidth, overhead (the wire term that ranked the fabric) or none
    prior: bool  # rests on at least one datasheet prior


_new_decision = tuple.__new__

# Which end of the coefficients' intervals a time is evaluated at.
VALUE, LOW, HIGH = 0, 1, 2


# ---------------------------------------------------------------------------------------
# The model, written once. Each formula takes ``ops``: arithmetic on one request (floats,
# the scheduler's hot path) or on a block of requests (numpy arrays, ``xbench.core.grid``).
# The formulas only add, multiply, look up a piece and choose; ``ops`` says how the last
# two are done for its kind of number.
# ---------------------------------------------------------------------------------------


def _scalar_piece(breaks: tuple, pieces: tuple, x: float):
    """The piece of a piecewise term that holds ``x`` (pieces start at ``breaks``)."""
    return pieces[bisect_right(breaks, x)]


def _scalar_where(cond, if_true, if_false):
    return if_true if cond else if_false


def _scalar_minimum(a, b):
    return a if a <= b else b


def _scalar_maximum(a, b):
    return a if a >= b else b


def _scalar_pick(index, table: tuple):
    return table[index]


class ScalarOps(NamedTuple):
    """Lookups and choices on Python floats (``bisect``; no numpy import). A tuple of plain
    functions: attribute access without descriptors, for decide()'s hot path."""

    piece: object = _scalar_piece
    where: object = _scalar_where
    any: object = bool
    expm1: object = math.expm1
    minimum: object = _scalar_minimum
    maximum: object = _scalar_maximum
    pick: object = _scalar_pick


SCALAR = ScalarOps()


RECOMPUTE_TERMS = ("fixed", "matmul", "attention")  # recompute_terms' order


def recompute_time(tokens, per_token: float, per_token2: float, t0=0.0, context=0.0):
    """T_recompute(c) = t0 + c * p1 + c^2 * p2 for one call over c tokens; after ``context``
    cached tokens h that they attend, the pairs are (h + c)^2 - h^2 = c (c + 2 h). Inf
    without p1: the profile knows no cost."""
    if per_token == INF:
        return INF
    return t0 + tokens * (per_token + (tokens + 2 * context) * per_token2)


def recompute_terms(tokens, per_token: float, per_token2: float, t0=0.0, context=0.0):
    """:func:`recompute_time`'s terms (:data:`RECOMPUTE_TERMS`): the call's fixed time t0,
    the matmuls' c * p1, and attention's pairs, the rest of the sum (the formula stays
    in one place, unchanged on decide's path)."""
    matmul = tokens * per_token
    return t0, matmul, recompute_time(tokens, per_token, per_token2, t0, context) - t0 - matmul


def interpolation_pieces(points) -> tuple:
    """(breaks, pieces) of the line through ``points`` ((x, y), sorted by x), held flat
    before the first and after the last, as the model's piecewise terms read them: piece i
    is (y0, slope) with y = y0 + x * slope from breaks[i - 1] on. No points: 0 everywhere."""
    if not points:
        return (), ((0.0, 0.0),)
    pieces = [(points[0][1], 0.0)]
    for (x0, y0), (x1, y1) in pairwise(points):
        slope = (y1 - y0) / (x1 - x0)
        pieces.append((y0 - x0 * slope, slope))
    pieces.append((points[-1][1], 0.0))
    return tuple(float(x) for x, _ in points), tuple(pieces)


class DeviceSide(NamedTuple):
    """The fabric-free part of one layer's times at one end of the intervals
    (:func:`device_side`), shared by every fabric that competes."""

    t_cm: float  # T_c + T_m(R, 2, c): a fetch's (and local's) attention and merge
    fetch_base: float  # T_move - S + (1 + r) t_cm: one fetch serves this use and r later ones
    per_use: float  # 1 / (1 + r)
    local: float  # T_c, plus T_recompute where the blocks are not here
    t_move: float
    t_c: float  # T_c(R, c): attention over the chunk at the requester
    t_m0: float  # T_m(R, k + 1, 0): route's merge of its k + 1 partials, before any wait
    wait_extra: float  # (w0 + (k + 1) R w1): what route's merge adds once its wait saturates
    wait_tau: float  # 0 without the merge-wait terms
    saved: float  # S(c): what a fetch's first attention saves on the chunk it just spliced
    t_c_route: float  # T_c(R, c / k): each of the k holders attends its share, at once
    t_cm_route: float  # t_c_route + T_m(R, k + 1, c): route's, without the merge-wait terms


class Step(NamedTuple):
    """What a decision covers: one decode step over ``layers`` layers, the chunk spread over
    ``holders`` instances; ``pipelined``: route's round trip is paid once a step, the other
    layers' hidden behind compute (else once a layer)."""

    layers: object = 1
    holders: object = 1
    pipelined: object = False


ONE_LAYER = Step()


def device_side(
    ops, terms: tuple, rows, chunk, reuse, segments, fetch_cost, blocks_local, holders=1
) -> DeviceSide:
    """One layer's device times (:class:`DeviceSide`). ``terms``: :meth:`Device.terms` at
    one end; ``rows`` = b*h query rows; ``fetch_cost`` NaN where the device's T_move(c)
    applies; ``holders``: the instances the chunk is spread over (route's attention runs
    on each share at once and merges k + 1 partials; fetch and local attend it whole)."""
    cb, cp, m0, m1, mb, mp, rec, sb, sp, has_splice, m2, rec2, w0, w1, wtau, hb, hp, rec0 = terms
    # (a term of one piece needs no lookup: the common case, and the hot path's)
    c0, c1, c2 = ops.piece(cb, cp, chunk) if cb else cp[0]
    t_c = c0 + chunk * (c1 + rows * c2)
    t_cm = t_c + (m0 + rows * 2 * m1) + chunk * m2
    share = chunk / holders
    r0, r1, r2 = ops.piece(cb, cp, share) if cb else cp[0]
    t_c_route = r0 + share * (r1 + rows * r2)
    partials = holders + 1
    t_m0 = m0 + rows * partials * m1
    t_cm_route = t_c_route + t_m0 + chunk * m2
    g0, g1 = ops.piece(mb, mp, chunk) if mb else mp[0]
    t_move = g0 + chunk * g1
    # A fetch of one message per block leaves the holder's cache as the blocks lie: nothing
    # is packed, so it pays the splice alone (T_splice), where the profile measured it.
    if has_splice and ops.any(segments != 1):
        s0, s1 = ops.piece(sb, sp, chunk) if sb else sp[0]
        t_move = ops.where(segments != 1, s0 + chunk * s1, t_move)
    t_move = ops.where(fetch_cost == fetch_cost, fetch_cost, t_move)  # NaN: not given
    local = recompute_time(chunk, rec, rec2, rec0) + t_c
    local = ops.where(blocks_local, t_c, local)
    wait_extra = w0 + rows * partials * w1 if wtau else 0.0
    if len(hb) > 1:  # (none or one point: flat, no lookup, as on the hot path)
        h0, h1 = ops.piece(hb, hp, chunk)
        saved = h0 + chunk * h1
    else:
        saved = hp[0][0]
    fetch_base = t_move - saved + (1.0 + reuse) * t_cm
    return DeviceSide(
        t_cm, fetch_base, 1.0 / (1.0 + reuse), local, t_move, t_c, t_m0, wait_extra, wtau,
        saved, t_c_route, t_cm_route,
    )  # fmt: skip


def local_time(dev: DeviceSide, layers=1):
    """Local's time over ``layers`` layers."""
    return layers * dev.local


def route_merge(ops, dev: DeviceSide, wire):
    """Route's merge of its k + 1 partials: after the requester waited for the answers (a
    holder's attention and route's ``wire``), T_m(R, k + 1, 0) + (w0 + (k + 1) R w1) (1 -
    exp(-wait / tau)); without the wait terms, as fetch's (T_m after an attention over the
    chunk)."""
    if not dev.wait_tau:
        return dev.t_cm_route - dev.t_c_route
    return dev.t_m0 - dev.wait_extra * ops.expm1(-(dev.t_c_route + wire) / dev.wait_tau)


def route_legs(ops, breaks: tuple, fabric_terms: tuple, s_q, s_o, holders=1):
    """Route's two legs, the query to each of the k holders and their answers back, each
    message alpha + o + bytes/beta of the segment its size falls in: the k queries leave
    the requester's link one after another (k o + k S_q/beta); the k answers are sent by
    k holders at once (one o) and come in through the requester's link (k S_o/beta):
    (send, return, (alpha_q, 1/beta_q), (alpha_o, 1/beta_o))."""
    o, segs, _ = fabric_terms
    if breaks:
        a_q, ib_q = ops.piece(breaks, segs, s_q)
        a_o, ib_o = ops.piece(breaks, segs, s_o)
    else:  # one segment
        a_q, ib_q = a_o, ib_o = segs[0]
    send = a_q + holders * o + holders * s_q * ib_q
    back = a_o + o + holders * s_o * ib_o
    return send, back, (a_q, ib_q), (a_o, ib_o)


def wire_costs(ops, breaks: tuple, fabric_terms: tuple, s_q, s_o, s_kv, n_seg, layers=1, holders=1):
    """(route's wire for one layer, fetch's wire for the step, route's per-byte terms) on
    one fabric at one end.

    route: the query out and the answer back, one message each per holder: 2 alpha + (k +
    1) o + k bytes/beta (:func:`route_legs`); fetch: every layer's KV of the chunk once,
    n_seg messages from each holder, the k holders sending their shares at once through
    the requester's link: alpha + n_seg o + L S_kv/beta. Each size reads the segment
    (protocol regime) it falls in; a fetch of several pages reads the fabric's page terms
    instead, where it has them (block_t0 + n_seg o + L S_kv/block_beta).
    """
    o, segs, blocks = fabric_terms
    send, ret, (a_q, ib_q), (a_o, ib_o) = route_legs(ops, breaks, fabric_terms, s_q, s_o, holders)
    kv = layers * s_kv
    a_kv, ib_kv = ops.piece(breaks, segs, kv / holders) if breaks else segs[0]
    route_fixed = a_q + a_o + (holders + 1) * o
    fetch_wire = a_kv + n_seg * o + kv * ib_kv
    if blocks is not None and ops.any(n_seg != 1):
        paged = blocks[0] + n_seg * o + kv * blocks[1]
        fetch_wire = ops.where(n_seg != 1, paged, fetch_wire)
    return send + ret, fetch_wire, (route_fixed, ib_q, ib_o)


def option_times(
    ops, breaks, fabric_terms: tuple, dev: DeviceSide, s_q, s_o, s_kv, n_seg, probe_bytes,
    step: Step = ONE_LAYER,
):  # fmt: skip
    """(route, fetch) per use on one fabric over a step; ``dev`` from :func:`device_side`.

    Route pays its attention and merge every layer, and its round trip every layer (once a
    step when pipelined); fetch moves every layer's KV once and splices it layer by layer.
    ``probe_bytes``: None when no request pays the probe round trip (once a step); else
    its size (NaN where a request does not pay it).
    """
    layers, holders, pipelined = step
    route_wire, fetch_wire, _ = wire_costs(
        ops, breaks, fabric_terms, s_q, s_o, s_kv, n_seg, layers, holders
    )
    # (without the merge-wait terms route merges as fetch does: T_c + T_m, as one sum)
    if dev.wait_tau:
        route_device = dev.t_c_route + route_merge(ops, dev, route_wire)
    else:
        route_device = dev.t_cm_route
    route = ops.where(
        pipelined, layers * route_device + route_wire, layers * (route_device + route_wire)
    )
    fetch = layers * dev.fetch_base + fetch_wire
    if probe_bytes is not None:
        a_p, ib_p = ops.piece(breaks, fabric_terms[1], probe_bytes)
        probe = ops.where(probe_bytes == probe_bytes, 2 * (a_p + probe_bytes * ib_p), 0.0)
        route = route + probe
        fetch = fetch + probe
    return route, fetch * dev.per_use


def wire_parts(ops, breaks, fabric_terms: tuple, s_q, s_o, s_kv, n_seg, step: Step) -> tuple:
    """Each option's wire over a step split by what it pays for: ((overhead, latency,
    bandwidth) of route's round trips, the same of fetch's transfer), the terms of
    :func:`wire_costs` grouped by coefficient (o, alpha, 1/beta) instead of by message."""
    layers, holders, pipelined = step
    o, segs, blocks = fabric_terms
    _, _, (a_q, ib_q), (a_o, ib_o) = route_legs(ops, breaks, fabric_terms, s_q, s_o, holders)
    wired = ops.where(pipelined, 1, layers)
    route = (
        wired * ((holders + 1) * o),
        wired * (a_q + a_o),
        wired * (holders * (s_q * ib_q + s_o * ib_o)),
    )
    kv = layers * s_kv
    a_kv, ib_kv = ops.piece(breaks, segs, kv / holders) if breaks else segs[0]
    fetch = (n_seg * o, a_kv, kv * ib_kv)
    if blocks is not None and ops.any(n_seg != 1):
        paged = n_seg != 1
        fetch = (
            fetch[0],
            ops.where(paged, blocks[0], a_kv),
            ops.where(paged, kv * blocks[1], fetch[2]),
        )
    return route, fetch


# What separated the chosen fabric from the others (Decision.ranked_by), in the order ties
# are settled; "none" where local wins (no wire)
SEPARATING = ("latency", "bandwidth", "overhead", "none")


def separating_term(ops, choice, own: tuple, other: tuple, has_other, labels=SEPARATING):
    """The wire term that ranked the chosen fabric: of the winner's terms (latency,
    bandwidth, overhead: :func:`wire_parts`), the one by which the runner-up fabric pays
    most over the chosen one; where no other fabric competed, the largest of the chosen
    fabric's own; ``labels[3]`` where local wins. ``own`` and ``other``: wire_parts of the
    chosen and the runner-up fabric; ``labels``: names, or codes for a grid."""
    where = ops.where

    def winners(parts):  # (latency, bandwidth, overhead) of the option that won
        (r_o, r_a, r_b), (f_o, f_a, f_b) = parts
        return tuple(where(choice == 0, r, f) for r, f in ((r_a, f_a), (r_b, f_b), (r_o, f_o)))

    mine, theirs = winners(own), winners(other)
    lat, bw, ovh = (where(has_other, t - m, m) for m, t in zip(mine, theirs, strict=True))
    label = where((lat >= bw) & (lat >= ovh), labels[0], where(bw >= ovh, labels[1], labels[2]))
    return where(choice == 2, labels[3], label)


def closed_forms(
    ops, breaks, fabric_terms, heads, payload, ret, s_q, s_o, s_kv, n_seg, dev: DeviceSide,
    step: Step = ONE_LAYER,
):  # fmt: skip
    """(b*, u*, P*, F*): route beats fetch for every b < b*; fetch beats route once 1 + r >
    u*; route beats fetch while its routed bytes a row (out and back, in the request's
    ratio) are below P*; fetch beats route while a layer's move costs less than F*.

    Over a step of L layers with the chunk on k holders, route paying its round trip W
    times (L, or 1 when pipelined): from T_route = T_fetch, with dm = route's attention and
    merge less fetch's, a layer (0 with one holder and without the merge-wait terms: the
    same device on both sides; else taken at the request's own rows, since it grows with
    them), and S the fetch's saving on its spliced chunk (it does not grow with the rows):
    b* = (fetch wire + L (T_move - S) - W route's fixed wire - L dm) / (W k h (P/beta_q +
    R/beta_o)), u* = (fetch wire + L (T_move - S)) / (W route wire + L dm). With r reuses,
    route's byte terms scaled by x meet fetch's time per use at x* = ((fetch wire + L (T_move
    - S)) / (1 + r) - L dm - W route's fixed wire) / (W k (S_q/beta_q + S_o/beta_o)), so P*
    = x* (P + R); and F* = ((W route wire + L dm) (1 + r) - fetch wire) / L + S. P* and F*
    hold where the request's messages stay in their segments (the porting coefficients'
    break-even points); each is inf where nothing flips along it and <= 0 where the other
    option wins at any value.
    """
    layers, holders, pipelined = step
    route_wire, fetch_wire, (route_fixed, ib_q, ib_o) = wire_costs(
        ops, breaks, fabric_terms, s_q, s_o, s_kv, n_seg, layers, holders
    )
    dm = route_merge(ops, dev, route_wire) - (dev.t_cm - dev.t_c_route)
    moved = fetch_wire + layers * dev.t_move - layers * dev.saved
    wired = ops.where(pipelined, 1, layers)  # route's round trips a step
    per_token = (wired * holders) * (heads * (payload * ib_q + ret * ib_o))
    b_star = ops.where(
        per_token > 0,
        (moved - wired * route_fixed - layers * dm) / _nonzero(ops, per_token),
        INF,
    )
    routed = wired * route_wire + layers * dm
    u_star = ops.where(routed > 0, moved / _nonzero(ops, routed), INF)
    bytes_time = (wired * holders) * (s_q * ib_q + s_o * ib_o)
    scale = (moved * dev.per_use - layers * dm - wired * route_fixed) / _nonzero(ops, bytes_time)
    payload_star = ops.where(bytes_time > 0, scale * (payload + ret), INF)
    fetch_cost_star = (routed / dev.per_use - fetch_wire) / layers + dev.saved
    return b_star, u_star, payload_star, fetch_cost_star


def _nonzero(ops, x):
    return ops.where(x > 0, x, 1.0)


# ---------------------------------------------------------------------------------------
# One request at a time.
# ---------------------------------------------------------------------------------------


def _request_device(terms: tuple, r: Request) -> DeviceSide:
    fetch_cost = math.nan if r.fetch_cost is None else r.fetch_cost
    return device_side(
        SCALAR, terms, r.rows * r.heads, r.chunk_tokens, r.reuse, r.segments, fetch_cost,
        r.blocks_local, r.holders,
    )  # fmt: skip


def _request_sizes(r: Request) -> tuple:
    rows = r.rows * r.heads
    return rows * r.payload_bytes, rows * r.return_bytes, r.chunk_tokens * r.kv_bytes_per_token


def _request_step(r: Request) -> Step:
    return Step(r.layers, r.holders, r.pipeline_layers)


def times(f: Fabric, device: Device, r: Request, end: int = VALUE) -> tuple[float, float, float]:
    """(route, fetch, local) per use of ``r`` on fabric ``f``, at one end of the intervals."""
    dev = _request_device(device.terms(end), r)
    s_q, s_o, s_kv = _request_sizes(r)
    probe = r.probe_bytes if r.include_probe else None
    step = _request_step(r)
    route, fetch = option_times(
        SCALAR, f.breaks, f.terms(end), dev, s_q, s_o, s_kv, r.segments, probe, step
    )
    return route, fetch, local_time(dev, r.layers)


def _closed_forms(f: Fabric, device: Device, r: Request) -> tuple:
    dev = _request_device(device.terms(VALUE), r)
    s_q, s_o, s_kv = _request_sizes(r)
    return closed_forms(
        SCALAR, f.breaks, f.terms(VALUE), r.heads, r.payload_bytes, r.return_bytes, s_q, s_o,
        s_kv, r.segments, dev, _request_step(r),
    )  # fmt: skip


def thresholds(f: Fabric, device: Device, r: Request) -> tuple[float, float]:
    """Closed forms (b*, u*) for ``r``'s shape on fabric ``f`` (see :func:`closed_forms`)."""
    return _closed_forms(f, device, r)[:2]


def break_evens(f: Fabric, device: Device, r: Request) -> tuple[float, float]:
    """Where route and fetch trade places along the two porting coefficients, for ``r``'s
    shape on fabric ``f`` (:func:`closed_forms`): (routed bytes a row, out and back, below
    which route wins; a layer's move cost, in s, below which fetch wins)."""
    return _closed_forms(f, device, r)[2:]


# ---------------------------------------------------------------------------------------
# The decision, over one request or a block.
# ---------------------------------------------------------------------------------------


def choose(ops, route, fetch, local):
    """The winner among route, fetch and local, and the runner-up, the first among equals
    in that order: (winner 0/1/2, its time, runner-up 0/1/2, its time)."""
    routes = (route <= fetch) & (route <= local)
    fetches = fetch <= local
    where, minimum = ops.where, ops.minimum
    choice = where(routes, 0, where(fetches, 1, 2))
    winner = where(routes, route, where(fetches, fetch, local))
    second = where(
        routes,
        where(fetches, 1, 2),
        where(fetches, where(route <= local, 0, 2), where(route <= fetch, 0, 1)),
    )
    runner = where(
        routes,
        minimum(fetch, local),
        where(fetches, minimum(route, local), minimum(route, fetch)),
    )
    return choice, winner, second, runner


def interval_reaches(ops, choice, slow: tuple, fast: tuple):
    """Whether the winner at its slow end reaches another option at its fast end (the
    decision is uncertain): ``slow`` and ``fast`` are (route, fetch, local) at the
    coefficients' high and low ends."""
    (route_s, fetch_s, local_s), (route_f, fetch_f, local_f) = slow, fast
    minimum, where = ops.minimum, ops.where
    return where(
        choice == 0,
        route_s >= minimum(fetch_f, local_f),
        where(
            choice == 1,
            fetch_s >= minimum(route_f, local_f),
            local_s >= minimum(route_f, fetch_f),
        ),
    )


def prior_flag(ops, fabric_prior, by_option: tuple, choice, second, fixed_move):
    """Whether a decision rests on a prior: the fabric's, or a device term that enters the
    winner's or the runner-up's time (a given fetch cost replaces the move term)."""
    route_flag, fetch_flag, local_flag = by_option
    move_flag = ops.where(fixed_move, route_flag, fetch_flag)

    def flag(option):
        return ops.where(option == 0, route_flag, ops.where(option == 1, move_flag, local_flag))

    return fabric_prior | flag(choice) | flag(second)


def _by_index(ops, index, values: tuple):
    """``values[index]`` for a request-dependent index (a chain of choices)."""
    out = values[-1]
    for k in range(len(values) - 2, -1, -1):
        out = ops.where(index == k, values[k], out)
    return out


def _parts_by_index(ops, index, parts: list) -> tuple:
    """:func:`wire_parts` of the fabric ``index`` picks among ``parts``."""
    return tuple(
        tuple(_by_index(ops, index, [p[option][term] for p in parts]) for term in range(3))
        for option in range(2)
    )


class _Shape(NamedTuple):
    """What a compiled decision is specialised on: the request's choices that change which
    terms enter (not its numbers). None: the choice is a column of a grid, per row."""

    fabric: str | None  # the fabric asked for; None: every undominated fabric competes
    fetch_given: bool | None  # a fetch cost replaces T_move (a grid's column: NaN where not)
    probe: bool | None  # the probe's round trip is paid (a grid's: include_probe)
    blocks_local: bool | None
    packed: bool  # one message (segments == 1)
    one_layer: bool
    one_holder: bool
    pipelined: bool | None
    codes: bool = False  # a grid's: answers as codes, the closed forms after them


def _shape_of(r: Request) -> _Shape:
    return _Shape(
        r.fabric, r.fetch_cost is not None, bool(r.include_probe), bool(r.blocks_local),
        r.segments == 1, r.layers == 1, r.holders == 1, bool(r.pipeline_layers),
    )  # fmt: skip


class _Terms(NamedTuple):
    """A request as the formulas read it (values, traced values or a grid's columns)."""

    rows: object  # b * h query rows
    chunk: object
    s_q: object
    s_o: object
    s_kv: object
    n_seg: object
    probe: object  # None: no probe; NaN where a row does not pay it
    step: Step
    ends: tuple  # device_side at the value, low and high ends
    fixed_move: object  # a fetch cost replaces T_move


def _request_terms(ops, device: Device, shape: _Shape, read) -> _Terms:
    def column_or(flag, name):  # a choice the shape fixes, or the grid's column
        return read(name) if flag is None else flag

    rows = read("rows") * read("heads")
    chunk = read("chunk_tokens")
    s_q, s_o = rows * read("payload_bytes"), rows * read("return_bytes")
    s_kv = chunk * read("kv_bytes_per_token")
    n_seg = 1 if shape.packed else read("segments")
    fetch_cost = math.nan if shape.fetch_given is False else read("fetch_cost")
    fixed_move = fetch_cost == fetch_cost if shape.fetch_given is None else shape.fetch_given
    if shape.probe is None:  # NaN where a row does not pay it
        probe = ops.where(read("include_probe"), read("probe_bytes"), math.nan)
    else:
        probe = read("probe_bytes") if shape.probe else None
    step = Step(
        1 if shape.one_layer else read("layers"),
        1 if shape.one_holder else read("holders"),
        column_or(shape.pipelined, "pipeline_layers"),
    )
    blocks_local = column_or(shape.blocks_local, "blocks_local")
    ends = tuple(
        device_side(
            ops, device.terms(end), rows, chunk, read("reuse"), n_seg, fetch_cost, blocks_local,
            step.holders,
        )
        for end in (VALUE, LOW, HIGH)
    )  # fmt: skip
    return _Terms(rows, chunk, s_q, s_o, s_kv, n_seg, probe, step, ends, fixed_move)


def _rank(ops, at_value: list, local, ranked: int, first: int) -> tuple:
    """(the fabric chosen, the next best or -1) among the first ``ranked`` of ``at_value``
    ((route, fetch) per fabric): the fabric whose best option is fastest, the first among
    equals; ``first`` (the profile's first fabric) where local wins on every fabric."""
    index, runner_up = 0, -1
    if not ranked:
        return index, runner_up
    best = second_best = INF
    for k, (route_k, fetch_k) in enumerate(at_value[:ranked]):
        time_k = ops.minimum(ops.minimum(route_k, fetch_k), local)
        if k == 0:  # (the first's time is below inf, or every time is inf)
            best = time_k
            continue
        better, second = time_k < best, time_k < second_best
        runner_up = ops.where(better, index, ops.where(second, k, runner_up))
        second_best = ops.where(better, best, ops.where(second, time_k, second_best))
        best, index = ops.where(better, time_k, best), ops.where(better, k, index)
    return ops.where(best == local, first, index), runner_up


def decision_formula(ops, profile: Profile, shape: _Shape, read) -> tuple:
    """decide()'s answer, written once over ``ops``: :func:`decide` runs it compiled for
    the profile (:mod:`xbench.core.tracing`), the grid compiled for numpy blocks.
    ``read(field)`` gives a request field.

    Each fabric's route and fetch at the coefficients' values; the fabric whose best option
    is fastest (the first among equals; the profile's first when local wins everywhere);
    the winner and runner-up there; uncertain where the winner's time at the slow end of
    the intervals reaches another option's at the fast end; what ranked the fabric. With
    ``shape.codes`` (a grid's), the answers are codes and the closed forms on the chosen
    fabric and its n_1/2 follow them.
    """
    device, t = profile.device, _request_terms(ops, profile.device, shape, read)
    value, low, high = t.ends
    if shape.fabric is not None:
        evaluated, ranked = [profile.fabric(shape.fabric)], 0
    else:  # the fabrics no other beats at every size, and the profile's first
        evaluated = list(profile.candidates)
        ranked = len(evaluated)
        if profile.fabrics[0] not in evaluated:
            evaluated.append(profile.fabrics[0])

    def on(f: Fabric, end: int, dev: tuple) -> tuple:
        wire = (t.s_q, t.s_o, t.s_kv, t.n_seg)
        return option_times(ops, f.breaks, f.terms(end), dev, *wire, t.probe, t.step)

    local = local_time(value, t.step.layers)
    at_value = [on(f, VALUE, value) for f in evaluated]
    first = evaluated.index(profile.fabrics[0]) if ranked else 0
    index, runner_up = _rank(ops, at_value, local, ranked, first)
    route, fetch = (_by_index(ops, index, times) for times in zip(*at_value, strict=True))
    choice, winner, second, runner = choose(ops, route, fetch, local)

    def at_end(end: int, dev: tuple) -> tuple:  # (route, fetch, local) on the fabric chosen
        routes, fetches = zip(*(on(f, end, dev) for f in evaluated), strict=True)
        routes, fetches = (_by_index(ops, index, times) for times in (routes, fetches))
        return routes, fetches, local_time(dev, t.step.layers)

    parts = [
        wire_parts(ops, f.breaks, f.terms(VALUE), t.s_q, t.s_o, t.s_kv, t.n_seg, t.step)
        for f in evaluated
    ]
    codes = shape.codes
    by = separating_term(
        ops, choice, _parts_by_index(ops, index, parts),
        _parts_by_index(ops, ops.maximum(runner_up, 0), parts), runner_up >= 0,
        (0, 1, 2, 3) if codes else SEPARATING,
    )  # fmt: skip
    prior = prior_flag(
        ops, ops.pick(index, tuple(f.prior for f in evaluated)), device.prior_by_option,
        choice, second, t.fixed_move,
    )  # fmt: skip
    names = [profile.fabrics.index(f) for f in evaluated] if codes else [f.name for f in evaluated]
    answer = (
        choice if codes else ops.pick(choice, (ROUTE, FETCH, LOCAL)),
        ops.pick(index, tuple(names)),
        route,
        fetch,
        local,
        runner - winner,
        interval_reaches(ops, choice, at_end(HIGH, high), at_end(LOW, low)),
        by,
        prior,
    )
    return answer + (_grid_extras(ops, evaluated, index, t, read) if codes else ())


def _grid_extras(ops, evaluated: list, index, t: _Terms, read) -> tuple:
    """b*, u*, P* and F* on the fabric chosen, and its n_1/2."""
    forms = [
        closed_forms(
            ops, f.breaks, f.terms(VALUE), read("heads"), read("payload_bytes"),
            read("return_bytes"), t.s_q, t.s_o, t.s_kv, t.n_seg, t.ends[0], t.step,
        )
        for f in evaluated
    ]  # fmt: skip
    chosen = tuple(_by_index(ops, index, column) for column in zip(*forms, strict=True))
    return chosen + (ops.pick(index, tuple(f.half_performance_bytes() for f in evaluated)),)


def _compile_decide(profile: Profile, shape: _Shape, key: tuple):
    """decide's function for the profile and the request's shape: the traced formula in
    Python, then, once it has been called often (``native_code.mode``), in C."""
    tracer = Tracer()
    results = decision_formula(TracingOps(tracer), profile, shape, tracer.input)
    python = tracer.compile("decide_compiled", Request._fields, results)
    wanted = native_code.mode()
    if wanted == "python":
        return python

    def native():
        return native_code.build(tracer, Request._fields, results, python) or python

    if wanted == "native":
        return native()
    calls_left = [native_code.AFTER_CALLS]

    def warming(request):
        calls_left[0] -= 1
        # (threads may race past zero: the first to see the count spent, while this is
        # still the profile's function, builds; a second build finds it cached)
        if calls_left[0] <= 0 and profile._decide.get(key) is warming:
            profile._decide[key] = native()
        return python(request)

    return warming


def decide(profile: Profile, request: Request) -> Decision:
    """The predicate for one request: the best option on the best fabric, with its margin.

    Runs :func:`decision_formula` compiled for the profile and the request's shape (once
    each: the profile keeps them).
    """
    r = request
    # (a plain tuple: a _Shape built per call costs a third of the call)
    key = (
        r.fabric, r.fetch_cost is not None, r.include_probe, r.blocks_local, r.segments == 1,
        r.layers == 1, r.holders == 1, r.pipeline_layers,
    )  # fmt: skip
    try:
        compiled = profile._decide[key]
    except KeyError:
        compiled = profile._decide[key] = _compile_decide(profile, _shape_of(r), key)
    # tuple.__new__: half the cost of the NamedTuple's own constructor, same object
    return _new_decision(Decision, compiled(request))
