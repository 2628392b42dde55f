"""A discrete-event simulation of a workload through the fitted cost model.

Instances hold chunks (chunk ``k`` lives on instance ``k % instances``); requests arrive
(Poisson), each from a requester instance for one chunk (Zipf popularity). Every instance has
one compute server (FIFO; it batches the queued attentions of one chunk, routed queries and
uses of a chunk present there alike, into one call whose time is the measured T_c for all
their rows together, so a popular holder both queues and batches) and one egress link (FIFO at the fabric's bandwidth, each message paying the
per-message overhead while it occupies the link and alpha in flight after it). A requester
keeps the chunks it fetched in an LRU cache of ``cache_chunks``.

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

Policies: ``route``, ``fetch``, ``local`` always (a present chunk is always used in place),
and ``predicate``: per request, the cost model's times plus the current backlog of the
resources each option would wait on. A fetch is judged over the uses it would serve: this
one, those that arrive while it is on its way (they wait for it), and those its stay in the
cache serves, each counted from what the requester has seen so far (see ``_Reuse``); those
later uses are priced at each core's steady-state wait, not today's backlog (``_predicate``).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from xbench.core.scenario import span_chunks

POLICIES = ("route", "fetch", "local", "predicate")
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

    def uses_per_request(self, prefixes: bool = True) -> float:
        """Uses per request, on average over the expressions (1 without spans)."""
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
    or, for span workloads, by the expressions' weights (:func:`make_span_trace`)."""
    if w.spans:
        return make_span_trace(w, requests, seed)
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


