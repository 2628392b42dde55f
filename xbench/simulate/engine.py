"""A discrete-event simulation of a workload through the fitted cost model.

Instances hold chunks (chunk ``k`` lives on instance ``k % instances``); requests arrive
(Poisson), each from a requester instance for one chunk (Zipf popularity). Every instance has
one compute server (FIFO; it batches the queued attentions of one chunk, routed queries and
uses of a chunk present there alike, into one call whose time is the measured T_c for all
their rows together, so a popular holder both queues and batches) and one egress link (FIFO at the fabric's bandwidth, each message paying the
per-message overhead while it occupies the link and alpha in flight after it). A requester
keeps the chunks it fetched in an LRU cache of ``cache_chunks``. With ``holders`` k > 1 a
shared chunk lies in shares on k instances (``Simulation``): a route asks each, a fetch
pulls each share, and every message's bytes also pass its destination's ingress in turn.
With ``batch_merges`` a requester merges the answers queued at it in one call.

Paths (the cost model's phases, each on the resource it occupies):

- present (the chunk is home or cached): attention at the requester (batched);
- route: query out on the requester's link, attention at the holder (batched), answer back
  on the holder's link, merge at the requester;
- fetch: the chunk on the holder's link (``segments`` messages), then T_move as a delay
  (the gather and splice stack, not a load on the compute), then attention + merge at the
  requester; the chunk enters its cache, and uses that arrive meanwhile wait for it. With
  ``move_on_compute`` (a profile fitted on CPUs) the holder's compute gathers the chunk
  before it leaves and the requester's splices it before attending;
- local: recompute the chunk and attend at the requester (when the profile knows
  ``recompute_per_token``).

Policies (``POLICIES``, objects registered by name): ``route``, ``fetch``, ``local`` always (a
present chunk is always used in place), and ``predicate``: per request, the cost model's times plus the current backlog of the
resources each option would wait on. A fetch is judged over the uses it would serve: this
one, those that arrive while it is on its way (they wait for it), and those its stay in the
cache serves, each counted from what the requester has seen so far (see ``_Reuse``); those
later uses are priced at each core's steady-state wait, not today's backlog, and a later route
at the backlog its links would grow if every use routed (``_predicate``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xbench.core.costmodel import Request
from xbench.core.parts import step_parts
from xbench.core.scenario import span_chunks

_push = heapq.heappush


# The weight of the predicate's prior on a chunk's rate of use, in uses: a fetch is a bet of
# milliseconds paid up front, so one or two early uses should not read as a high rate. Four
# was chosen on random workloads against the better static policy and held on workloads
# not used to choose it (tests/test_simulate.py checks the predicate over seeds).
PRIOR_USES = 4
# The busy fraction above which the predicate's steady-state wait stops growing: past it
# the M/G/1 estimate explodes (1 / (1 - busy)), and a core read as saturated over its
# first few jobs would turn every later route of its chunks into a fetch; a cap well below
# 1 keeps one busy spell from deciding the rest of a workload.
BUSY_CAP = 0.8
PATHS = ("present", "route", "fetch", "local")


@dataclass(frozen=True)
class Workload:
    instances: int = 8
    chunks: int = 256
    chunk_tokens: int = 2048
    rows: int = 1
    heads: int = 16
    payload_bytes: float = 1152
    return_bytes: float = 1028
    kv_bytes_per_token: float = 1152
    segments: int = 1
    rate_per_s: float = 2000.0
    zipf: float = 1.0
    cache_chunks: int = 16
    max_batch_rows: int = 1024
    fabric: str = "nvlink"
    # span requests, as (prefix or None, commuting chunks, weight) (core.scenario): each
    # request is one expression's uses; without them, a request is one use of one chunk
    spans: tuple = ()
    # T_move (gather at the holder, splice at the requester) as work on their compute
    # servers, as on a CPU where the ranks gather and splice themselves; otherwise a delay
    # on the fetch's path (the GPU priors' 3 ms software stack, beside the kernels)
    move_on_compute: bool = False
    # a use is one decode step of this many layers, as the cost model's step (1: one
    # layer's times, as the scenarios were written); pipelined, route's round trip is paid
    # once a step, hidden behind the other layers' compute
    layers: int = 1
    pipeline_layers: bool = False
    # a requester merges the routed answers queued at it in one call (MoSKA's batched merge
    # at the requester) instead of one call each
    batch_merges: bool = False
    # k: the instances each shared chunk is spread over, a share of chunk_tokens / k on
    # each (the cost model's holders): route asks every holder and merges k + 1 partials,
    # fetch pulls every share; 1: the chunk whole on one instance, as the scenarios were
    # written
    holders: int = 1
    # MoSKA's decode step: a request's query attends ``topk`` of the shared chunks, chosen
    # by a router (distinct chunks, drawn by their Zipf popularity), each a use on its own
    # path; 0: a request is one use of one chunk, as the scenarios were written
    topk: int = 0
    # and its own unique KV of this many tokens, attended at its requester in a call of its
    # own (no other request shares it, so none batches with it); 0: none
    unique_tokens: int = 0

    def uses_per_request(self, prefixes: bool = True) -> float:
        """Uses per request, on average over the expressions (1 without spans); a top-k
        request's chosen chunks and, where counted (``prefixes``), its unique KV."""
        if self.topk:
            return self.topk + (prefixes and self.unique_tokens > 0)
        if not self.spans:
            return 1.0
        weights = np.array([weight for _, _, weight in self.spans])
        fanout = np.array([len(c) + (prefixes and bool(p)) for p, c, _ in self.spans])
        return float(weights @ fanout / weights.sum())

    @property
    def uses_per_s(self) -> float:
        """Uses of chunks per second over all instances (requests times their fan-out)."""
        return self.rate_per_s * self.uses_per_request()

    @property
    def shared_chunks(self) -> int:
        """The chunks any requester may use (a span workload's prefixes are each its own)."""
        return len(span_chunks(self.spans)) if self.spans else self.chunks

    @property
    def shared_uses_per_s(self) -> float:
        """Uses of the shared chunks per second over all instances."""
        return self.rate_per_s * self.uses_per_request(prefixes=False)

    def request(self, reuse: float = 0.0) -> Request:
        """The routing question one use asks ``decide`` on this workload's fabric."""
        return Request(
            rows=self.rows,
            heads=self.heads,
            chunk_tokens=self.chunk_tokens,
            reuse=reuse,
            payload_bytes=self.payload_bytes,
            return_bytes=self.return_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            segments=self.segments,
            fabric=self.fabric,
            layers=self.layers,
            pipeline_layers=self.pipeline_layers,
            holders=self.holders,
        )


@dataclass
class Trace:
    """One row per use of a chunk. ``holder``: where each use's chunk lives (default chunk
    % instances); ``request``: which request each use belongs to, where a request fans out
    to several chunks (its latency is its slowest use's)."""

    arrival: np.ndarray  # s
    requester: np.ndarray
    chunk: np.ndarray
    holder: np.ndarray | None = None
    request: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival)


def make_trace(w: Workload, requests: int, seed: int = 0) -> Trace:
    """Poisson arrivals at ``rate_per_s``; requesters uniform; chunks by Zipf popularity,
    or, for span workloads, by the expressions' weights (:func:`make_span_trace`), or top
    k of them a request (:func:`make_topk_trace`)."""
    if w.spans:
        return make_span_trace(w, requests, seed)
    if w.topk:
        return make_topk_trace(w, requests, seed)
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, requests))
    weights = 1.0 / np.arange(1, w.chunks + 1) ** w.zipf
    order = rng.permutation(w.chunks)  # popular chunks spread over the holders
    chunk = order[rng.choice(w.chunks, requests, p=weights / weights.sum())]
    requester = rng.integers(0, w.instances, requests)
    return Trace(arrival, requester, chunk)


