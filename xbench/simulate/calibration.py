"""The compute costs a replay's own calls measured, put into the profile the simulation runs.

``xbench simulate --validate`` compares a simulation with a real replay. Where they differ,
either the simulator's dynamics are off (queueing, batching, the cache, the links) or the
costs it was given are (a profile's kernel times, measured alone in a sweep, against the
same kernels run by two busy ranks side by side). A calibration replay of another trace
(another seed, so nothing validated is fitted to) separates the two, as a serving
simulator profiles its operators on the deployment it predicts: every compute job the
ranks ran is compared with the profile's time for it, and the profile's terms are scaled to
what they measured.

- attention back to back (a job that started within ``WARM_IDLE`` of the one before): T_c
  scaled by the median of measured / modelled over those calls, batched or not;
- attention after idle: the extra over the scaled T_c, fitted as E (1 - exp(-g / tau)) with
  the profile's tau (a one-parameter least squares);
- merge and gather: each scaled by its median ratio; the splice (a copy on the same core) by
  the gather's, assumed, not measured (``simulate --validate`` says so under its costs): a
  replay's fetched jobs hold it beside an attention that varies by more than it costs;
- the spread of attention calls about their scaled time (back to back, the same shape ran
  from 0.7x to 2.5x its median in a replay here, slow calls in runs): each rank's factors
  in the order they ran, which the simulation's instance takes call by call, as a
  deterministic server, or one drawing factors independently, understates the queues a
  varying one builds (its p99 was 2-49 % low with independent draws, 0-24 % in order);
- taking arrivals and messages in (the rank's loop between its jobs, 10-40 us each in a
  Python replay): their mean cost per item, which the simulation charges the core.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from xbench.core.costmodel import Coef

WARM_IDLE = 2e-4  # s: a job that starts this soon after the last one ran back to back


def _scaled(c: Coef | None, f: float) -> Coef | None:
    if c is None:
        return None
    return Coef(c.value * f, c.low * f, c.high * f, c.unit, c.prior)


def _pieces(pieces: tuple, f: float) -> tuple:
    return tuple((piece[0], *(_scaled(c, f) for c in piece[1:])) for piece in pieces)


def job_costs(jobs_by_rank: list) -> list[tuple[str, float, float, int]]:
    """(kind, seconds, idle before, queries served) per compute job of every rank; idle
    is the time since the rank's last compute job (the first follows an idle as long as
    the replay's start). The rank's message handling in between (``messages``: taking
    arrivals and messages in, a few per cent of its time) is not compute and is left out."""
    out = []
    for jobs in jobs_by_rank:
        end = -math.inf
        for kind, start, stop, calls in sorted(jobs, key=lambda j: j[1]):
            if kind == "messages":
                continue
            out.append((kind, stop - start, start - end, calls))
            end = stop
    return out


@dataclass
class Calibration:
    profile: object  # the profile, its compute terms scaled to what the replay measured
    factors: dict  # each term's factor (and the idle extra), as printed and stored
    # per rank, its back-to-back attention calls' measured / modelled time over their
    # median, in the order they ran: the simulated calls vary as the replay's did
    spread: list
    message_cost: float = 0.0  # s of a rank's core per arrival or message it took in


def _attention_factors(d, w, per_rank: list) -> tuple[list, float | None, float]:
    """Per rank, the warm attention calls' measured / modelled ratios; the idle extra
    fitted on the cold calls once the warm ones' median scales the model (None without an
    idle term or cold calls); and that median."""
    rh, chunk = w.rows * w.heads, w.chunk_tokens

    def attend(calls: int) -> float:
        return d.compute(calls * rh, chunk)

    by_rank = [
        np.array(
            [t / attend(q) for kind, t, idle, q in rank if kind == "attend" and idle < WARM_IDLE]
        )
        for rank in per_rank
    ]
    warm = np.concatenate(by_rank) if by_rank else np.array([])
    if not len(warm):
        raise ValueError("the calibration replay ran no attention back to back")
    f_attend = float(np.median(warm))
    tau = d.idle_tau.value if d.idle_tau is not None else None
    extra = None
    if tau is not None:
        cold = [
            (-math.expm1(-idle / tau), t - f_attend * attend(q))
            for rank in per_rank
            for kind, t, idle, q in rank
            if kind == "attend" and idle >= WARM_IDLE
        ]
        if cold:
            x, y = np.array(cold).T
            extra = max(float(x @ y / (x @ x)), 0.0)
    return by_rank, extra, f_attend


def _merge_and_move_factors(d, w, jobs: list) -> tuple[float, float, float]:
    """(merge, gather, move) factors: the median measured / modelled merge (after a wait
    where the profile measured one) and gather, and the move's whole factor once its
    splice scales as the gather does."""
    rh, chunk = w.rows * w.heads, w.chunk_tokens

    def merge(idle: float) -> float:
        """The profile's merge: after a wait where it measured one (a routed answer's)."""
        return (
            d.merge_after_wait(rh, 2, chunk, idle) if idle >= WARM_IDLE else d.merge(rh, 2, chunk)
        )

    merges = [t / merge(idle) for kind, t, idle, _ in jobs if kind == "merge"]
    f_merge = float(np.median(merges)) if merges else 1.0
    splice = min(d.splice(chunk), d.move(chunk))
    gather = d.move(chunk) - splice
    gathers = [t / gather for kind, t, _, _ in jobs if kind == "gather"] if gather > 0 else []
    f_gather = float(np.median(gathers)) if gathers else 1.0
    # The splice, a copy on the same core as the gather, scales by the gather's ratio: a
    # fetched job's residual (less its attention, merge and idle extra) was tried and is
    # noise, as its attention alone varies by more than the splice costs (it gave 0-2.7x).
    # The move's pieces scale so the gather (move - splice) scales by f_gather at this chunk.
    move = d.move(chunk)
    f_move = (f_gather * gather + f_gather * splice) / move if move > 0 else 1.0
    return f_merge, f_gather, f_move


def _scaled_device(d, f_attend: float, f_merge: float, f_move: float, f_splice: float):
    """The device with each family's terms (and pieces) scaled by its factor."""
    scaled = {}
    for terms, f in (
        (("compute_t0", "compute_per_token", "compute_per_row_token"), f_attend),
        # a merge after a wait is compared whole (merge and wait extra), so both scale
        (
            (
                "merge_t0",
                "merge_per_row_partial",
                "merge_per_token",
                "merge_wait_t0",
                "merge_wait_per_row_partial",
            ),
            f_merge,
        ),
        (("move_t0", "move_per_token"), f_move),
        (("splice_t0", "splice_per_token"), f_splice),
    ):
        scaled.update({term: _scaled(getattr(d, term), f) for term in terms})
        kind = terms[0].removesuffix("_t0")
        if hasattr(d, f"{kind}_segments"):
            scaled[f"{kind}_segments"] = _pieces(getattr(d, f"{kind}_segments"), f)
    return scaled