class _Costs:
    """The model's times for one workload shape, read once from the profile."""

    def __init__(self, profile, w: Workload):
        f = profile.fabric(w.fabric)
        d = profile.device
        self.w, self.fabric, self.device = w, f, d
        rh = w.rows * w.heads
        self.rows = rh
        self.s_q, self.s_o = rh * w.payload_bytes, rh * w.return_bytes
        self.s_kv = w.chunk_tokens * w.kv_bytes_per_token
        self.attend = d.compute(rh, w.chunk_tokens)
        # a fetch's first attention, on the chunk it has just spliced (partly in cache)
        self.fetch_attend = self.attend - d.saved_on_splice(w.chunk_tokens)
        self.merge = d.merge(rh, 2, w.chunk_tokens)
        self.move = d.move(w.chunk_tokens, w.segments)
        # where the move runs on the compute (move_on_compute): the splice at the requester
        # (T_splice where measured, else all of T_move) and the gather, the rest, at the holder
        splice = d.move(w.chunk_tokens, 2) if d.splice_t0 is not None else self.move
        self.splice = min(splice, self.move)
        self.gather = self.move - self.splice
        rec = d.recompute_per_token
        self.recompute = w.chunk_tokens * rec.value if rec is not None else math.inf
        self.send_occ, self.send_fly = self._link(self.s_q, 1)
        self.back_occ, self.back_fly = self._link(self.s_o, 1)
        # a routed use merges after its requester waited for the answer (where the profile
        # measured merges after a wait; else as a fetch merges, after its attention)
        answered = self.send_occ + self.send_fly + self.attend + self.back_occ + self.back_fly
        self.route_merge = d.merge_after_wait(rh, 2, w.chunk_tokens, answered)
        self.kv_occ, self.kv_fly = self._link(self.s_kv, w.segments)
        # what the predicate reads on every request, computed once
        self.arrivals_per_instance = w.uses_per_s / w.instances
        self.fetch_once = self.kv_occ + self.kv_fly + self.move
        # a use attended here waits for the uses of its request queued here before it (a
        # span request's prefix, its other cached chunks), where a routed one runs beside
        # them at its holder: half its siblings, on average, if they are all here
        self.attend_here = self.attend * (1 + (w.uses_per_request() - 1) / 2)
        self._batched: dict[int, float] = {}
        self._joins: dict[int, float] = {}

    def _link(self, nbytes: float, messages: int) -> tuple[float, float]:
        """(time the message occupies the link, alpha in flight after it)."""
        total = self.fabric.wire(nbytes, messages)
        _, segs, pages = self.fabric.terms(0)
        if messages != 1 and pages is not None:  # a fetch page by page: its own terms
            return total - pages[0], pages[0]
        alpha = segs[self.fabric.segment_index(nbytes)][0]
        return total - alpha, alpha

    def batched_attend(self, rows: int) -> float:
        """T_c for ``rows`` decode tokens' query rows attending the chunk together."""
        if rows not in self._batched:
            self._batched[rows] = self.device.compute(rows * self.w.heads, self.w.chunk_tokens)
        return self._batched[rows]

    def joins_batch(self, queued: int) -> float:
        """What one more query adds at a holder where ``queued`` of this chunk wait."""
        added = self._joins.get(queued)
        if added is None:
            rows = self.w.rows
            grown = self.batched_attend((queued + 1) * rows)
            added = grown - self.batched_attend(queued * rows) if queued else grown
            self._joins[queued] = added
        return added

    def per_use(self) -> dict[str, float]:
        route = (
            self.send_occ
            + self.send_fly
            + self.attend
            + self.back_occ
            + self.back_fly
            + self.route_merge
        )
        fetch = self.kv_occ + self.kv_fly + self.move + self.fetch_attend + self.merge
        return {"route": route, "fetch": fetch, "local": self.recompute + self.attend}


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
        self.uses: dict[tuple[int, int], int] = {}
        self.places = w.cache_chunks
        shared = w.shared_chunks
        self.remote = shared - math.ceil(shared / w.instances)  # the fewest any requester has
        self.evicted_age = [0.0] * w.instances  # sum of idle ages at eviction
        self.evictions = [0] * w.instances
        # per requester, the use counts of the remote chunks it has used, sorted
        self.ranked: list[list[int]] = [[] for _ in range(w.instances)]

    def used(self, me: int, k: int, remote: bool) -> None:
        before = self.uses.get((me, k), 0)
        self.uses[(me, k)] = before + 1
        if remote:
            ranked = self.ranked[me]
            if before:
                del ranked[bisect_left(ranked, before)]
            insort(ranked, before + 1)

    def evicted(self, me: int, idle_age: float) -> None:
        self.evicted_age[me] += idle_age
        self.evictions[me] += 1

    def expect(self, me: int, k: int, now: float, fetch_time: float) -> tuple[float, float]:
        """(joiners, after): the uses a fetch started now would also serve."""
        # uses counts this one: it is why we ask now, not evidence of the rate (a rate read
        # at arrival instants, counting them, reads high)
        earlier = self.uses[(me, k)] - 1
        rate = (PRIOR_USES + earlier) / (PRIOR_USES * self.beta + now - self.start)
        left = max(self.end - now, 0.0)
        joiners = rate * min(fetch_time, left)
        if not self.places:
            return joiners, 0.0
        in_time = rate * max(left - fetch_time, 0.0)
        evictions = self.evictions[me]
        if evictions:
            x = rate * self.evicted_age[me] / evictions
            return joiners, in_time if x > 30 else min(math.expm1(x), in_time)
        # rivals: the remote chunks whose rate may read as k's (k among them): counts
        # within one Poisson standard deviation below k's earlier uses; a chunk not used yet
        # reads the prior's rate, as k does at its first use
        floor = math.ceil(earlier - math.sqrt(earlier + 1))
        ranked = self.ranked[me]
        rivals = self.remote if floor <= 0 else len(ranked) - bisect_left(ranked, floor)
        if rivals <= self.places:
            return joiners, in_time
        return joiners, min(self.places / (rivals - self.places), in_time)


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
) -> str:
    """The cost model's choice for one use, with the backlogs each option would wait on.

    Options are weighed over the ``1 + joiners + after`` uses a fetch would serve. Fetch:
    this use pays the transfer and the move (behind the holder's link backlog), the joiners
    wait for the rest of it, and every use attends here. Route or local: this use pays its
    option with today's backlogs, and the later uses are routed as the model prices a use at
    the resources' steady-state waits, not today's backlogs (they drain): ``queue_holder``
    for its attention at the holder and ``queue_me`` for its merge back here, where a later
    use of a fetched chunk waits only ``queue_me`` (a route queues on two cores, a use in
    place on one; counting neither left the predicate 34-74 % worse than the better static
    policy on some CPU workloads, whose long attentions made the merge wait). Each
    option also pays for the work it adds to a busy server now: every request that arrives
    there while that server's backlog drains waits that much longer (arrivals per instance
    times the backlog, times the work added). A routed query adds ``holder_adds`` to the
    holder: the growth of the batched call it joins there (far less than T_c when queries
    of this chunk are already queued); a fetch adds its chunk's time on the holder's link,
    which every message reaching that link meanwhile (an answer for each use routed there)
    waits behind. A later use of a fetched chunk attends here behind
    its request's other uses (``attend_here``), which routing would have run in parallel.
    Where the move runs on the compute (``move_on_compute``), a fetch's gather waits behind
    the holder's backlog and adds to it, and its splice adds to the requester's.
    ``idle_holder`` and ``idle_me``: how long each core has idled (0 when it has work),
    for the extra a call pays after idle (the device's ``after_idle``; 0 without it): a
    routed call pays the holder's now, a fetched one the requester's when the chunk lands.
    """
    lam = costs.arrivals_per_instance
    later = joiners + after
    route_later = later * (per_use["route"] + queue_holder + queue_me)
    after_idle = costs.device.after_idle
    route = per_use["route"] + link_me + wait_holder + wait_me + after_idle(idle_holder)
    route += lam * (wait_holder + holder_adds) * holder_adds + route_later
    first = link_holder + costs.fetch_once
    here = costs.fetch_attend
    # the chunk occupies the holder's link for kv_occ: every message that reaches that link
    # while its backlog drains (a routed answer for each use there) waits that much longer
    fetch = lam * (link_holder + costs.kv_occ) * costs.kv_occ
    if costs.w.move_on_compute:  # the gather queues at the holder's compute, and loads it
        first += wait_holder
        fetch += lam * (wait_holder + costs.gather) * costs.gather
        here += costs.splice
    fetch += first * (1 + joiners / 2) + costs.merge + wait_me + costs.fetch_attend
    fetch += after_idle(idle_me + first) if idle_me else 0.0
    fetch += later * (costs.attend_here + queue_me)
    fetch += lam * (wait_me + here) * here
    local_work = costs.recompute + costs.attend
    local = local_work + wait_me + lam * (wait_me + local_work) * local_work + route_later
    local += after_idle(idle_me)
    return min((route, "route"), (fetch, "fetch"), (local, "local"))[1]


