"""Prefill-as-a-Service: prefill the uncached tokens here, or there and ship the KV.

Two clusters joined by one link (the scenario's fabric: 100 Gbps Ethernet for the study's
setting). A request arrives with ``L`` uncached tokens. Local: one of this cluster's
instances prefills them (FIFO, the instance that frees first); its GPUs are slower for
prefill (``local_speed`` of the profile's device: an H20 against an H200). Offload: the
prompt's token ids go there, a compute-dense remote instance prefills them and streams
the KV here layer by layer over the shared link (FIFO in the order their first layers
become ready), and each landed layer is spliced into this cluster's cache (T_splice, which
a local prefill writing in place does not pay): on idle resources the prompt's trip plus
one layer of each stage and the slowest stage for every further layer, later behind
what the link already carries.

Prefill time, per layer on one GPU as every device term is: ``T_recompute(L) = t0 + L p1 +
L^2 p2`` (the cost model's; t0 a call's fixed time, p2 attention's quadratic term), times the model's layers, over
the instance's GPUs and its speed. Its KV is ``L x kv_bytes_per_token x layers``. Since
the KV grows linearly and the prefill faster, a long request produces its KV at a lower
rate: the reason to offload long requests and keep short ones (whose KV would crowd the
link) here, the study's routing threshold.

Prefix caches (``prefixes`` > 0): a share of the requests start with one of ``prefixes``
shared prefixes (Zipf popularity, each its own lognormal length: system prompts, documents,
a conversation's history), and each cluster keeps an LRU cache of prefixes' KV
(``local_cache_tokens``, ``remote_cache_tokens``). A prefix cached where a request is
prefilled is not prefilled again: its new tokens are, attending the prefix as context
(``t0 + u p1 + u (u + 2h) p2``). An offload ships the KV this cluster lacks (the
new tokens', and the prefix's where it is not cached here); a prefix's KV enters the cache
of each cluster that computed or received it once it is there, so a request that arrives
before that misses. The caches drift apart as the policy places requests: uneven, as the
study says real ones are.

Decode (``output_tokens`` > 0): a request then also decodes its output on one of this
cluster's instances. Deployments split this cluster's instances between prefill and decode
and are compared at saturation, where a decode instance runs a full batch: the rate a split
keeps up with is the lesser of its prefill's (simulated request by request, as above) and
its decode instances' (:meth:`PrefillCosts.decode`, one step's cost from
``core.parts.decode_step_terms``), the best split per deployment, as the study grid-searches
its prefill/decode ratio. The latencies stay prefill's: decode's own is not simulated.

Policies: ``local`` and ``offload`` always, ``threshold`` (offload when more than ``t``
tokens are uncached here: a request whose prefix is cached here stays, cache-aware
placement as the study's), and ``predicate``: per request, the cost model's completion
time of each option with the backlogs it would wait behind (this cluster's freest
instance; the remote one's, and the link's) and each cluster's cache.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from xbench.core.models import get_model
from xbench.core.parts import PrefillScale, decode_step_terms, prefill_time

PREFILL_POLICIES = ("local", "offload", "threshold", "predicate")


@dataclass(frozen=True)
class PrefillWorkload:
    local_instances: int = 8
    remote_instances: int = 4
    local_speed: float = 0.15
    gpus_per_instance: int = 8
    layers: int = 61
    kv_bytes_per_token: float = 1152  # per layer
    length_median: float = 8192
    length_sigma: float = 1.0
    min_length: int = 128
    max_length: int = 131072
    rate_per_s: float = 2.0
    fabric: str = "tcp"
    # bursts: arrivals come ``burst_factor`` times faster during "on" spells than during
    # "off" ones (each spell's length exponential about its mean), at the same mean rate;
    # 1: plain Poisson
    burst_factor: float = 1.0
    burst_on_s: float = 1.0
    burst_off_s: float = 4.0
    # the link's bandwidth over time: ((from s, share of the fabric's), ...), each share
    # holding until the next (the first from 0 s); empty: the fabric's throughout
    link_trace: tuple = ()
    # shared prefixes: ``prefix_share`` of the requests start with one of ``prefixes`` (0:
    # none), chosen by Zipf popularity, each of a lognormal length about ``prefix_median``;
    # each cluster caches prefixes' KV (LRU, up to its tokens; 0: no cache)
    prefixes: int = 0
    prefix_share: float = 1.0
    prefix_median: float = 16384
    prefix_sigma: float = 0.5
    prefix_zipf: float = 1.0
    local_cache_tokens: float = 0.0
    remote_cache_tokens: float = 0.0
    # decode (0 output tokens: none, a request ends when its KV is here): each request then
    # generates ``output_tokens`` on one of this cluster's instances given to decode, up to
    # ``decode_batch`` requests at once and as many as its GPUs' memory holds beside the
    # weights; this cluster's memory rate is ``local_memory_speed`` of the profile's
    # [ceilings] memory, its compute ``local_speed`` of the profile's device, a GPU's memory
    # ``local_hbm_gb`` (0: the profile's [ceilings] hbm)
    output_tokens: int = 0
    decode_batch: int = 256
    local_memory_speed: float = 1.0
    local_hbm_gb: float = 0.0
    # the model's decode: query rows a token (its query heads), the most tokens a token
    # attends (a sparse attention's top-k; inf: all), parameters active a token and in all,
    # bytes a parameter and its matmuls' dtype
    decode_rows: int = 128
    attended_tokens: float = math.inf
    active_params: float = 0.0
    total_params: float = 0.0
    weight_bytes: float = 1.0
    matmul_dtype: str = "bf16"
    # a served model other than ``model``, the one the device's terms are for (the
    # scenario's): its prefill priced from those terms FLOP for FLOP (core.parts.
    # PrefillScale), its KV its own (a hybrid's windowed layers hold the window's); a splice
    # moves its bytes at the terms' time a byte (``reference_kv_bytes``, the terms' model's
    # a token a layer)
    model: str = ""
    served_model: str = ""
    reference_kv_bytes: float = 0.0

    def link_share(self, t: float) -> float:
        """The share of the fabric's bandwidth the link has at ``t`` s."""
        share = 1.0
        for start, value in self.link_trace:
            if start > t:
                break
            share = value
        return share

    def spell_rates(self) -> tuple[float, float]:
        """(on, off) arrival rates whose time-weighted mean is ``rate_per_s``."""
        on, off = self.burst_on_s, self.burst_off_s
        low = self.rate_per_s * (on + off) / (on * self.burst_factor + off)
        return low * self.burst_factor, low


