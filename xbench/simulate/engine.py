"""A discrete-event simulation of a workload through the fitted cost model.

Instances hold chunks (chunk ``k`` lives on instance ``k % instances``); requests arrive
(Poisson), each from a requester instance for one chunk (Zipf popularity). Every instance has
one compute server (FIFO; it batches the queued routed attentions of one chunk into one call,
whose time is the measured T_c for all their rows together, so a popular holder both queues
and batches) and one egress link (FIFO at the fabric's bandwidth, each message paying the
per-message overhead while it occupies the link and alpha in flight after it). A requester
keeps the chunks it fetched in an LRU cache of ``cache_chunks``.

Paths (the cost model's phases, each on the resource it occupies):

- present (the chunk is home or cached): attention at the requester;
- route: query out on the requester's link, attention at the holder (batched), answer back
  on the holder's link, merge at the requester;
- fetch: the chunk on the holder's link (``segments`` messages), then T_move as a delay
  (the gather and splice stack, not a load on the compute), then attention + merge at the
  requester; the chunk enters its cache, and uses that arrive meanwhile wait for it;
- local: recompute the chunk and attend at the requester (when the profile knows
  ``recompute_per_token``).

Policies: ``route``, ``fetch``, ``local`` always (a present chunk is always used in place),
and ``predicate``: per request, the cost model's per-use times plus the current backlog of
the resources each option would wait on, with the reuse so far of this chunk by this
requester as the fetch's expected reuse.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

POLICIES = ("route", "fetch", "local", "predicate")
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


@dataclass
class Trace:
    arrival: np.ndarray  # s
    requester: np.ndarray
    chunk: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival)


def make_trace(w: Workload, requests: int, seed: int = 0) -> Trace:
    """Poisson arrivals at ``rate_per_s``; requesters uniform; chunks by Zipf popularity."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / w.rate_per_s, requests))
    weights = 1.0 / np.arange(1, w.chunks + 1) ** w.zipf
    order = rng.permutation(w.chunks)  # popular chunks spread over the holders
    chunk = order[rng.choice(w.chunks, requests, p=weights / weights.sum())]
    requester = rng.integers(0, w.instances, requests)
    return Trace(arrival, requester, chunk)


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
        self.merge = d.merge(rh, 2, w.chunk_tokens)
        self.move = d.move(w.chunk_tokens, w.segments)
        rec = d.recompute_per_token
        self.recompute = w.chunk_tokens * rec.value if rec is not None else math.inf
        self.send_occ, self.send_fly = self._link(self.s_q, 1)
        self.back_occ, self.back_fly = self._link(self.s_o, 1)
        self.kv_occ, self.kv_fly = self._link(self.s_kv, w.segments)
        # what the predicate reads on every request, computed once
        self.arrivals_per_instance = w.rate_per_s / w.instances
        self.fetch_once = self.kv_occ + self.kv_fly + self.move
        self._batched: dict[int, float] = {}

    def _link(self, nbytes: float, messages: int) -> tuple[float, float]:
        """(time the message occupies the link, alpha in flight after it)."""
        total = self.fabric.wire(nbytes, messages)
        o, segs = self.fabric.terms(0)
        alpha = segs[self.fabric.segment_index(nbytes)][0]
        return total - alpha, alpha

    def batched_attend(self, rows: int) -> float:
        """T_c for ``rows`` decode tokens' query rows attending the chunk together."""
        if rows not in self._batched:
            self._batched[rows] = self.device.compute(rows * self.w.heads, self.w.chunk_tokens)
        return self._batched[rows]

    def per_use(self) -> dict[str, float]:
        route = (
            self.send_occ + self.send_fly + self.attend + self.back_occ + self.back_fly + self.merge
        )
        fetch = self.kv_occ + self.kv_fly + self.move + self.attend + self.merge
        return {"route": route, "fetch": fetch, "local": self.recompute + self.attend}