class _Servers:
    """One FIFO server per instance (its compute, or its egress link): the jobs queued, the
    work they hold, whether it runs, when it frees, and its busy time. A server that is not
    busy has nothing queued (a job ending starts the next), so the loop starts a job offered
    to an idle server at once and queues (``add``) only behind a running one (an ``offer``
    method doing both would cost one more call per job on the simulator's hottest path)."""

    def __init__(self, n: int):
        self.queue = [deque() for _ in range(n)]
        self.busy = [False] * n
        self.free_at = [0.0] * n
        self.backlog = [0.0] * n
        self.time = [0.0] * n  # busy time (a list: numpy scalars are slow in this loop)
        self.square = [0.0] * n  # the sum of its jobs' squared times

    def add(self, i: int, job, work: float) -> None:
        """Queue ``job`` behind the running one (an idle server starts a job at once)."""
        self.queue[i].append(job)
        self.backlog[i] += work

    def run(self, i: int, now: float, work: float) -> float:
        """Start ``work`` now (its job already taken off the queue); returns when it ends."""
        self.busy[i] = True
        self.free_at[i] = now + work
        self.time[i] += work
        self.square[i] += work * work
        return now + work

    def wait(self, i: int, now: float) -> float:
        """What a job queued now would wait: the running job's rest and the queued work."""
        rest = self.free_at[i] - now  # (a comparison, not max(): this runs per request)
        return (rest if rest > 0.0 else 0.0) + self.backlog[i]

    def steady_wait(self, i: int, span: float, prior_jobs: float, prior_work: float) -> float:
        """The mean wait of a job arriving at a random time (Pollaczek-Khinchine, M/G/1:
        rate x E[S^2] / (2 (1 - busy)), busy capped at ``BUSY_CAP``) from the jobs started
        over ``span`` s, with ``prior_jobs`` of ``prior_work`` s each counted beside them
        (their span included) so a server's first jobs do not read as its load."""
        busy = min((self.time[i] + prior_jobs * prior_work) / span, BUSY_CAP)
        square = self.square[i] + prior_jobs * prior_work * prior_work
        return square / (2 * span * (1 - busy))


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