@dataclass
class PrefillTrace:
    arrival: np.ndarray  # s
    length: np.ndarray  # the request's own tokens (never cached)
    # per request: the shared prefix it starts with (-1: none) and that prefix's tokens
    prefix: np.ndarray | None = None
    prefix_tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival)

    def prompts(self) -> np.ndarray:
        """Each request's prompt tokens: its own and its prefix's."""
        return self.length if self.prefix is None else self.length + self.prefix_tokens


def make_prefill_trace(w: PrefillWorkload, requests: int, seed: int = 0) -> PrefillTrace:
    """Poisson arrivals (or bursts: a Markov-modulated Poisson process, on and off spells);
    uncached lengths lognormal about ``length_median``, clipped. Gaps are drawn as unit
    exponentials and scaled, so one seed gives the same draws at every rate."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, requests)
    if w.burst_factor == 1.0:
        arrival = np.cumsum(gaps / w.rate_per_s)
    else:
        arrival = _bursty(w, gaps, np.random.default_rng([seed, 1]))
    length = np.exp(rng.normal(math.log(w.length_median), w.length_sigma, requests))
    length = np.clip(np.rint(length), w.min_length, w.max_length)
    if not w.prefixes:
        return PrefillTrace(arrival, length)
    # the prefixes from a stream of their own, so the arrivals and lengths stay as without
    pick = np.random.default_rng([seed, 2])
    sizes = np.exp(pick.normal(math.log(w.prefix_median), w.prefix_sigma, w.prefixes))
    sizes = np.clip(np.rint(sizes), 1, w.max_length)
    weights = 1.0 / np.arange(1, w.prefixes + 1) ** w.prefix_zipf
    prefix = pick.choice(w.prefixes, requests, p=weights / weights.sum())
    prefix[pick.random(requests) >= w.prefix_share] = -1
    tokens = np.where(prefix >= 0, sizes[np.maximum(prefix, 0)], 0.0)
    return PrefillTrace(arrival, length, prefix, tokens)


class PrefixCache:
    """One cluster's LRU cache of prefixes' KV, by tokens: a prefix counts as cached from
    when its KV is there (``ready``), and the least recently used leave to make room."""

    def __init__(self, capacity: float):
        self.capacity = capacity
        self.held = 0.0
        self.entries: OrderedDict[int, tuple[float, float]] = OrderedDict()  # (tokens, ready)

    def cached(self, prefix: int, now: float) -> float:
        """The tokens of ``prefix`` cached and ready at ``now`` (0 if not)."""
        entry = self.entries.get(prefix)
        return 0.0 if entry is None or entry[1] > now else entry[0]

    def put(self, prefix: int, tokens: float, ready: float) -> None:
        """``prefix``'s KV is here from ``ready`` (an earlier entry keeps its time), or was
        used again: the most recently used either way."""
        if tokens > self.capacity:
            return
        entry = self.entries.pop(prefix, None)
        if entry is not None:
            self.held -= entry[0]
            ready = min(ready, entry[1])
        while self.entries and self.held + tokens > self.capacity:
            _, (gone, _) = self.entries.popitem(last=False)
            self.held -= gone
        self.entries[prefix] = (tokens, ready)
        self.held += tokens


def _bursty(w: PrefillWorkload, gaps: np.ndarray, rng) -> np.ndarray:
    """Arrival times from unit-exponential ``gaps``, on and off spells alternating (the
    first drawn by its share of time): a gap that would cross a spell's end is cut there
    and what is left of it runs at the next spell's rate (memoryless, so exact)."""
    rates = w.spell_rates()
    means = (w.burst_on_s, w.burst_off_s)
    state = 0 if rng.random() < means[0] / (means[0] + means[1]) else 1
    t, end = 0.0, rng.exponential(means[state])
    out = np.empty(len(gaps))
    for i, g in enumerate(gaps.tolist()):
        while t + g / rates[state] > end:  # the spell ends first
            g -= (end - t) * rates[state]
            t = end
            state = 1 - state
            end = t + rng.exponential(means[state])
        t += g / rates[state]
        out[i] = t
    return out