def _predicate(costs, per_use, reuse, wait_me, wait_holder, link_me, link_holder) -> str:
    """The cost model's choice for one use, with the backlogs each option would wait on.

    Per use: route pays its waits every time; a fetch's one-time part (the transfer and the
    move) is shared by this use and the ``reuse`` uses expected after it (the model's r),
    while the waits at the requester are paid by every use alike. Local recomputes every
    time. Each option also pays for the work it adds to a busy server: every request that
    arrives there while that server's backlog drains waits that much longer (arrivals per
    instance times the backlog, times the work added).
    """
    lam, one_time = costs.arrivals_per_instance, costs.fetch_once
    route = per_use["route"] + link_me + wait_holder + wait_me
    route += lam * (wait_holder + costs.attend) * costs.attend
    fetch = (link_holder + one_time) / (1 + reuse) + costs.attend + costs.merge + wait_me
    fetch += lam * (wait_me + costs.attend) * costs.attend / (1 + reuse)
    local_work = costs.recompute + costs.attend
    local = local_work + wait_me + lam * (wait_me + local_work) * local_work
    return min((route, "route"), (fetch, "fetch"), (local, "local"))[1]


class _Servers:
    """One FIFO server per instance (its compute, or its egress link): the jobs queued, the
    work they hold, whether it runs, when it frees, and its busy time."""

    def __init__(self, n: int):
        self.queue = [deque() for _ in range(n)]
        self.busy = [False] * n
        self.free_at = [0.0] * n
        self.backlog = [0.0] * n
        self.time = np.zeros(n)

    def add(self, i: int, job, work: float) -> bool:
        """Queue ``job``; True when the server is idle and should start it now."""
        self.queue[i].append(job)
        self.backlog[i] += work
        return not self.busy[i]

    def run(self, i: int, now: float, work: float) -> float:
        """Start ``work`` now (its job already taken off the queue); returns when it ends."""
        self.busy[i] = True
        self.free_at[i] = now + work
        self.time[i] += work
        return now + work

    def wait(self, i: int, now: float) -> float:
        """What a job queued now would wait: the running job's rest and the queued work."""
        return max(self.free_at[i] - now, 0.0) + self.backlog[i]


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