def make_span_trace(w: Workload, requests: int, seed: int = 0) -> Trace:
    """``requests`` span requests (Poisson at ``rate_per_s``), each from a uniform requester
    for one expression drawn by weight, expanded into its uses: the prefix at the requester
    (positional: its own copy), then every commuting chunk at its holder, all at once."""
    rng = np.random.default_rng(seed)
    names = span_chunks(w.spans)
    index = {name: k for k, name in enumerate(names)}
    prefixes = sorted({p for p, _, _ in w.spans if p})
    weights = np.array([weight for _, _, weight in w.spans])
    exprs = rng.choice(len(w.spans), requests, p=weights / weights.sum())
    requester = rng.integers(0, w.instances, requests)
    arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, requests))
    uses = []  # per expression: the chunk ids of its uses, and whether one is the prefix
    for prefix, chunks, _ in w.spans:
        ids = [index[c] for c in chunks]
        uses.append((prefixes.index(prefix) if prefix else -1, ids))
    a, r, k, h, g = [], [], [], [], []
    for i in range(requests):
        p, ids = uses[exprs[i]]
        me = int(requester[i])
        if p >= 0:  # its own copy of the prefix: a chunk of this requester's
            a.append(arrival[i])
            r.append(me)
            g.append(i)
            k.append(len(names) + p * w.instances + me)
            h.append(me)
        for c in ids:
            a.append(arrival[i])
            r.append(me)
            g.append(i)
            k.append(c)
            h.append(c % w.instances)
    return Trace(np.array(a), np.array(r), np.array(k), np.array(h), np.array(g))


# a trace's chunk id for a request's own unique KV (top-k workloads): at its requester, in a
# call of its own
OWN = -1