PROMPT_BYTES_PER_TOKEN = 4  # a token id (int32): what a remote prefill is sent


class PrefillCosts:
    """The model's times for one prefill workload, read once from the profile."""

    def __init__(self, profile, w: PrefillWorkload):
        d = profile.device
        if d.recompute_per_token is None:
            raise ValueError(f"profile {profile.name} has no recompute_per_token")
        self.w, self.fabric, self.device = w, profile.fabric(w.fabric), d
        served = get_model(w.served_model) if w.served_model else None
        # the layers whose KV grows with the context, and a hybrid's windowed layers' KV a
        # token of the window
        full = served.full_layers if served else w.layers
        self.kv_per_token = w.kv_bytes_per_token * full
        self.window_tokens = served.window_tokens if served else 0
        self.window_kv_bytes = (w.layers - full) * served.window_kv_bytes if served else 0.0
        self.scale = (
            PrefillScale.of(get_model(w.model), served, profile.ceilings) if served else None
        )
        self.ceilings = profile.ceilings
        if w.output_tokens and (self.ceilings is None or not (w.local_hbm_gb or self.ceilings.hbm)):
            raise ValueError(
                f"profile {profile.name} has no [ceilings] memory rate and GPU memory (hbm), "
                "which a decode step reads its weights and KV at"
            )

    def prefill(self, tokens: float, speed: float = 1.0, context: float = 0.0) -> float:
        """One instance's prefill of ``tokens`` at ``speed`` of the profile's device, after
        ``context`` cached tokens they attend (a prefix), in one call a layer."""
        w = self.w
        return prefill_time(
            self.device, tokens, context, w.layers, w.gpus_per_instance, speed, self.scale
        )

    def kv_bytes(self, tokens: float) -> float:
        """The whole model's KV of ``tokens`` (a hybrid's windowed layers hold at most the
        window's)."""
        return tokens * self.kv_per_token + min(tokens, self.window_tokens) * self.window_kv_bytes

    def local(self, tokens: float, context: float = 0.0) -> float:
        return self.prefill(tokens, self.w.local_speed, context)

    def transfer(self, tokens: float) -> float:
        """The KV of ``tokens`` over the link, one message per layer."""
        return self.fabric.wire(self.kv_bytes(tokens), self.w.layers)

    def prompt(self, tokens: float) -> float:
        """The prompt's trip to the remote cluster: its token ids, one message."""
        return self.fabric.wire(tokens * PROMPT_BYTES_PER_TOKEN)

    def splice(self, tokens: float) -> float:
        """Splicing one layer's landed KV into this cluster's cache (the device's T_splice):
        what a local prefill, writing its KV in place, does not pay. A layer moves the mean
        layer's bytes: as many tokens of the terms' model as hold them (``tokens`` where the
        clusters serve that model)."""
        w = self.w
        per_layer = self.kv_bytes(tokens) / w.layers
        return self.device.splice(per_layer / (w.reference_kv_bytes or w.kv_bytes_per_token))

    def offload(self, tokens: float) -> float:
        """On idle resources: the prompt sent there, then remote prefill, transfer and
        splice here as a pipeline over the layers (the link starts with the first layer's
        KV; each landed layer is spliced in turn): one layer of each stage plus the slowest
        stage for every further layer."""
        x, p, layers = self.transfer(tokens), self.prefill(tokens), self.w.layers
        s = self.splice(tokens)
        stages = (p / layers, x / layers, s)
        return self.prompt(tokens) + sum(stages) + (layers - 1) * max(stages)

    def parts(self, tokens: float) -> dict | None:
        """Both options' times at ``tokens`` on idle resources, offload's by stage summed
        over the layers (they overlap: offload's time is less than their sum); None where
        ``tokens`` is not a length (inf or 0)."""
        if not 0 < tokens < math.inf:
            return None
        layers = self.w.layers
        return {
            "local": self.local(tokens),
            "offload": self.offload(tokens),
            "prompt": self.prompt(tokens),
            "remote_prefill": self.prefill(tokens),
            "transfer": self.transfer(tokens),
            "splice": layers * self.splice(tokens),
            "local_speed": self.w.local_speed,
        }

    def decode(self, prompts: np.ndarray) -> dict | None:
        """One of this cluster's instances decoding at full batch (the steady state at
        saturation; None without decode): the batch (``decode_batch``, or fewer where the
        GPUs' memory beside the weights holds fewer requests' KV), one step's time in its two
        terms (``core.parts.decode_step_terms``) and the requests a second it finishes.

        A request's token attends its prompt and what it generated so far: on average over
        its ``output_tokens`` steps, the prompt and (output_tokens - 1) / 2 more (the mean of
        ``prompts``, the trace's), at most the model's ``attended_tokens``; the KV it holds,
        the same tokens on every layer. The batch's tokens use ``active_params`` each, at most
        ``total_params`` in all (an MoE's experts read once however many tokens chose them)."""
        w, ceilings = self.w, self.ceilings
        if not w.output_tokens:
            return None
        held = np.asarray(prompts, dtype=float) + (w.output_tokens - 1) / 2
        hbm = w.local_hbm_gb * 1e9 or ceilings.hbm
        free = w.gpus_per_instance * hbm - w.total_params * w.weight_bytes
        fits = math.floor(free / (held.mean() * self.kv_per_token)) if free > 0 else 0
        batch = min(w.decode_batch, fits)
        out = {
            "batch": batch,
            "batch_bound": "memory" if fits < w.decode_batch else "decode_batch",
        }
        if batch < 1:
            return {**out, "linear_s": math.nan, "attention_s": math.nan, "step_s": math.nan,
                    "per_instance_per_s": 0.0}  # fmt: skip
        linear, attention = decode_step_terms(
            self.device,
            batch,
            float(np.minimum(held, w.attended_tokens).mean()),
            rows=w.decode_rows,
            layers=w.layers,
            gpus=w.gpus_per_instance,
            weight_bytes_read=min(w.total_params, batch * w.active_params) * w.weight_bytes,
            flops=2 * w.active_params * batch,
            memory_rate=ceilings.memory,
            matmul_rate=ceilings.matmul_for(w.matmul_dtype),
            memory_speed=w.local_memory_speed,
            compute_speed=w.local_speed,
        )
        step = linear + attention
        return {
            **out,
            "linear_s": linear,
            "attention_s": attention,
            "step_s": step,
            "per_instance_per_s": batch / (w.output_tokens * step),
        }

    def kv_rate(self, tokens: float) -> float:
        """Bytes per second one remote instance produces prefilling ``tokens``."""
        return self.kv_bytes(tokens) / self.prefill(tokens)

    def idle_threshold(self) -> float:
        """The shortest length from which offloading beats prefilling here on idle
        resources (and stays ahead up to ``max_length``); 0 when it wins at every length,
        inf when never."""
        grid = np.unique(np.geomspace(1, self.w.max_length, 512).round())
        wins = np.array([self.offload(t) < self.local(t) for t in grid])
        if wins.all():
            return 0.0
        if not wins[-1]:
            return math.inf
        last_loss = np.flatnonzero(~wins)[-1]
        lo, hi = grid[last_loss], grid[last_loss + 1]
        while hi - lo > 1:  # bisect between the last loss and the first win after it
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.offload(mid) < self.local(mid) else (mid, hi)
        return float(hi)