def simulate(
    profile,
    w: Workload,
    trace: Trace,
    policy: str,
    decisions=None,
    spread=None,
    message_cost: float = 0.0,
) -> Result:
    """``decisions`` (predicate only): per use, the path another run chose (PATHS names);
    the predicate then follows them instead of deciding, and a use decided present that is
    not here is routed (as the replay does). ``spread``: per instance, the factors
    measured calls ran at about their modelled time, in the order they ran; each attending
    call there takes the next (cycling), so slow stretches come in runs as they did (a
    deterministic server, or one drawing factors independently, understates the queues
    they build). Without it calls take exactly the model's time. Where the move runs on the
    compute (one core per instance, as CPU ranks), a core takes in what arrived and the
    messages that came while it ran a job when the job ends, arrivals first, before its
    next job starts (as the replay's loop does); ``message_cost``: seconds of that core
    each arrival and message taken in costs."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    costs = _Costs(profile, w)
    n, inst = len(trace), w.instances
    # lists while the loop writes them (a numpy element write is slower), arrays after
    latency = [0.0] * n
    path = [0] * n
    caches = [OrderedDict() for _ in range(inst)]  # chunk -> when it was last used
    # the workload's declared length: as long as its requests take at its rate
    start = float(trace.arrival[0]) if n else 0.0
    reuse = _Reuse(w, start, start + n / w.uses_per_s)
    pending: dict[tuple[int, int], list] = {}  # fetches in flight: the uses waiting for them
    # resources: compute and link per instance; each a FIFO with a running flag and backlog
    compute, link = _Servers(inst), _Servers(inst)
    c_attq = [{} for _ in range(inst)]  # attentions queued per chunk (routed or here)
    events: list = []
    seq = 0
    moved = 0.0
    batches = batched_rows = 0
    arrival, requester, chunk = trace.arrival, trace.requester, trace.chunk
    per_use = costs.per_use()
    push, pop = heapq.heappush, heapq.heappop
    ARRIVE, C_DONE, L_DONE, READY_C = 0, 1, 2, 3
    # jobs that attend (a batched call, a fetched chunk's, a local prefill's): they pay what
    # the device measured for starting after idle, where the profile has it
    ATTENDS = ("attend", "fetched", "local")
    device = costs.device
    cold = device.idle_extra is not None
    # a routed use's merge after its core waited for the answer (where measured)
    waited = device.merge_wait_tau is not None
    between_jobs = w.move_on_compute  # one core per instance: it computes and it messages
    varied = [0] * inst  # attending calls each instance has drawn a factor for
    # one core per instance: taking an arrival or a message in costs it message_cost,
    # charged to the next job it starts (the rank's loop takes them in between jobs)
    handling = between_jobs and message_cost > 0
    overhead = [0.0] * inst
    # when each core's last job (not taking messages in) ended: idle since before the trace
    computed_until = [-math.inf] * inst

    # the steady-state waits' prior: PRIOR_USES attentions at the workload's rate per instance
    prior_span = PRIOR_USES / costs.arrivals_per_instance

    def queue(i: int, now: float) -> float:
        return compute.steady_wait(i, now - start + prior_span, PRIOR_USES, costs.attend)

    def idled(i: int, now: float) -> float:
        """How long core i has idled since its last job (0 while it has work)."""
        return 0.0 if compute.busy[i] else now - computed_until[i]

    def take_in(i: int, now: float) -> None:
        """An arrival or a message taken in at core i: between its jobs when it computes
        (charged to the next job), else at once (the core busy meanwhile)."""
        if compute.busy[i]:
            overhead[i] += message_cost
        else:
            to_compute(i, ("messages", -1, message_cost), now)

    def start_compute(i: int, now: float, job=None) -> None:
        """Start core i's next queued job, or ``job`` at once (an idle core has none queued)."""
        nonlocal seq, batches, batched_rows
        if job is None:
            job = compute.queue[i].popleft()
            compute.backlog[i] -= job[2]
        kind, req, dur = job
        if kind == "attend":  # take every queued attention of the same chunk: one call
            k = chunks[req]
            c_attq[i][k] -= 1
            members, rows = [req], w.rows
            if c_attq[i][k]:  # others of this chunk are queued: they join this call
                keep = deque()
                while compute.queue[i]:
                    other = compute.queue[i].popleft()
                    if (
                        other[0] == "attend"
                        and chunks[other[1]] == k
                        and rows + w.rows <= w.max_batch_rows
                    ):
                        members.append(other[1])
                        rows += w.rows
                        compute.backlog[i] -= other[2]
                        c_attq[i][k] -= 1
                    else:
                        keep.append(other)
                compute.queue[i] = keep
            dur = costs.batched_attend(rows)
            batches += 1
            batched_rows += rows
            job = ("attend", members, dur)
        if overhead[i]:  # what taking messages in cost this core since its last job
            dur += overhead[i]
            overhead[i] = 0.0
        if spread and kind in ATTENDS:  # this instance's next measured factor, in order
            factors = spread[i % len(spread)]
            dur *= factors[varied[i] % len(factors)]
            varied[i] += 1
        if cold and kind in ATTENDS:  # the first call after idle pays for the cold core
            dur += device.after_idle(now - computed_until[i])
        elif waited and kind == "done" and now > computed_until[i]:
            # a merge after its core waited (for this answer or anything): as measured
            # after a wait; one that follows other work is the merge as costed
            wait = now - computed_until[i]
            dur += device.merge_after_wait(costs.rows, 2, w.chunk_tokens, wait) - costs.merge
        seq += 1
        end = compute.run(i, now, dur)
        if kind != "messages":
            computed_until[i] = end
        push(events, (end, seq, C_DONE, i, job))

    def to_compute(i: int, job, now: float) -> None:
        if compute.busy[i]:
            compute.add(i, job, job[2])
        else:  # an idle core has nothing queued (_Servers): the job starts at once
            start_compute(i, now, job)

    def to_attend(i: int, r: int, now: float) -> None:
        """Queue request r's attention over its chunk at instance i (the holder of a routed
        query, or the requester where the chunk is present); it joins the batched call of
        the attentions of that chunk queued there, and adds what that call grows by."""
        k = chunks[r]
        queued = c_attq[i].get(k, 0)
        c_attq[i][k] = queued + 1
        to_compute(i, ("attend", r, costs.joins_batch(queued)), now)

    def send(me: int, r: int, holder: int, now: float) -> None:
        """Route: the query leaves on the requester's link."""
        nonlocal moved
        moved += costs.s_q + costs.s_o
        to_link(me, ("send", costs.send_occ, r, holder), now)

    def ask(me: int, r: int, holder: int, now: float) -> None:
        """Fetch: the holder gathers the chunk on its compute (where the move runs there)
        and sends it; the uses arriving meanwhile wait for it."""
        nonlocal moved
        moved += costs.s_kv
        pending[(me, chunks[r])] = []
        if w.move_on_compute:
            if handling:  # the request taken in at the holder
                take_in(holder, now)
            to_compute(holder, ("gather", r, costs.gather), now)
        else:
            to_link(holder, ("kv", costs.kv_occ, r, me), now)

    def start_link(i: int, now: float, job=None) -> None:
        """Put link i's next queued message on the wire, or ``job`` at once (an idle link
        has none queued)."""
        nonlocal seq
        if job is None:
            job = link.queue[i].popleft()
            link.backlog[i] -= job[1]
        seq += 1
        push(events, (link.run(i, now, job[1]), seq, L_DONE, i, job))

    def to_link(i: int, job, now: float) -> None:
        if link.busy[i]:
            link.add(i, job, job[1])
        else:
            start_link(i, now, job)

    times_list = arrival.tolist()
    requesters, chunks = requester.tolist(), chunk.tolist()
    holders = (trace.holder if trace.holder is not None else chunk % inst).tolist()
    fly = {"send": costs.send_fly, "back": costs.back_fly, "kv": costs.kv_fly}
    # one core per instance (between_jobs): what arrived and what messages came in while it
    # ran a job, taken in when the job ends, arrivals first (the replay's loop)
    arrived: list[list] = [[] for _ in range(inst)]
    inbox: list[list] = [[] for _ in range(inst)]

    def arrive(r: int, now: float) -> None:
        """Request r taken in at its requester: used in place, waited for, or decided."""
        me, k = requesters[r], chunks[r]
        if handling:
            take_in(me, now)
        holder = holders[r]
        cache = caches[me]
        reuse.used(me, k, holder != me)
        if holder == me or k in cache:
            if k in cache:
                cache[k] = now
                cache.move_to_end(k)
            path[r] = 0
            to_attend(me, r, now)
            return
        if (me, k) in pending:  # on its way here: wait for it, then attend in place
            path[r] = 0
            pending[(me, k)].append(r)
            return
        choice = policy
        if decisions is not None and policy == "predicate":
            choice = decisions[r] if decisions[r] in ("route", "fetch", "local") else "route"
        elif policy == "predicate":
            link_holder = link.wait(holder, now)
            choice = _predicate(
                costs,
                per_use,
                *reuse.expect(me, k, now, link_holder + costs.fetch_once),
                compute.wait(me, now),
                compute.wait(holder, now),
                link.wait(me, now),
                link_holder,
                costs.joins_batch(c_attq[holder].get(k, 0)),
                *((idled(holder, now), idled(me, now)) if cold else (0.0, 0.0)),
                queue(me, now),
                queue(holder, now),
            )
        if choice == "route":
            path[r] = 1
            send(me, r, holder, now)
        elif choice == "fetch":
            path[r] = 2
            ask(me, r, holder, now)
        else:
            path[r] = 3
            to_compute(me, ("local", r, costs.recompute + costs.attend), now)

    def receive(i: int, step: str, r: int, now: float) -> None:
        """A message (or the end of a move's delay) at instance i."""
        nonlocal seq
        if handling and step != "moved":  # a message taken in on the rank's core
            take_in(i, now)
        if step == "send":
            # what this attention adds to the holder's backlog: the growth of the
            # batched call it will join (batches of one chunk cost far less than apart)
            to_attend(i, r, now)
        elif step == "back":
            to_compute(i, ("done", r, costs.merge), now)
        elif step == "kv" and w.move_on_compute:  # splice, attend, merge on the compute
            to_compute(i, ("fetched", r, costs.splice + costs.fetch_attend + costs.merge), now)
        elif step == "kv":  # the chunk arrived: T_move (gather + splice) is a delay on this
            # path, not a load on the requester's compute: the study's 3 ms is its software
            # stack; a splice kernel is microseconds and runs beside attention
            seq += 1
            push(events, (now + costs.move, seq, READY_C, i, ("moved", r)))
        else:  # moved into the cache: attend and merge here; keep it for later uses
            to_compute(i, ("fetched", r, costs.fetch_attend + costs.merge), now)

    # Arrivals are already in time order: they are merged with the heap of the events they
    # cause instead of being pushed onto it (a million fewer heap operations per million).
    nxt = 0
    last = 0.0
    while nxt < n or events:
        if nxt < n and (not events or times_list[nxt] <= events[0][0]):
            now, kind, a, job = times_list[nxt], ARRIVE, nxt, None
            nxt += 1
        else:
            now, _, kind, a, job = pop(events)
        if kind == ARRIVE:
            if between_jobs and compute.busy[requesters[a]]:
                arrived[requesters[a]].append(a)  # taken in when its job ends
            else:
                arrive(a, now)
        elif kind == L_DONE:
            i = a
            link.busy[i] = False
            if link.queue[i]:
                start_link(i, now)
            step, _, r, dest = job
            seq += 1
            push(events, (now + fly[step], seq, READY_C, dest, (step, r)))
        elif kind == READY_C:
            step, r = job
            if between_jobs and step != "moved" and compute.busy[a]:
                inbox[a].append((step, r))  # taken in when its job ends
            else:
                receive(a, step, r, now)
        else:  # C_DONE: what the job leads to, what came in meanwhile, then the next job
            i = a
            step, req, _ = job
            if step == "gather":  # packed: it leaves on the holder's link
                to_link(i, ("kv", costs.kv_occ, req, requesters[req]), now)
            elif step == "attend":
                for r in req:
                    if requesters[r] == i:  # attended where it was asked: done
                        latency[r] = now - times_list[r]
                    else:  # a routed query: its answer goes back
                        to_link(i, ("back", costs.back_occ, r, requesters[r]), now)
                if now > last:
                    last = now
            elif step != "messages":  # (taken in on an idle core: nothing follows from it)
                if step == "fetched":  # spliced: in the cache now, the waiting uses attend
                    k = chunks[req]
                    cache = caches[i]
                    cache[k] = now
                    cache.move_to_end(k)
                    while len(cache) > w.cache_chunks:
                        gone, last_used = cache.popitem(last=False)
                        if gone != k:  # (without a cache the chunk leaves at once: no age)
                            reuse.evicted(i, now - last_used)
                    for waiting in pending.pop((i, k), []):
                        to_attend(i, waiting, now)
                latency[req] = now - times_list[req]
                if now > last:
                    last = now
            # still busy while it takes in what came meanwhile, so all of it is queued
            # before the next job starts (and an attention batches what joined it)
            if arrived[i]:
                for r in arrived[i]:
                    arrive(r, now)
                arrived[i].clear()
            if inbox[i]:
                for step, r in inbox[i]:
                    receive(i, step, r, now)
                inbox[i].clear()
            compute.busy[i] = False
            if compute.queue[i]:
                start_compute(i, now)
    makespan = last - float(arrival[0]) if n else 0.0
    return Result(
        np.array(latency),
        np.array(path, dtype=np.int8),
        makespan,
        np.array(compute.time),
        np.array(link.time),
        moved,
        batches,
        batched_rows,
    )