def simulate(profile, w: Workload, trace: Trace, policy: str) -> Result:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    costs = _Costs(profile, w)
    n, inst = len(trace), w.instances
    latency = np.zeros(n)
    path = np.zeros(n, dtype=np.int8)
    caches = [OrderedDict() for _ in range(inst)]
    # the predicate's r: uses of (requester, chunk) while it was not here since it last left
    # (routed or recomputed), or the uses its last stay in the cache served
    seen: dict[tuple[int, int], int] = {}
    served: dict[tuple[int, int], int] = {}
    pending: dict[tuple[int, int], list] = {}  # fetches in flight: the uses waiting for them
    # resources: compute and link per instance; each a FIFO with a running flag and backlog
    compute, link = _Servers(inst), _Servers(inst)
    c_attq = [{} for _ in range(inst)]  # routed attentions queued per chunk
    events: list = []
    seq = 0
    moved = 0.0
    batches = batched_rows = 0
    arrival, requester, chunk = trace.arrival, trace.requester, trace.chunk
    per_use = costs.per_use()
    push, pop = heapq.heappush, heapq.heappop
    ARRIVE, C_DONE, L_DONE, READY_C = 0, 1, 2, 3

    def start_compute(i: int, now: float) -> None:
        nonlocal seq, batches, batched_rows
        job = compute.queue[i].popleft()
        kind, req, dur = job
        compute.backlog[i] -= dur
        if kind == "attend":  # take every queued routed attention of the same chunk
            k = chunks[req]
            c_attq[i][k] -= 1
            members, rows = [req], w.rows
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
        seq += 1
        push(events, (compute.run(i, now, dur), seq, C_DONE, i, job))

    def to_compute(i: int, job, now: float) -> None:
        if compute.add(i, job, job[2]):
            start_compute(i, now)

    def start_link(i: int, now: float) -> None:
        nonlocal seq
        job = link.queue[i].popleft()
        link.backlog[i] -= job[1]
        seq += 1
        push(events, (link.run(i, now, job[1]), seq, L_DONE, i, job))

    def to_link(i: int, job, now: float) -> None:
        if link.add(i, job, job[1]):
            start_link(i, now)

    # Arrivals are already in time order: they are merged with the heap of the events they
    # cause instead of being pushed onto it (a million fewer heap operations per million).
    times_list = arrival.tolist()
    requesters, chunks = requester.tolist(), chunk.tolist()
    fly = {"send": costs.send_fly, "back": costs.back_fly, "kv": costs.kv_fly}
    nxt = 0
    last = 0.0
    while nxt < n or events:
        if nxt < n and (not events or times_list[nxt] <= events[0][0]):
            now, kind, a, job = times_list[nxt], ARRIVE, nxt, None
            nxt += 1
        else:
            now, _, kind, a, job = pop(events)
        if kind == ARRIVE:
            r = a
            me, k = requesters[r], chunks[r]
            holder = k % inst
            cache = caches[me]
            if holder == me or k in cache:
                if k in cache:
                    cache.move_to_end(k)
                    served[(me, k)] = served.get((me, k), 0) + 1
                path[r] = 0
                to_compute(me, ("done", r, costs.attend), now)
                continue
            if (me, k) in pending:  # on its way here: wait for it, then attend in place
                path[r] = 0
                pending[(me, k)].append(r)
                continue
            choice = policy
            if policy == "predicate":
                choice = _predicate(
                    costs,
                    per_use,
                    seen.get((me, k), 0) if w.cache_chunks else 0,  # nothing kept: no reuse
                    compute.wait(me, now),
                    compute.wait(holder, now),
                    link.wait(me, now),
                    link.wait(holder, now),
                )
            seen[(me, k)] = seen.get((me, k), 0) + 1
            if choice == "route":
                path[r] = 1
                moved += costs.s_q + costs.s_o
                to_link(me, ("send", costs.send_occ, r, holder), now)
            elif choice == "fetch":
                path[r] = 2
                moved += costs.s_kv
                pending[(me, k)] = []
                served[(me, k)] = 0
                to_link(holder, ("kv", costs.kv_occ, r, me), now)
            else:
                path[r] = 3
                to_compute(me, ("done", r, costs.recompute + costs.attend), now)
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
            if step == "send":
                # what this attention adds to the holder's backlog: the growth of the
                # batched call it will join (batches of one chunk cost far less than apart)
                k = chunks[r]
                queued = c_attq[a].get(k, 0)
                c_attq[a][k] = queued + 1
                added = costs.batched_attend((queued + 1) * w.rows) - (
                    costs.batched_attend(queued * w.rows) if queued else 0.0
                )
                to_compute(a, ("attend", r, added), now)
            elif step == "back":
                to_compute(a, ("done", r, costs.merge), now)
            elif step == "kv":  # the chunk arrived: T_move (gather + splice) is a delay on this
                # path, not a load on the requester's compute: the study's 3 ms is its software
                # stack; a splice kernel is microseconds and runs beside attention
                seq += 1
                push(events, (now + costs.move, seq, READY_C, a, ("moved", r)))
            else:  # moved into the cache: attend and merge here; keep it for later uses
                to_compute(a, ("fetched", r, costs.attend + costs.merge), now)
        else:  # C_DONE
            i = a
            compute.busy[i] = False
            if compute.queue[i]:
                start_compute(i, now)
            step, req, _ = job
            if step == "attend":
                for r in req:
                    to_link(i, ("back", costs.back_occ, r, requesters[r]), now)
                continue
            if step == "fetched":  # spliced: in the cache now, and the waiting uses attend
                k = chunks[req]
                cache = caches[i]
                cache[k] = True
                cache.move_to_end(k)
                while len(cache) > w.cache_chunks:
                    gone, _ = cache.popitem(last=False)
                    # what that stay served is the best guess of what the next would
                    seen[(i, gone)] = served.pop((i, gone), 0)
                for waiting in pending.pop((i, k), []):
                    to_compute(i, ("done", waiting, costs.attend), now)
            latency[req] = now - arrival[req]
            last = max(last, now)
    makespan = last - float(arrival[0]) if n else 0.0
    return Result(latency, path, makespan, compute.time, link.time, moved, batches, batched_rows)