def _landed(link_start, transfer, prefill_end, splice, layers) -> tuple[float, float]:
    """(when the link is done with an offload's KV, when its last layer is spliced here):
    streamed, it cannot leave before its last layer is prefilled and sent, and each landed
    layer is spliced in turn, the last after it lands."""
    end = max(link_start + transfer, prefill_end + transfer / layers)
    return end, max(end + splice, link_start + transfer / layers + layers * splice)


@dataclass
class PrefillResult:
    latency: np.ndarray  # s from arrival to the KV being here
    offloaded: np.ndarray  # bool
    makespan: float
    local_busy: np.ndarray
    remote_busy: np.ndarray
    link_busy: float
    bytes_moved: float
    # prompt tokens found in the cache of the cluster that prefilled them, and all of them
    hit_tokens: float = 0.0
    prompt_tokens: float = 0.0


def simulate_prefill(
    profile, w: PrefillWorkload, trace: PrefillTrace, policy: str, threshold: float = math.inf
) -> PrefillResult:
    if policy not in PREFILL_POLICIES:
        raise ValueError(f"unknown policy {policy!r}")
    return _PrefillRun(PrefillCosts(profile, w), trace, policy, threshold).run()


class _PrefillRun:
    """One policy over one trace: each cluster's instances (FIFO, the one that frees first),
    its prefix cache, and the link, whose transfers queue in the order their first layer is
    ready; one is committed once no later arrival can be ready before it (its first layer
    is no later than now)."""

    def __init__(self, costs: PrefillCosts, trace: PrefillTrace, policy: str, threshold: float):
        w, n = costs.w, len(trace)
        self.costs, self.w, self.trace = costs, w, trace
        self.policy, self.threshold = policy, threshold
        self.latency = np.zeros(n)
        self.offloaded = np.zeros(n, dtype=bool)
        self.local_free = [0.0] * w.local_instances  # when each instance frees (work known)
        self.remote_free = [0.0] * w.remote_instances
        self.local_busy = np.zeros(w.local_instances)
        self.remote_busy = np.zeros(w.remote_instances)
        # each cluster's prefix cache (local, remote), and the requests' prefixes
        self.caches = (PrefixCache(w.local_cache_tokens), PrefixCache(w.remote_cache_tokens))
        self.prefixes = [-1] * n if trace.prefix is None else trace.prefix.tolist()
        self.prefix_tokens = [0.0] * n if trace.prefix is None else trace.prefix_tokens.tolist()
        self.hit_tokens = self.prompt_tokens = 0.0
        # (first layer ready, seq, request, transfer time, prefill end, tokens)
        self.ready: list = []
        self.link_free = self.link_busy = self.moved = 0.0
        self.pending_work = 0.0  # transfer time of the queued, uncommitted transfers
        self.last = 0.0

    def commit(self, until: float) -> None:
        """Put on the link, in order, the transfers whose first layer is ready by ``until``."""
        w, ready = self.w, self.ready
        while ready and ready[0][0] <= until:
            start_ready, _, r, x, prefill_end, shipped = heapq.heappop(ready)
            self.pending_work -= x
            start = max(self.link_free, start_ready)
            # at the bandwidth it starts at (the link trace's share then)
            x /= w.link_share(start)
            end, done = _landed(start, x, prefill_end, self.costs.splice(shipped), w.layers)
            self.link_free = end
            self.link_busy += x
            self.latency[r] = done - self.trace.arrival[r]
            self.last = max(self.last, done)
            if self.prefixes[r] >= 0:  # its prefix's KV is here too now
                self.caches[0].put(self.prefixes[r], self.prefix_tokens[r], done)

    def ships(self, now, i, j, prompt, shipped, here, remote_prefill) -> bool:
        """Whether the policy offloads: always, never, above the threshold, or where the
        model's completion time behind each side's backlogs is sooner there."""
        if self.policy in ("local", "offload"):
            return self.policy == "offload"
        if self.policy == "threshold":
            return shipped > self.threshold
        costs, w = self.costs, self.w
        local_done = max(self.local_free[i], now) + costs.local(shipped, here)
        start = max(self.remote_free[j], now + costs.prompt(prompt))
        x, s = costs.transfer(shipped), costs.splice(shipped)
        x /= w.link_share(now)  # at the bandwidth the link has now
        link_start = max(self.link_free, start + remote_prefill / w.layers) + self.pending_work
        _, ship_done = _landed(link_start, x, start + remote_prefill, s, w.layers)
        return ship_done < local_done

    def offload(self, r, now, j, prompt, shipped, there, remote_prefill) -> None:
        costs, w, p = self.costs, self.w, self.prefixes[r]
        start = max(self.remote_free[j], now + costs.prompt(prompt))
        self.remote_free[j] = start + remote_prefill
        self.remote_busy[j] += remote_prefill
        x = costs.transfer(shipped)
        first_layer = start + remote_prefill / w.layers
        heapq.heappush(self.ready, (first_layer, r, r, x, start + remote_prefill, shipped))
        self.pending_work += x
        self.moved += costs.kv_bytes(shipped)
        self.offloaded[r] = True
        self.hit_tokens += there
        if p >= 0:
            self.caches[1].put(p, self.prefix_tokens[r], start + remote_prefill)

    def prefill_here(self, r, now, i, shipped, here) -> None:
        work = self.costs.local(shipped, here)
        end = max(self.local_free[i], now) + work
        self.local_free[i] = end
        self.local_busy[i] += work
        self.latency[r] = end - now
        self.last = max(self.last, end)
        self.hit_tokens += here
        if self.prefixes[r] >= 0:
            self.caches[0].put(self.prefixes[r], self.prefix_tokens[r], end)

    def run(self) -> PrefillResult:
        w, trace, caches = self.w, self.trace, self.caches
        local_free, remote_free = self.local_free, self.remote_free
        for r, (now, tokens) in enumerate(
            zip(trace.arrival.tolist(), trace.length.tolist(), strict=True)
        ):
            self.commit(now)
            # none where every instance here decodes (a deployment that offloads every prefill)
            i = min(range(w.local_instances), key=local_free.__getitem__, default=None)
            j = min(range(w.remote_instances), key=remote_free.__getitem__)
            p = self.prefixes[r]
            prompt = tokens + self.prefix_tokens[r]
            # the prefix's tokens cached (and ready) here and there: each prefills the rest
            here = caches[0].cached(p, now) if p >= 0 else 0.0
            there = caches[1].cached(p, now) if p >= 0 else 0.0
            remote_prefill = self.costs.prefill(prompt - there, 1.0, there)
            shipped = prompt - here  # the KV this cluster lacks
            if self.ships(now, i, j, prompt, shipped, here, remote_prefill):
                self.offload(r, now, j, prompt, shipped, there, remote_prefill)
            else:
                self.prefill_here(r, now, i, shipped, here)
            self.prompt_tokens += prompt
        self.commit(math.inf)
        makespan = self.last - float(trace.arrival[0]) if len(trace) else 0.0
        return PrefillResult(
            self.latency, self.offloaded, makespan, self.local_busy, self.remote_busy,
            self.link_busy, self.moved, self.hit_tokens, self.prompt_tokens,
        )  # fmt: skip