def calibrate(profile, w, jobs_by_rank: list) -> Calibration:
    """``profile`` with its compute terms scaled to the replay's jobs, the factors, and
    the spread of the attention calls about the scaled time."""
    d = profile.device
    per_rank = [job_costs([rank_jobs]) for rank_jobs in jobs_by_rank]
    jobs = [job for rank in per_rank for job in rank]
    by_rank, extra, f_attend = _attention_factors(d, w, per_rank)
    f_merge, f_gather, f_move = _merge_and_move_factors(d, w, jobs)
    f_splice = f_gather
    scaled = _scaled_device(d, f_attend, f_merge, f_move, f_splice)
    if extra is not None:
        scaled["idle_extra"] = Coef(extra, extra, extra, "s")
    device = dataclasses.replace(d, **scaled)
    warm = np.concatenate(by_rank)
    factors = {
        "attention": f_attend,
        "attention_calls": len(warm),
        "idle_extra_us": None if extra is None else extra * 1e6,
        "merge": f_merge,
        "gather": f_gather,
        "splice": f_splice,  # the gather's: assumed, not measured (see _merge_and_move_factors)
        # the calls' spread: robust sd of log(measured / modelled)
        "attention_spread": float(1.4826 * np.median(np.abs(np.log(warm / f_attend)))),
    }
    handled = [
        (stop - start, items)
        for jobs in jobs_by_rank
        for kind, start, stop, items in jobs
        if kind == "messages"
    ]
    message_cost = sum(t for t, _ in handled) / max(sum(n for _, n in handled), 1)
    factors["message_us"] = message_cost * 1e6
    return Calibration(
        dataclasses.replace(profile, device=device),
        factors,
        [ratios / f_attend for ratios in by_rank if len(ratios)],
        message_cost,
    )