def make_topk_trace(w: Workload, requests: int, seed: int = 0) -> Trace:
    """``requests`` decode steps (Poisson at ``rate_per_s``, uniform requesters), each one
    query's uses: its unique KV at its requester (``OWN``, where ``unique_tokens``), then the
    ``topk`` distinct shared chunks a router chose for it, each at its holder. The router's
    choice: ``topk`` chunks without replacement by Zipf weight (uniform at ``zipf`` 0), drawn
    as the largest of log-weights plus Gumbel noise (the Gumbel top-k trick)."""
    if not 1 <= w.topk <= w.chunks:
        raise ValueError(f"topk = {w.topk}: between 1 and the {w.chunks} chunks")
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, requests))
    requester = rng.integers(0, w.instances, requests)
    log_weights = -w.zipf * np.log(np.arange(1, w.chunks + 1))
    order = rng.permutation(w.chunks)  # popular chunks spread over the holders
    chosen = np.empty((requests, w.topk), dtype=np.int64)
    block = max(1, 2**20 // w.chunks)  # requests drawn at once (their keys ~8 MB)
    for lo in range(0, requests, block):
        keys = log_weights + rng.gumbel(size=(min(block, requests - lo), w.chunks))
        top = np.argpartition(-keys, w.topk - 1, axis=1)[:, : w.topk]
        chosen[lo : lo + len(keys)] = np.sort(order[top], axis=1)
    own = w.unique_tokens > 0
    per = w.topk + own
    chunk = np.empty((requests, per), dtype=np.int64)
    if own:
        chunk[:, 0] = OWN
    chunk[:, own:] = chosen
    holder = np.where(chunk == OWN, requester[:, None], chunk % w.instances)
    return Trace(
        np.repeat(arrival, per),
        np.repeat(requester, per),
        chunk.ravel(),
        holder.ravel(),
        np.repeat(np.arange(requests), per),
    )


class _Memo(dict):
    """A dict that computes a missing key's value once (``compute(key)``)."""

    def __init__(self, compute):
        super().__init__()
        self.compute = compute

    def __missing__(self, key):
        value = self[key] = self.compute(key)
        return value


class _Costs:
    """The model's times for one workload shape, read once from the core's record of a use
    (``core.parts.step_parts``: a use is one decode step of ``w.layers`` layers, as decide
    prices it), kept as the engine's resources take them: the messages' link time and
    flight, the attentions and merges by the rows batched together, the move."""

    def __init__(self, profile, w: Workload):
        parts = self.parts = step_parts(profile, w.request())
        d = profile.device
        self.w, self.fabric, self.device = w, profile.fabric(w.fabric), d
        self.layers, self.wired, self.shares = parts.layers, parts.wired, parts.holders
        k = self.shares
        self.rows = w.rows * w.heads
        self.s_q, self.s_o = parts.query_bytes, parts.answer_bytes
        self.s_kv = parts.kv_bytes
        self.share_tokens = w.chunk_tokens / k
        layers = self.layers
        self.attend = layers * parts.attention
        self.attend_share = layers * parts.attention_share  # each holder's, on its share
        # a fetch's first attention, on the chunk it has just spliced (partly in cache)
        self.fetch_attend = self.attend - layers * parts.saved
        self.merge = layers * parts.merge
        # route's merge of the k answers and this instance's partial (k + 1; 2 on one holder),
        # for one use's rows (``route_merge_base``) or, batched, for any (``batched_merge``)
        self.partials = k + 1
        self.batched_merge = _Memo(self._batched_merge)
        self.route_merge_base = self.batched_merge[w.rows]
        self.route_merge = layers * parts.route_merge  # after its wait for the answers
        self.move = layers * parts.move
        # where the move runs on the compute (move_on_compute): the splice at the requester
        # and the gather, the rest, at the holder (each holder packs its share)
        self.splice = layers * parts.splice
        self.gather = self.move - self.splice
        self.gather_share = self.gather / k
        self.recompute = layers * parts.recompute  # inf without a prefill cost
        # the least a query adds to a holder's call, however many it joins: its rows' part
        # of T_c (the batched floor of the work a routed use asks of a compute)
        rh = self.rows
        self.query_floor = parts.attention_for(2 * rh) - self.attend
        self.share_floor = parts.attention_for(2 * rh, self.share_tokens) - self.attend_share
        # a top-k request's unique KV, attended at its requester in a call of its own
        self.own = parts.attention_for(rh, w.unique_tokens) if w.unique_tokens else 0.0
        # each message as one message a step (wired round trips of route's), holding its
        # sender's link for its occupancy and in flight after it; k queries leave this link
        # one after another, k answers (and a fetch's k shares) come in through it in turn
        wired = self.wired
        self.send_occ, self.send_fly = wired * parts.query.occupancy, wired * parts.query.flight
        self.back_occ, self.back_fly = wired * parts.answer.occupancy, wired * parts.answer.flight
        self.overheads = {
            "send": wired * parts.query.overhead,
            "back": wired * parts.answer.overhead,
            "kv": parts.kv.overhead,
        }
        self.queries_occ = k * self.send_occ
        self.queries_square, self.back_square = self.queries_occ**2, self.back_occ**2
        self.answers_in = wired * parts.answer.arriving_behind(k - 1)
        self.kv_occ, self.kv_fly = parts.kv.occupancy, parts.kv.flight
        self.kv_in = parts.kv.arriving_behind(k - 1)
        # what the predicate reads on every request, computed once
        self.arrivals_per_instance = w.uses_per_s / w.instances
        self.fetch_once = self.kv_in + self.kv_fly + self.move
        # a use attended here waits for the uses of its request queued here before it (a
        # span request's prefix, its other cached chunks), where a routed one runs beside
        # them at its holder: half its siblings, on average, if they are all here
        self.attend_here = self.attend * (1 + (w.uses_per_request() - 1) / 2)
        # T_c by rows and what a query adds by queued queries, computed on first use and
        # read as dict lookups in the loop
        self.batched = _Memo(self._batched_attend)
        self.joins = _Memo(self._joins_batch)
        # the same for a holder's share (k > 1; on one holder the share is the chunk)
        if k == 1:
            self.batched_share, self.joins_share = self.batched, self.joins
        else:
            self.batched_share = _Memo(self._batched_share)
            self.joins_share = _Memo(self._joins_share)

    def batched_attend(self, rows: int) -> float:
        """T_c for ``rows`` decode tokens' query rows attending the chunk together."""
        return self.batched[rows]

    def joins_batch(self, queued: int) -> float:
        """What one more query adds at a holder where ``queued`` of this chunk wait."""
        return self.joins[queued]

    def _batched_attend(self, rows: int) -> float:
        return self.parts.attention_for(rows * self.w.heads)

    def _batched_merge(self, rows: int) -> float:
        return self.parts.merge_for(rows * self.w.heads, self.partials)

    def _batched_share(self, rows: int) -> float:
        return self.parts.attention_for(rows * self.w.heads, self.share_tokens)

    def _joins_batch(self, queued: int, batched: _Memo | None = None) -> float:
        # (not ``batched or``: a memo nothing has been read from yet is an empty dict)
        rows, batched = self.w.rows, self.batched if batched is None else batched
        grown = batched[(queued + 1) * rows]
        return grown - batched[queued * rows] if queued else grown

    def _joins_share(self, queued: int) -> float:
        return self._joins_batch(queued, self.batched_share)

    def per_use(self) -> dict[str, float]:
        """A use's time by option on idle resources: the record's, as decide prices it."""
        return {"route": self.parts.route, "fetch": self.parts.fetch, "local": self.parts.local}


class _Reuse:
    """What the predicate expects a fetch of chunk k by requester r to serve, from what r
    has seen so far (no oracle: counts, clocks and the workload's declared rate and length).

    - rate of r's uses of k: a Gamma-Poisson posterior mean, ``(a + earlier uses) / (a beta
      + t)``, whose prior is the requester's uses spread evenly over the shared chunks
      (``a = PRIOR_USES`` pseudo-uses, one per ``beta = shared chunks / their uses per
      instance`` seconds), so a first use does not read as an infinite rate;
    - joiners: the uses that arrive while the fetch is on its way, ``rate * T_fetch``; they
      wait for it (half of T_fetch on average) and then attend in place;
    - after: the uses its stay serves. An LRU cache keeps a chunk while it is used again
      within the cache's characteristic time T (Che's approximation), so a stay serves
      ``exp(rate * T) - 1`` uses on average (geometric), and never more than the rate over
      what is left of the workload. T is measured: the mean idle age of the chunks this
      requester's cache evicted (0 without a cache). Before its first eviction it comes
      from the chunks that compete for the cache: the predicate fetches a chunk for its
      reuse, so those whose rate may read as k's or more are fetched first. With n of them
      and C places, Che's ``n (1 - exp(-rate T)) = C`` (their rates taken as k's)
      gives ``exp(rate T) - 1 = C / (n - C)``; when they all fit (n <= C) the stay lasts.
    """

    def __init__(self, w: Workload, start: float, end: float):
        self.beta = w.shared_chunks * w.instances / w.shared_uses_per_s
        self.start, self.end = start, end
        # per requester, its uses of each chunk held elsewhere (a chunk here is never decided)
        self.uses: list[dict[int, int]] = [{} for _ in range(w.instances)]
        self.places = w.cache_chunks
        shared = w.shared_chunks
        # the fewest any requester has (spread over k > 1 holders, none is whole anywhere)
        self.remote = shared - math.ceil(shared / w.instances) if w.holders == 1 else shared
        self.evicted_age = [0.0] * w.instances  # sum of idle ages at eviction
        self.evictions = [0] * w.instances
        # per requester, how many remote chunks it has used at least n times, by n (uses
        # only grow by one, so a use moves one chunk up one count: O(1), no sorted list)
        self.at_least: list[list[int]] = [[0] for _ in range(w.instances)]

    def used(self, me: int, k: int) -> None:
        """A use at ``me`` of chunk k held elsewhere (only those are ever decided)."""
        uses = self.uses[me]
        before = uses.get(k, 0)
        uses[k] = before + 1
        at_least = self.at_least[me]
        if len(at_least) <= before + 1:
            at_least.append(0)
        at_least[before + 1] += 1

    def evicted(self, me: int, idle_age: float) -> None:
        self.evicted_age[me] += idle_age
        self.evictions[me] += 1

    def expect(self, me: int, k: int, now: float, fetch_time: float) -> tuple[float, float]:
        """(joiners, after): the uses a fetch started now would also serve."""
        # uses counts this one: it is why we ask now, not evidence of the rate (a rate read
        # at arrival instants, counting them, reads high)
        earlier = self.uses[me][k] - 1
        rate = (PRIOR_USES + earlier) / (PRIOR_USES * self.beta + now - self.start)
        # (comparisons, not min() and max(): this runs on every decision)
        left = self.end - now
        left = left if left > 0.0 else 0.0
        joiners = rate * (fetch_time if fetch_time < left else left)
        if not self.places:
            return joiners, 0.0
        in_time = rate * (left - fetch_time) if left > fetch_time else 0.0
        evictions = self.evictions[me]
        if evictions:
            x = rate * self.evicted_age[me] / evictions
            if x > 30:
                return joiners, in_time
            stay = math.expm1(x)
            return joiners, stay if stay < in_time else in_time
        # rivals: the remote chunks whose rate may read as k's (k among them): counts
        # within one Poisson standard deviation below k's earlier uses; a chunk not used yet
        # reads the prior's rate, as k does at its first use
        floor = math.ceil(earlier - math.sqrt(earlier + 1))
        at_least = self.at_least[me]
        if floor <= 0:
            rivals = self.remote
        else:
            rivals = at_least[floor] if floor < len(at_least) else 0
        if rivals <= self.places:
            return joiners, in_time
        stay = self.places / (rivals - self.places)
        return joiners, stay if stay < in_time else in_time


def _predicate(
    costs,
    per_use,
    joiners,
    after,
    wait_me,
    wait_holder,
    link_me,
    link_holder,
    holder_adds,
    idle_holder=0.0,
    idle_me=0.0,
    queue_me=0.0,
    queue_holder=0.0,
    messages_holder=None,
    messages_me=None,
    route_links=0.0,
) -> str:
    """The cost model's choice for one use, with the backlogs each option would wait on.

    Options are weighed over the ``1 + joiners + after`` uses a fetch would serve
    (:func:`_route_price`, :func:`_fetch_price`; local recomputes here and routes the later
    uses as route does). Route or local: this use pays its option with today's backlogs,
    and the later uses are routed as the model prices a use at the resources' steady-state
    waits, not today's backlogs (they drain): ``queue_holder`` for its attention at the
    holder and ``queue_me`` for its merge back here, where a later use of a fetched chunk
    waits only ``queue_me`` (a route queues on two cores, a use in place on one; counting
    neither left the predicate far worse than the better static policy on CPU workloads,
    whose long attentions made the merge wait). The joiners arrive within one fetch's
    time, too soon for today's backlogs to drain: routed, each waits what the holder's and
    this core's backlogs hold above their steady state; fetched, what this core's holds.

    Each option also pays for the work it adds to a busy server now: every job that
    arrives there while that server's backlog drains waits that much longer (the jobs per
    second it takes, times the backlog, times the work added). On a compute, the arrivals
    per instance; on a link, the messages it has carried per second so far
    (``messages_holder``, ``messages_me``; the arrivals per instance where not given).
    ``route_links``: what each later routed use also waits on the two links if every use
    routed (``Simulation.routed_links``): nothing while they keep up with the holder's
    compute, the growth of their backlog where routing would overload them (links idle
    only because the trace has just begun do not read as free). ``idle_holder`` and
    ``idle_me``: how long each core has idled (0 when it has work), for the extra a call
    pays after idle (the device's ``after_idle``; 0 without it).
    """
    lam = costs.arrivals_per_instance
    on_holder_link = lam if messages_holder is None else messages_holder
    on_my_link = lam if messages_me is None else messages_me
    later = joiners + after
    above_holder = wait_holder - queue_holder if wait_holder > queue_holder else 0.0
    above_me = wait_me - queue_me if wait_me > queue_me else 0.0
    route_later = later * (per_use["route"] + queue_holder + queue_me + route_links)
    route_later += joiners * (above_holder + above_me)
    route = _route_price(
        costs, per_use["route"], joiners, wait_me, wait_holder, link_me, link_holder,
        holder_adds, idle_holder, route_later, on_holder_link, on_my_link,
    )  # fmt: skip
    fetch = _fetch_price(
        costs, joiners, later, wait_me, wait_holder, link_holder, idle_me, queue_me, above_me,
        on_holder_link,
    )  # fmt: skip
    local_work = costs.recompute + costs.attend
    local = local_work + wait_me + lam * (wait_me + local_work) * local_work + route_later
    local += costs.device.after_idle(idle_me) if idle_me else 0.0
    # the cheapest; ties go to fetch, then local (as min over (time, name) pairs would)
    if fetch <= route and fetch <= local:
        return "fetch"
    return "local" if local <= route else "route"


def _route_price(
    costs, route_use, joiners, wait_me, wait_holder, link_me, link_holder, holder_adds,
    idle_holder, route_later, on_holder_link, on_my_link,
):  # fmt: skip
    """Route's price for this use and its later ones (``route_later``): the use's time
    behind today's backlogs; its answer, and each joiner's, behind what the holder's link
    still holds once its attention is done, its query behind what this link holds; the
    holder's call after idle; and what it adds to busy servers: ``holder_adds`` to the
    holder's compute (the growth of the batched call it joins there, far less than T_c
    when queries of this chunk are already queued), its and its joiners' answers to the
    holder's link and queries to this one. With k holders, each takes a query's share and
    sends an answer: the holder given stands for all k."""
    lam, shares = costs.arrivals_per_instance, costs.shares
    route = route_use + wait_holder + wait_me
    # later uses find the links drained
    answer_wait = link_holder - wait_holder - costs.attend_share
    answer_wait = answer_wait if answer_wait > 0.0 else 0.0
    route += (link_me + answer_wait) * (1 + joiners)
    route += costs.device.after_idle(idle_holder) if idle_holder else 0.0
    route += shares * (lam * (wait_holder + holder_adds) * holder_adds) + route_later
    answers = (1 + joiners) * costs.back_occ
    queries = (1 + joiners) * costs.queries_occ
    route += shares * (on_holder_link * (link_holder + answers) * answers)
    return route + on_my_link * (link_me + queries) * queries


def _fetch_price(
    costs, joiners, later, wait_me, wait_holder, link_holder, idle_me, queue_me, above_me,
    on_holder_link,
):  # fmt: skip
    """Fetch's price over the uses it serves: this use pays the transfer and the move
    behind the holder's link backlog, the joiners wait for the rest of it (half, on
    average), and every use attends here, a later one behind its request's other uses
    (``attend_here``, which routing would have run in parallel) at this core's steady
    wait; the chunk's time on the holder's link (each of the k holders' shares) delays
    what that link carries; this core's call after idle, once the chunk lands. Where the
    move runs on the compute (``move_on_compute``), the gather waits behind the holder's
    backlog and adds to it, and the splice adds to this core's."""
    lam = costs.arrivals_per_instance
    first = link_holder + costs.fetch_once
    here = costs.fetch_attend
    fetch = costs.shares * (on_holder_link * (link_holder + costs.kv_occ) * costs.kv_occ)
    if costs.w.move_on_compute:
        first += wait_holder
        fetch += lam * (wait_holder + costs.gather) * costs.gather
        here += costs.splice
    fetch += first * (1 + joiners / 2) + costs.merge + wait_me + costs.fetch_attend
    fetch += costs.device.after_idle(idle_me + first) if idle_me else 0.0
    fetch += later * (costs.attend_here + queue_me) + joiners * above_me
    return fetch + lam * (wait_me + here) * here


class _Servers:
    """One FIFO server per instance: the jobs queued, the work they hold, when the running
    one ends and its busy time. Its two kinds (``_Computes``, ``_Links``) say when one is
    free and what else they tally for the predicate; the loop starts a job offered to a free
    server at once and queues (``add``) only behind a running one (an ``offer`` method
    doing both would cost one more call per job on the simulator's hottest path)."""

    def __init__(self, n: int):
        self.queue = [deque() for _ in range(n)]
        self.free_at = [0.0] * n
        self.backlog = [0.0] * n
        self.time = [0.0] * n  # busy time (a list: numpy scalars are slow in this loop)

    def add(self, i: int, job, work: float) -> None:
        """Queue ``job`` behind the running one (a free server starts a job at once)."""
        self.queue[i].append(job)
        self.backlog[i] += work

    def wait(self, i: int, now: float) -> float:
        """What a job queued now would wait: the running job's rest and the queued work."""
        rest = self.free_at[i] - now  # (a comparison, not max(): this runs per request)
        return (rest if rest > 0.0 else 0.0) + self.backlog[i]


class _Computes(_Servers):
    """Each instance's compute (one core, or one GPU's SMs): busy until the event at its
    job's end, which starts the next (so a compute that is not busy has nothing queued),
    with the sum of its jobs' squared times for its steady-state wait, and a prior of
    ``prior_jobs`` jobs of ``prior_work`` s counted beside its own so its first jobs do not
    read as its load."""

    def __init__(self, n: int, prior_jobs: int = 0, prior_work: float = 0.0):
        super().__init__(n)
        self.busy = [False] * n
        self.square = [0.0] * n
        self.prior_time = prior_jobs * prior_work
        self.prior_square = prior_jobs * prior_work * prior_work

    def run(self, i: int, now: float, work: float) -> float:
        """Start ``work`` now (its job already taken off the queue); returns when it ends."""
        self.busy[i] = True
        end = self.free_at[i] = now + work
        self.time[i] += work
        self.square[i] += work * work
        return end

    def overload(self, i: int, span: float, asked: float = 0.0) -> float:
        """The work asked of compute i a second beyond one second's (0 while it keeps up):
        what it ran and what it holds queued, or ``asked`` where that is more (work on its
        way), the prior's counted beside them, over ``span``."""
        work = self.time[i] + self.backlog[i]
        load = ((asked if asked > work else work) + self.prior_time) / span
        return load - 1.0 if load > 1.0 else 0.0

    def steady_wait(self, i: int, span: float) -> float:
        """The mean wait of a job arriving at a random time (``_delay``) from the jobs
        started over ``span`` s, the prior's counted beside them."""
        return _delay(self.time[i] + self.prior_time, self.square[i] + self.prior_square, span)


class _Links(_Servers):
    """Each instance's egress link: free once its message has left and none waits
    (``Simulation.to_link``), with the messages it carried, read as a rate with
    ``prior_jobs`` counted beside them."""

    def __init__(self, n: int, prior_jobs: int = 0):
        super().__init__(n)
        self.jobs = [0] * n
        self.prior_jobs = prior_jobs

    def run(self, i: int, now: float, work: float) -> float:
        """Put ``work`` on the wire now; returns when it has left."""
        end = self.free_at[i] = now + work
        self.time[i] += work
        self.jobs[i] += 1
        return end

    def rate(self, i: int, span: float) -> float:
        """Messages started per second over ``span`` s, the prior's counted beside them."""
        return (self.jobs[i] + self.prior_jobs) / span


def _delay(work: float, square: float, span: float, horizon: float = 0.0) -> float:
    """The mean wait of a job arriving at a random time within ``horizon`` s from now at a
    server that took ``work`` s of jobs (their squares summing to ``square``) over ``span``
    s: Pollaczek-Khinchine's M/G/1 wait, rate x E[S^2] / (2 (1 - busy)), busy capped at
    ``BUSY_CAP``, and, past capacity, the backlog's growth by (load - 1) s a second, met
    halfway through the horizon on average (0: the steady wait alone)."""
    load = work / span
    busy = load if load < BUSY_CAP else BUSY_CAP
    wait = square / (2 * span * (1 - busy))
    return wait + (load - 1.0) * horizon / 2 if load > 1.0 else wait


@dataclass
class Result:
    latency: np.ndarray  # s per request
    path: np.ndarray  # index into PATHS
    makespan: float
    compute_busy: np.ndarray  # s per instance
    link_busy: np.ndarray  # s per instance (egress)
    bytes_moved: float
    batches: int
    batched_rows: int


# ---- the engine: jobs, messages, policies, effects, and one handler per event kind ----


@dataclass(slots=True)
class Job:
    """Work for one of an instance's servers: its compute (one core or one GPU's SMs) or
    its egress link (a message on the wire). A delivered message turns into the compute
    job it asks for (one record per step of a use's path would cost the loop a
    constructor call per step)."""

    # on the compute: "attend": uses of one chunk attended in one batched call (routed
    #   queries and uses in place alike); "done": a routed use's merge once its answer is
    #   back; "fetched": a fetched chunk's attention and merge (and splice, where the move
    #   runs on the compute); "local": recompute the chunk and attend; "gather": the holder
    #   packs a chunk to send (move on the compute); "messages": taking in arrivals or
    #   messages on an idle core; "own": a top-k request's unique KV, attended at its
    #   requester (no other request shares it).
    # on a link: "send": a routed query, to its holder; "back": its answer, to its
    #   requester; "kv": a fetched chunk, to its requester
    kind: str
    # the use it serves; a started attention: the list of uses its call batched
    req: object
    # s on the server: a compute job's time as queued (an attention's: what it adds to the
    # batch it joins), a message's time on the wire (alpha in flight follows)
    work: float
    # a message's destination where its kind does not say it (a query to one of k holders)
    to: int = -1


# the jobs that attend: they pay what the device measured for starting after idle, and
# take the next of the measured spread's factors
ATTENDS = frozenset(("attend", "part", "fetched", "local", "own"))


class Policy:
    """How a use is served when its chunk is neither here nor on its way here."""

    def choose(self, sim: Simulation, r: int, me: int, k: int, holder: int, now: float) -> str:
        """The path of use ``r`` of chunk ``k`` asked at ``me``: route, fetch or local."""
        raise NotImplementedError


class Always(Policy):
    """One path for every use (a static policy)."""

    def __init__(self, path: str):
        self.path = path

    def choose(self, sim, r, me, k, holder, now):
        return self.path


class Predicate(Policy):
    """The cost model's choice (``_predicate``) with the backlogs each option would wait on
    now, the uses a fetch would also serve (``_Reuse``), each core's steady-state wait and
    the messages each link has carried per second (``PRIOR_USES`` at the workload's rate of
    arrivals counted beside them, so a link's first messages read as that rate)."""

    def choose(self, sim, r, me, k, holder, now):
        costs, compute, link = sim.costs, sim.compute, sim.link
        link_holder = link.wait(holder, now)
        if sim.spread_over is None:
            adds = costs.joins[sim.c_attq[holder].get(k, 0)]
        else:  # a query joins the holder's call over its share
            adds = costs.joins_share[sim.c_attq[holder].get(~k, 0)]
        joiners, after = sim.reuse.expect(me, k, now, link_holder + costs.fetch_once)
        idle_holder = idle_me = 0.0
        if sim.cold:
            idle_holder, idle_me = sim.idled(holder, now), sim.idled(me, now)
        # the steady-state waits, with the prior's attentions counted beside the jobs
        span = now - sim.start + sim.prior_span
        wait_holder = compute.wait(holder, now)
        return _predicate(
            costs,
            sim.per_use,
            joiners,
            after,
            compute.wait(me, now),
            wait_holder,
            link.wait(me, now),
            link_holder,
            adds,
            idle_holder,
            idle_me,
            compute.steady_wait(me, span),
            compute.steady_wait(holder, span),
            link.rate(holder, span),
            link.rate(me, span),
            sim.routed_links(me, holder, now, span, wait_holder),
        )


class Follow(Policy):
    """The paths another run chose, use by use (PATHS names); a use that run found present
    and this one does not is routed (as the replay does)."""

    def __init__(self, decisions):
        self.decisions = decisions

    def choose(self, sim, r, me, k, holder, now):
        choice = self.decisions[r]
        return choice if choice in ("route", "fetch", "local") else "route"


# the policies ``simulate`` knows, by name
POLICIES: dict[str, Callable[[], Policy]] = {
    "route": lambda: Always("route"),
    "fetch": lambda: Always("fetch"),
    "local": lambda: Always("local"),
    "predicate": Predicate,
}


class Simulation:
    """One run of a trace: the servers, caches and fetches in flight, the event heap, and
    one handler per event kind (an arrival, a link done, a message delivered, a move done,
    a compute job done), each returning nothing and pushing the events it causes. The
    effects measured on real runs that stretch a job (message cost, spread, idle, merge
    after a wait) are named methods, applied where a job starts when the profile or the
    run has them (``stretches``)."""

    # slots: the loop reads these attributes millions of times (a plain instance with this
    # many attributes loses Python's fast attribute access)
    __slots__ = (
        "_compute_done",
        "_link_done",
        "_moved",
        "arrived",
        "asked",
        "batched_rows",
        "batches",
        "between_jobs",
        "c_attq",
        "caches",
        "chunks",
        "cold",
        "compute",
        "computed_until",
        "costs",
        "delivery",
        "device",
        "events",
        "handling",
        "holders",
        "inbox",
        "ingress",
        "last",
        "latency",
        "link",
        "message_cost",
        "moved",
        "n",
        "on_arrival",
        "on_delivered",
        "overhead",
        "path",
        "pending",
        "per_use",
        "policy",
        "prior_span",
        "remaining",
        "remote_in",
        "remote_out",
        "requesters",
        "reuse",
        "seq",
        "shared",
        "spread",
        "spread_over",
        "start",
        "stretches",
        "times",
        "varied",
        "w",
        "waking",
    )

    def __init__(self, profile, w: Workload, trace: Trace, policy: Policy, spread, message_cost):
        costs = self.costs = _Costs(profile, w)
        n, inst = len(trace), w.instances
        self.w, self.n, self.policy = w, n, policy
        self.per_use = costs.per_use()
        # lists while the loop writes them (a numpy element write is slower), arrays after
        self.latency = [0.0] * n
        self.path = [0] * n
        self.caches = [OrderedDict() for _ in range(inst)]  # chunk -> when it was last used
        # the workload's declared length: as long as its requests take at its rate
        self.start = float(trace.arrival[0]) if n else 0.0
        self.reuse = _Reuse(w, self.start, self.start + n / w.uses_per_s)
        # per requester, the fetches in flight to it: chunk -> the uses waiting for it
        self.pending: list[dict[int, list]] = [{} for _ in range(inst)]
        # the servers' priors: PRIOR_USES attentions on each compute, messages on each link
        self.compute = _Computes(inst, PRIOR_USES, costs.attend)
        self.link = _Links(inst, PRIOR_USES)
        # per link, whether an event at its running message's end will start the next
        self.waking = [False] * inst
        self.c_attq = [{} for _ in range(inst)]  # attentions queued per chunk (routed or here)
        # per instance, the uses asked here of chunks elsewhere (the queries it would send),
        # and those asked elsewhere of its chunks (the answers it would send), were all routed
        self.remote_out, self.remote_in = [0] * inst, [0] * inst
        # and the attention work those uses would ask of each compute, at least: counted at
        # arrival as the links' messages are, so both loads read over the same span
        self.asked = [0.0] * inst
        self.events: list = []  # (time, seq, handler, instance, what)
        # ties in time break by push order (handlers never compare): a C-level counter
        self.seq = itertools.count().__next__
        self.moved = 0.0
        self.batches = self.batched_rows = 0
        self.last = 0.0  # when the last use ended
        self.times = trace.arrival.tolist()
        self.requesters, self.chunks = trace.requester.tolist(), trace.chunk.tolist()
        holder = trace.holder if trace.holder is not None else trace.chunk % inst
        self.holders = holder.tolist()  # each use's chunk's (first) holder
        self._spread_chunks(w, n)
        # where and after how long (alpha in flight) each kind of message lands
        self.delivery = {
            "send": (costs.send_fly, self.holders),
            "back": (costs.back_fly, self.requesters),
            "kv": (costs.kv_fly, self.requesters),
        }
        self.device = costs.device
        self._one_core_each(w, spread, message_cost)

    def _spread_chunks(self, w: Workload, n: int) -> None:
        """k holders: a shared chunk whose first holder is b lies on b, b + 1, ..., b + k - 1
        (mod instances), a share on each; a requester's own chunk (a span's prefix, ids from
        ``shared`` on) stays whole with it. Messages then also pass their destination's
        ingress, one after another (``ingress``: when each is next free), as the cost model
        counts k answers or shares sharing the requester's link."""
        k, inst = w.holders, w.instances
        if not 1 <= k <= inst:
            raise ValueError(f"holders = {k}: between 1 and the {inst} instances")
        self.shared = w.shared_chunks
        if k == 1:
            self.spread_over = self.ingress = self.remaining = None
        else:
            self.spread_over = [tuple((b + j) % inst for j in range(k)) for b in range(inst)]
            self.ingress = [0.0] * inst
            self.remaining = [0] * n  # per use: the answers or shares it still waits for

    def _one_core_each(self, w: Workload, spread, message_cost: float) -> None:
        """Where the move runs on the compute, the handlers that keep one core per instance
        busy taking arrivals and messages in; and the effects that stretch a job where it
        starts, those this profile and run have (``stretches``)."""
        inst, device = w.instances, self.device
        self.cold = device.idle_extra is not None
        # one core per instance (as CPU ranks): it computes and it takes messages in, so what
        # arrives while it runs a job waits for the job's end (``arrived``, ``inbox``)
        self.between_jobs = w.move_on_compute
        self.arrived: list[list] = [[] for _ in range(inst)]
        self.inbox: list[list] = [[] for _ in range(inst)]
        # the handlers, bound once (the heap holds one per event)
        self._compute_done, self._link_done = self.on_compute_done, self.on_link_done
        self._moved = self.on_moved
        self.on_arrival = self._arrival_between_jobs if self.between_jobs else self.arrive
        self.on_delivered = self._delivered_between_jobs if self.between_jobs else self.receive
        # taking an arrival or a message in costs such a core message_cost, charged to the
        # next job it starts
        self.message_cost = message_cost
        self.handling = self.between_jobs and message_cost > 0
        self.overhead = [0.0] * inst
        # when each core's last job (not taking messages in) ended: idle since before the trace
        self.computed_until = [-math.inf] * inst
        self.spread, self.varied = spread, [0] * inst  # attending calls drawn a factor for
        # the steady-state waits' prior: PRIOR_USES attentions at the workload's rate
        self.prior_span = PRIOR_USES / self.costs.arrivals_per_instance
        self.stretches = [
            effect
            for effect, on in (
                (self._message_overhead, self.handling),
                (self._spread, bool(spread)),
                (self._after_idle, self.cold),
                (self._merge_after_wait, device.merge_wait_tau is not None),
            )
            if on
        ]

    # ---- what the policies read ----

    def routed_links(self, me: int, holder: int, now: float, span: float, wait_holder) -> float:
        """What a later routed use of ``holder``'s chunk, asked at ``me``, would wait on
        the two links if every use routed (the queries and answers counted at arrival,
        ``remote_out`` and ``remote_in``), beyond what the holder's compute makes it wait
        anyway: both links' steady waits and, where a link would be overloaded, its
        backlog's growth, met over what is left of the workload (``_delay``; its query
        crosses one link, its answer the other, each growing with its own traffic). A query
        and its answer pass the links and the holder's compute in tandem, so the compute's
        backlog now and its own growth hide as much of the links' wait: the growth from the
        work it ran and holds (``overload``: the prior's attentions counted beside its jobs,
        so a compute with none yet does not read as idle) or, where more, from the work the
        uses asked so far would bring it (``asked``, counted at arrival as the links'
        messages are: where requests come at once, the queries still crossing the links are
        work the compute has not seen yet)."""
        left = self.reuse.end - now
        left = left if left > 0.0 else 0.0
        costs, links = self.costs, 0.0
        q, a, q2, a2 = costs.queries_occ, costs.back_occ, costs.queries_square, costs.back_square
        for i in (holder, me):  # its queries and answers, PRIOR_USES of each beside them
            queries, answers = self.remote_out[i] + PRIOR_USES, self.remote_in[i] + PRIOR_USES
            links += _delay(queries * q + answers * a, queries * q2 + answers * a2, span, left)
        hidden = wait_holder + self.compute.overload(holder, span, self.asked[holder]) * left / 2
        return links - hidden if links > hidden else 0.0

    def idled(self, i: int, now: float) -> float:
        """How long core i has idled since its last job (0 while it has work)."""
        return 0.0 if self.compute.busy[i] else now - self.computed_until[i]

    # ---- the effects that stretch a job where it starts, each as measured ----

    def _message_overhead(self, i: int, job: Job, dur: float, now: float) -> float:
        """What taking messages in cost this core since its last job."""
        extra = self.overhead[i]
        if extra:
            self.overhead[i] = 0.0
            return dur + extra
        return dur

    def _spread(self, i: int, job: Job, dur: float, now: float) -> float:
        """An attending call takes this instance's next measured factor, in the order they
        ran (cycling), so slow stretches come in runs as they did."""
        if job.kind not in ATTENDS:
            return dur
        factors = self.spread[i % len(self.spread)]
        dur *= factors[self.varied[i] % len(factors)]
        self.varied[i] += 1
        return dur

    def _after_idle(self, i: int, job: Job, dur: float, now: float) -> float:
        """The first attending call after idle pays for the cold core."""
        if job.kind not in ATTENDS:
            return dur
        return dur + self.device.after_idle(now - self.computed_until[i])

    def _merge_after_wait(self, i: int, job: Job, dur: float, now: float) -> float:
        """A merge after its core waited (for this answer or anything) takes what the device
        measured after a wait; one that follows other work is the merge as costed."""
        if job.kind != "done" or now <= self.computed_until[i]:
            return dur
        wait = now - self.computed_until[i]
        costs = self.costs
        # every layer's merge after its share of the step's wait (one layer: all of it)
        merged = costs.parts.merge_after_wait_for(costs.rows, costs.partials, wait / costs.wired)
        return dur + (merged - costs.route_merge_base)

    # ---- the servers ----

    def take_in(self, i: int, now: float) -> None:
        """An arrival or a message taken in at core i: between its jobs when it computes
        (charged to the next job), else at once (the core busy meanwhile)."""
        if self.compute.busy[i]:
            self.overhead[i] += self.message_cost
        else:
            self.to_compute(i, Job("messages", -1, self.message_cost), now)

    def _batch(self, i: int, job: Job, k: int | None = None) -> int:
        """Take the jobs of the job's kind queued at i into its call (up to the batch's
        rows, in queue order): attentions of chunk ``k`` (the whole chunk, or a holder's
        share of it), or any merge (``k`` None); ``job.req`` becomes the list of their uses.
        Returns how many were taken."""
        w, compute = self.w, self.compute
        members, kind, chunks = [job.req], job.kind, self.chunks
        room = w.max_batch_rows // w.rows - 1  # calls of at most max_batch_rows
        keep = deque()
        queue = compute.queue[i]
        while queue:
            other = queue.popleft()
            if (
                other.kind == kind
                and (k is None or chunks[other.req] == k)
                and len(members) <= room
            ):
                members.append(other.req)
                compute.backlog[i] -= other.work
            else:
                keep.append(other)
        compute.queue[i] = keep
        job.req = members
        return len(members) - 1

    def start_compute(self, i: int, now: float, job: Job | None = None) -> None:
        """Start core i's next queued job, or ``job`` at once (an idle core has none queued).
        An attention takes every queued attention of its chunk into one call."""
        compute = self.compute
        if job is None:
            job = compute.queue[i].popleft()
            compute.backlog[i] -= job.work
        kind = job.kind
        if kind == "attend" or kind == "part":
            c_attq = self.c_attq[i]
            r = job.req
            k = self.chunks[r]
            if kind == "attend":
                key, batched = k, self.costs.batched
            else:  # a holder's share
                key, batched = ~k, self.costs.batched_share
            queued = c_attq[key] - 1
            if queued:  # others of this chunk are queued: they join this call
                joined = self._batch(i, job, k)
                c_attq[key] = queued - joined
                rows = (joined + 1) * self.w.rows
            else:
                c_attq[key] = 0
                job.req = [r]
                rows = self.w.rows
            self.batches += 1
            self.batched_rows += rows
            job.work = dur = batched[rows]
        elif kind == "done" and self.w.batch_merges:  # the answers queued here, one call
            self._batch(i, job)
            job.work = dur = self.costs.batched_merge[len(job.req) * self.w.rows]
        else:
            dur = job.work
        if self.stretches:
            for stretch in self.stretches:
                dur = stretch(i, job, dur, now)
        seq = self.seq()
        end = compute.run(i, now, dur)
        if kind != "messages":
            self.computed_until[i] = end
        _push(self.events, (end, seq, self._compute_done, i, job))

    def to_compute(self, i: int, job: Job, now: float) -> None:
        if self.compute.busy[i]:
            self.compute.add(i, job, job.work)
        else:  # an idle core has nothing queued (_Servers): the job starts at once
            self.start_compute(i, now, job)

    def to_attend(
        self, i: int, r: int, now: float, query: Job | None = None, part: bool = False
    ) -> None:
        """Queue use r's attention over its chunk at instance i (the holder of a routed
        ``query``, or the requester where the chunk is present); it joins the batched call
        of the attentions of that chunk queued there, and adds what that call grows by.
        ``part``: over i's share of the chunk (k holders), batched with the other shares'."""
        c_attq = self.c_attq[i]
        k = self.chunks[r]
        if part:
            key, kind, joins = ~k, "part", self.costs.joins_share
        else:
            key, kind, joins = k, "attend", self.costs.joins
        queued = c_attq.get(key, 0)
        c_attq[key] = queued + 1
        work = joins[queued]
        if query is None:
            job = Job(kind, r, work)
        else:
            job = query
            job.kind, job.work = kind, work
        if self.compute.busy[i]:
            self.compute.add(i, job, job.work)
        else:
            self.start_compute(i, now, job)

    def start_link(self, i: int, now: float, msg: Job | None = None) -> None:
        """Put link i's next queued message on the wire, or ``msg`` at once (an idle link
        has none queued): it lands after its time on the wire and its flight (and after its
        destination's ingress let it through, where that is modelled)."""
        link = self.link
        if msg is None:
            msg = link.queue[i].popleft()
            link.backlog[i] -= msg.work
        flight, dest = self.delivery[msg.kind]
        seq = self.seq()
        end = link.run(i, now, msg.work)
        ingress = self.ingress
        if ingress is None:
            _push(self.events, (end + flight, seq, self.on_delivered, dest[msg.req], msg))
            return
        # its bytes (after its overhead, at the sender) pass its destination's ingress after
        # those of the messages before them
        if msg.to < 0:  # where its kind sends it (a query's holder is set when sent)
            msg.to = dest[msg.req]
        to, overhead = msg.to, self.costs.overheads[msg.kind]
        begin = now + overhead
        if ingress[to] > begin:
            begin = ingress[to]
        through = ingress[to] = begin + msg.work - overhead
        if through < end:
            through = end
        _push(self.events, (through + flight, seq, self.on_delivered, to, msg))

    def to_link(self, i: int, msg: Job, now: float) -> None:
        """A message on link i: on the wire now, or queued behind those on it or waiting,
        with one event at the running message's end to start the next (a message that finds
        its link idle, most of them, costs no event for its end)."""
        link = self.link
        if link.queue[i] or link.free_at[i] > now:
            link.add(i, msg, msg.work)
            if not self.waking[i]:
                self.waking[i] = True
                _push(self.events, (link.free_at[i], self.seq(), self._link_done, i, None))
        else:
            self.start_link(i, now, msg)

    # ---- the paths a use takes ----

    def route(self, me: int, r: int, holder: int, now: float) -> None:
        """The query leaves on the requester's link; with k holders, one to each (this
        instance's own share, where it holds one, attended here beside them)."""
        costs = self.costs
        if self.spread_over is None:
            self.moved += costs.s_q + costs.s_o
            self.to_link(me, Job("send", r, costs.send_occ), now)
            return
        targets = self.spread_over[self.holders[r]]
        self.remaining[r] = len(targets)
        for h in targets:
            if h != me:
                self.moved += costs.s_q + costs.s_o
                self.to_link(me, Job("send", r, costs.send_occ, h), now)
        if me in targets:
            self.to_attend(me, r, now, part=True)

    def fetch(self, me: int, r: int, holder: int, now: float) -> None:
        """The holder gathers the chunk on its compute (where the move runs there) and sends
        it; the uses arriving meanwhile wait for it. With k holders, each sends its share
        (those this instance lacks)."""
        costs = self.costs
        self.pending[me][self.chunks[r]] = []
        if self.spread_over is None:
            targets = (holder,)
        else:
            targets = [h for h in self.spread_over[self.holders[r]] if h != me]
            self.remaining[r] = len(targets)
        self.moved += costs.s_kv * len(targets) / self.w.holders
        for h in targets:
            if self.w.move_on_compute:
                if self.handling:  # the request taken in at the holder
                    self.take_in(h, now)
                self.to_compute(h, Job("gather", r, costs.gather_share), now)
            else:
                self.to_link(h, Job("kv", r, costs.kv_occ), now)

    def local(self, me: int, r: int, holder: int, now: float) -> None:
        costs = self.costs
        self.to_compute(me, Job("local", r, costs.recompute + costs.attend), now)

    # ---- one handler per event kind ----

    def _arrival_between_jobs(self, r: int, now: float) -> None:
        """Use r at its requester's core: taken in now, or when the job it runs ends."""
        me = self.requesters[r]
        if self.compute.busy[me]:
            self.arrived[me].append(r)
        else:
            self.arrive(r, now)

    def arrive(self, r: int, now: float) -> None:
        """Use r taken in at its requester: used in place, waited for, or decided."""
        me, k = self.requesters[r], self.chunks[r]
        if self.handling:
            self.take_in(me, now)
        if k == OWN:  # a top-k request's unique KV: here, in a call of its own
            self.asked[me] += self.costs.own
            self.to_compute(me, Job("own", r, self.costs.own), now)
            return
        holder = self.holders[r]
        spread = self.spread_over
        if spread is None:  # whole on its holder, who would attend it here or there
            home = holder == me
            self.asked[holder] += self.costs.query_floor
            if not home:  # were it routed: a query from here, an answer from there
                self.remote_out[me] += 1
                self.remote_in[holder] += 1
        else:
            home = self._asked_of_shares(me, k, holder)
        if not home:
            self.reuse.used(me, k)
            cache = self.caches[me]
            if k in cache:
                cache[k] = now
                cache.move_to_end(k)
            else:
                waiting = self.pending[me].get(k)
                if waiting is not None:  # on its way here: wait for it, then attend here
                    self.path[r] = 0
                    waiting.append(r)
                    return
                if spread is not None:  # the policy weighs the holder a route waits on longest
                    holder = self._slowest(me, spread[holder], now)
                choice = self.policy.choose(self, r, me, k, holder, now)
                if choice == "route":
                    self.path[r] = 1
                    self.route(me, r, holder, now)
                elif choice == "fetch":
                    self.path[r] = 2
                    self.fetch(me, r, holder, now)
                else:
                    self.path[r] = 3
                    self.local(me, r, holder, now)
                return
        self.path[r] = 0
        self.to_attend(me, r, now)

    def _asked_of_shares(self, me: int, k: int, holder: int) -> bool:
        """Chunk k spread over k holders from ``holder``: counts what a use from ``me``
        would ask of them were it routed, and returns whether it is here whole (a
        requester's own chunk, which k holders do not share)."""
        if holder == me and k >= self.shared:
            self.asked[me] += self.costs.query_floor
            return True
        self.remote_out[me] += 1
        floor = self.costs.share_floor
        for h in self.spread_over[holder]:
            self.asked[h] += floor  # a requester holding a share attends it in place
            if h != me:
                self.remote_in[h] += 1
        return False

    def _slowest(self, me: int, targets: tuple, now: float) -> int:
        """Of a chunk's holders other than ``me``, the one whose compute and link hold the
        most work now (a routed use waits for its slowest answer)."""
        compute, link = self.compute, self.link
        slowest, most = -1, -1.0
        for h in targets:
            if h != me:
                held = compute.wait(h, now) + link.wait(h, now)
                if held > most:
                    slowest, most = h, held
        return slowest

    def on_link_done(self, i: int, _, now: float) -> None:
        """Link i's message has left and others wait: the next goes on the wire, and, if
        more wait behind it, its end starts theirs."""
        self.start_link(i, now)
        link = self.link
        if link.queue[i]:
            _push(self.events, (link.free_at[i], self.seq(), self._link_done, i, None))
        else:
            self.waking[i] = False

    def _delivered_between_jobs(self, i: int, msg: Job, now: float) -> None:
        """A message at core i: taken in now, or when the job it runs ends."""
        if self.compute.busy[i]:
            self.inbox[i].append(msg)
        else:
            self.receive(i, msg, now)

    def receive(self, i: int, msg: Job, now: float) -> None:
        if self.handling:  # a message taken in on the rank's core
            self.take_in(i, now)
        kind, costs, remaining = msg.kind, self.costs, self.remaining
        if kind == "send":  # the query joins the batched call of its chunk (share) here
            self.to_attend(i, msg.req, now, msg, remaining is not None)
            return
        if remaining is not None:  # k holders: the last answer or share goes on
            remaining[msg.req] -= 1
            if remaining[msg.req]:
                return
        if kind == "back":  # the answer(s): merged here
            msg.kind, msg.work = "done", costs.route_merge_base
            self.to_compute(i, msg, now)
        elif self.w.move_on_compute:  # the chunk: splice, attend and merge on the compute
            msg.kind, msg.work = "fetched", costs.splice + costs.fetch_attend + costs.merge
            self.to_compute(i, msg, now)
        else:  # the chunk: T_move (gather + splice) is a delay on this path, not a load on
            # the requester's compute: the GPU priors' move is its software stack, and a
            # splice kernel runs beside attention
            seq = self.seq()
            _push(self.events, (now + costs.move, seq, self._moved, i, msg))

    def on_moved(self, i: int, job: Job, now: float) -> None:
        """A fetched chunk is in i's cache: attend and merge here; keep it for later uses."""
        costs = self.costs
        job.kind, job.work = "fetched", costs.fetch_attend + costs.merge
        self.to_compute(i, job, now)

    def on_compute_done(self, i: int, job: Job, now: float) -> None:
        """What the job leads to, what came in meanwhile, then core i's next job."""
        kind, req = job.kind, job.req
        if kind == "attend" or kind == "part":
            # uses asked here are done (or, over this instance's share, have one answer of
            # their k), routed ones' answers go back
            requesters = self.requesters
            for r in req:
                if requesters[r] != i:
                    self.to_link(i, Job("back", r, self.costs.back_occ), now)
                elif kind == "attend":
                    self.latency[r] = now - self.times[r]
                else:
                    self.remaining[r] -= 1
                    if not self.remaining[r]:
                        self.to_compute(i, Job("done", r, self.costs.route_merge_base), now)
            if now > self.last:
                self.last = now
        elif kind == "gather":  # packed: it leaves on the holder's link
            job.kind, job.work = "kv", self.costs.kv_occ
            self.to_link(i, job, now)
        elif kind != "messages":  # (taken in on an idle core: nothing follows from it)
            if kind == "fetched":
                self._cached(i, self.chunks[req], now)
            if kind == "done" and self.w.batch_merges:  # a batched merge: its uses end
                for r in req:
                    self.latency[r] = now - self.times[r]
            else:
                self.latency[req] = now - self.times[req]
            if now > self.last:
                self.last = now
        if self.between_jobs:
            self._take_in_meanwhile(i, now)
        compute = self.compute
        compute.busy[i] = False
        if compute.queue[i]:
            self.start_compute(i, now)

    def _take_in_meanwhile(self, i: int, now: float) -> None:
        """Core i, still busy, takes in what arrived and the messages that came while its
        job ran, arrivals first, so all of it is queued before its next job starts (and an
        attention batches what joined it)."""
        arrived, inbox = self.arrived[i], self.inbox[i]
        if arrived:
            for r in arrived:
                self.arrive(r, now)
            arrived.clear()
        if inbox:
            for msg in inbox:
                self.receive(i, msg, now)
            inbox.clear()

    def _cached(self, i: int, k: int, now: float) -> None:
        """Chunk k spliced into i's cache (LRU): the uses that waited for it attend."""
        cache = self.caches[i]
        cache[k] = now
        cache.move_to_end(k)
        while len(cache) > self.w.cache_chunks:
            gone, last_used = cache.popitem(last=False)
            if gone != k:  # (without a cache the chunk leaves at once: no age)
                self.reuse.evicted(i, now - last_used)
        for waiting in self.pending[i].pop(k, ()):
            self.to_attend(i, waiting, now)

    def run(self) -> Result:
        """Arrivals are already in time order: they are merged with the heap of the events
        they cause instead of being pushed onto it (a million fewer heap operations per
        million requests)."""
        times, events, n = self.times, self.events, self.n
        pop, on_arrival = heapq.heappop, self.on_arrival
        for nxt, arrival in enumerate(times):
            while events and events[0][0] < arrival:  # (an arrival goes first on a tie)
                now, _, handle, i, what = pop(events)
                handle(i, what, now)
            on_arrival(nxt, arrival)
        while events:
            now, _, handle, i, what = pop(events)
            handle(i, what, now)
        return Result(
            np.array(self.latency),
            np.array(self.path, dtype=np.int8),
            self.last - times[0] if n else 0.0,
            np.array(self.compute.time),
            np.array(self.link.time),
            self.moved,
            self.batches,
            self.batched_rows,
        )


def simulate(
    profile,
    w: Workload,
    trace: Trace,
    policy: str,
    decisions=None,
    spread=None,
    message_cost: float = 0.0,
) -> Result:
    """``policy``: a name in POLICIES. ``decisions`` (predicate only): per use, the path
    another run chose (PATHS names); the predicate then follows them instead of deciding.
    ``spread``: per instance, the factors measured calls ran at about their modelled time,
    in the order they ran; each attending call there takes the next (cycling), so slow
    stretches come in runs as they did (a deterministic server, or one drawing factors
    independently, understates the queues they build). Without it calls take exactly the
    model's time. Where the move runs on the compute (one core per instance, as CPU ranks),
    a core takes in what arrived and the messages that came while it ran a job when the job
    ends, arrivals first, before its next job starts (as the replay's loop does);
    ``message_cost``: seconds of that core each arrival and message taken in costs."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    if decisions is not None and policy == "predicate":
        chosen = Follow(decisions)
    else:
        chosen = POLICIES[policy]()
    return Simulation(profile, w, trace, chosen, spread, message_cost).run()