def summarize_prefill(result: PrefillResult, policy: str, fabric: str, threshold=None) -> dict:
    lat = result.latency * 1e3
    span = result.makespan or float("nan")
    return {
        "fabric": fabric,
        "policy": policy,
        "threshold_tokens": float("nan") if threshold is None else float(threshold),
        "best": False,
        "requests": len(lat),
        "p50_ms": float(np.percentile(lat, 50)),
        "p90_ms": float(np.percentile(lat, 90)),
        "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(lat.mean()),
        "throughput_per_s": len(lat) / span,
        "share_offloaded": float(result.offloaded.mean()),
        "bytes_moved": float(result.bytes_moved),
        "link_util": result.link_busy / span,
        "link_gbps": 8 * result.bytes_moved / span / 1e9,
        "local_util": float(result.local_busy.mean() / span),
        "remote_util": float(result.remote_busy.mean() / span),
        # prompt tokens found in the prefix cache of the cluster that prefilled them
        "hit_rate": result.hit_tokens / result.prompt_tokens if result.prompt_tokens else 0.0,
    }


def threshold_grid(trace: PrefillTrace, points: int = 33) -> np.ndarray:
    """The thresholds a grid search tries: the trace's prompt length quantiles (every share
    of offloaded requests from none to all, in steps, where nothing is cached), as the study
    grid-searches its t."""
    return np.unique(np.quantile(trace.prompts(), np.linspace(0, 1, points)))


# KV a prefill instance of 8 H200 produces at 32K tokens, Gb/s, per the study's table
# (arXiv 2604.15039), for the public models xbench has a preset of
STUDY_KV_GBPS_32K = {"mimo-v2-flash": 4.66}
STUDY_TOKENS, STUDY_GPUS = 32768, 8


def _against_study(costs: PrefillCosts) -> dict:
    """Where the study measured the served model's KV rate: its figure, and the prefill
    time it implies for this KV (the KV's bytes over its rate) against the model's."""
    name = costs.w.served_model
    if name not in STUDY_KV_GBPS_32K:
        return {}
    kv = costs.kv_bytes(STUDY_TOKENS)
    study = STUDY_KV_GBPS_32K[name]
    return {
        "study": {
            "model": name,
            "tokens": STUDY_TOKENS,
            "kv_gbps": study,
            "kv_bytes": kv,
            # on the study's instance of 8 GPUs, whatever this workload's instance has
            "prefill_s": costs.prefill(STUDY_TOKENS) * costs.w.gpus_per_instance / STUDY_GPUS,
            "implied_prefill_s": 8 * kv / (study * 1e9),
        }
    }


def run_prefill(profile, spec: dict, requests: int, seed: int, on_step=None):
    """Per fabric: local, offload and predicate, and the threshold policy at every point
    of :func:`threshold_grid`, one trace per fabric; the threshold with the least mean
    latency is marked ``best`` (the study's routing threshold, found as it found its own).
    Returns (frame, facts) with facts per fabric: the idle-resource crossover and the KV
    production rate of one remote instance at a few lengths."""
    import pandas as pd

    rows, facts = [], []
    for fabric in spec["fabrics"]:
        w = PrefillWorkload(**spec["fields"], fabric=fabric)
        trace = make_prefill_trace(w, requests, seed)
        costs = PrefillCosts(profile, w)
        for policy in ("local", "offload", "predicate"):
            rows.append(
                summarize_prefill(simulate_prefill(profile, w, trace, policy), policy, fabric)
            )
            if on_step:
                on_step(f"{fabric} {policy}")
        grid = [
            summarize_prefill(
                simulate_prefill(profile, w, trace, "threshold", t), "threshold", fabric, t
            )
            for t in threshold_grid(trace)
        ]
        min(grid, key=lambda row: row["mean_ms"])["best"] = True
        rows.extend(grid)
        if on_step:
            on_step(f"{fabric} thresholds")
        facts.append(
            {
                "fabric": fabric,
                "idle_threshold": costs.idle_threshold(),
                "idle_parts": costs.parts(costs.idle_threshold()),
                "kv_gbps": {t: 8 * costs.kv_rate(t) / 1e9 for t in (4096, 32768, 131072)},
                **_against_study(costs),
                "link_gbps": 8 * 1e9 / costs.fabric.wire(1e9) / 1e9,  # what 1 GB moves at
            }
        )
    return pd.DataFrame(rows), facts


# A policy keeps up with a rate when the requests completed by the last arrival are at
# least this share of those that arrived: under the capacity, all but the few in flight
# (their mean latency times the rate); past it, the completions fall behind by the excess,
# so the rule admits at most about 2 % of overload. With a random trace's fluctuations, the
# rates found on one-length workloads sit within -4 to +3 % of the capacities worked by hand
# (tests/test_prefill_saturation.py).
KEEP_UP = 0.98


def keeps_up(result: PrefillResult, trace: PrefillTrace) -> bool:
    """Whether ``KEEP_UP`` of the trace's requests were done by its last arrival."""
    done = trace.arrival + result.latency
    last = trace.arrival[-1]
    return bool((done <= last).sum() >= KEEP_UP * len(trace))


def sustainable_rate(
    profile,
    w: PrefillWorkload,
    policy: str,
    requests: int,
    seed: int,
    threshold=math.inf,
    ceiling=math.inf,
) -> float:
    """The highest arrival rate ``policy`` keeps up with (``keeps_up``), by bisection on a
    log scale to 1 %, on one trace whose gaps are scaled with the rate (the same lengths
    and the same draws at every rate); ``ceiling`` where it keeps up with that (what
    another part of the deployment caps it at: its decode)."""
    from dataclasses import replace

    def ok(rate: float) -> bool:
        wr = replace(w, rate_per_s=rate)
        trace = make_prefill_trace(wr, requests, seed)
        return keeps_up(simulate_prefill(profile, wr, trace, policy, threshold), trace)

    if ceiling < math.inf and (ceiling <= 0 or ok(ceiling)):
        return max(ceiling, 0.0)
    # bracket: the whole fleet's rate if every GPU prefilled the median length at full speed
    costs = PrefillCosts(profile, w)
    fleet = (w.local_instances * w.local_speed + w.remote_instances) / costs.prefill(
        w.length_median
    )
    lo, hi = fleet / 1024, min(fleet * 4, ceiling)
    # a policy on a small share of the fleet (a slow cluster alone, a thin link) may not
    # keep up even there: step the bracket down until it does, or call it none
    while not ok(lo):
        if lo < fleet * 1e-12:
            return 0.0
        lo, hi = lo / 1024, lo
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# Deployments compared at saturation (the study's comparison, in this simulator's terms):
# this cluster alone (homogeneous), as many GPUs as both clusters all of this cluster's kind
# (homogeneous, same GPUs: the study's baseline, 96 H20 against its 32 H200 + 64 H20), every
# prefill sent to the PrfaaS cluster (naive heterogeneous), and PrfaaS's routing: offload
# above a threshold (the best on a grid, at saturation) or the predicate
DEPLOYMENTS = (
    ("homogeneous", "local"),
    ("homogeneous, same GPUs", "local"),
    ("naive heterogeneous", "offload"),
    ("PrfaaS, threshold", "threshold"),
    ("PrfaaS, predicate", "predicate"),
)
# the deployment of as many GPUs as both clusters, all of this cluster's kind (its instances
# and the remote one's count, at this cluster's speed)
SAME_GPUS = "homogeneous, same GPUs"


def splits(policy: str, instances: int, decodes: bool) -> list[tuple[int, int]]:
    """The (prefill, decode) splits of this cluster's ``instances`` a deployment of
    ``policy`` may run, fewest prefill instances first: without decode, all prefill; with
    it, at least one decoding and none prefilling (offload), at least one (local), or from
    none (threshold and predicate: with none prefilling here every prefill is offloaded,
    as the naive deployment's)."""
    if not decodes:
        return [(instances, 0)]
    least = {"offload": 0, "local": 1}.get(policy, 0)
    most = 0 if policy == "offload" else instances - 1
    return [(p, instances - p) for p in range(least, most + 1)]


def _best_split(profile, w, name, policy, per_decode, grid, requests, seed) -> dict:
    """The split of :func:`splits` whose deployment keeps up with the highest rate: the
    least of its prefill's rate (simulated; the threshold's best over ``grid``) and its
    decode instances' (``per_decode`` each), as the study grid-searches its prefill/decode
    ratio. Fewer prefill instances leave more decoding, so the search stops once the
    prefill keeps up with the decode, or the decode falls to the best found; it steps
    through every split before (a simulated rate need not rise with each instance)."""
    from dataclasses import replace

    instances = w.local_instances + (w.remote_instances if name == SAME_GPUS else 0)
    best = None
    for n_prefill, n_decode in splits(policy, instances, per_decode is not None):
        decode = n_decode * per_decode if per_decode is not None else math.inf
        if best is not None and decode <= best["max_rate_per_s"]:
            break
        wp = replace(w, local_instances=n_prefill)
        run = policy if n_prefill else "offload"  # nothing prefills here: offload all
        if run == "threshold":
            rate, t = max(
                (sustainable_rate(profile, wp, run, requests, seed, t, decode), t) for t in grid
            )
        else:
            rate = sustainable_rate(profile, wp, run, requests, seed, ceiling=decode)
            t = 0.0 if policy == "threshold" else math.nan  # a threshold of 0: offload all
        row = {
            "threshold_tokens": float(t),
            "max_rate_per_s": min(rate, decode),
            "prefill_instances": n_prefill,
            "decode_instances": n_decode,
            "decode_rate_per_s": decode if decode < math.inf else math.nan,
        }
        if best is None or row["max_rate_per_s"] > best["max_rate_per_s"]:
            best = row
        if rate >= decode:  # more prefill instances here only decode less
            break
    return best


# what :meth:`PrefillCosts.decode` gives that the saturation table carries (as decode_<key>)
DECODE_KEYS = ("batch", "step_s", "linear_s", "attention_s", "per_instance_per_s")


def saturation(profile, spec: dict, requests: int, seed: int, on_step=None):
    """Per fabric and deployment, the highest rate it keeps up with (the threshold's best
    over :func:`threshold_grid`; with decode, at the best split of this cluster's instances
    between prefill and decode), and each against the homogeneous deployments (this cluster
    alone, and as many GPUs as both clusters of this cluster's kind) and the naive one."""
    import pandas as pd

    rows = []
    for fabric in spec["fabrics"]:
        w = PrefillWorkload(**spec["fields"], fabric=fabric)
        trace = make_prefill_trace(w, requests, seed)
        decode = PrefillCosts(profile, w).decode(trace.prompts())
        per_decode = decode["per_instance_per_s"] if decode else None
        # one decode instance at full batch, beside every deployment (nan without decode)
        decoding = {f"decode_{key}": (decode or {}).get(key, math.nan) for key in DECODE_KEYS}
        decoding["decode_batch_bound"] = decode["batch_bound"] if decode else None
        decoding["output_tokens"] = w.output_tokens
        grid = threshold_grid(trace, points=17)
        by = {}
        for name, policy in DEPLOYMENTS:
            best = _best_split(profile, w, name, policy, per_decode, grid, requests, seed)
            by[name] = best["max_rate_per_s"]
            rows.append(
                {"fabric": fabric, "deployment": name, "policy": policy, **best, **decoding}
            )
            if on_step:
                on_step(f"{fabric} {name} at saturation")
        for row in rows[-len(DEPLOYMENTS) :]:  # nan against a deployment that kept up with none
            for key, base in (
                ("vs_homogeneous", "homogeneous"),
                ("vs_same_gpus", SAME_GPUS),
                ("vs_naive", "naive heterogeneous"),
            ):
                rate = by[base]
                row[key] = row["max_rate_per_s"] / rate - 1 if rate > 0 else math.nan
    return pd.DataFrame(rows)
