"""The predicate over many requests at once (numpy), with the same answers as :func:`decide`.

``decide_grid(profile, grid)`` takes a DataFrame with one request per row (columns named as
:class:`~xbench.core.costmodel.Request` fields; missing ones take the Request defaults),
or a mapping of field -> list of values whose cartesian product is the grid. It returns
the grid with the decision columns appended.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import pandas as pd

from xbench.core.costmodel import (
    FETCH,
    HIGH,
    LOCAL,
    LOW,
    ROUTE,
    SEPARATING,
    VALUE,
    DeviceSide,
    Profile,
    Request,
    Step,
    choose,
    closed_forms,
    device_side,
    interval_reaches,
    local_time,
    option_times,
    prior_flag,
    separating_term,
    wire_parts,
)

REQUEST_DEFAULTS = dict(Request._field_defaults)
CHOICES = pd.CategoricalDtype([ROUTE, FETCH, LOCAL])
RANKS = pd.CategoricalDtype(list(SEPARATING))
BLOCK = 1 << 16
_FLAGS = ("include_probe", "blocks_local", "pipeline_layers")
MAX_THREADS = 8


def expand(axes: dict) -> pd.DataFrame:
    """Cartesian product of the given request fields."""
    names = list(axes)
    return pd.DataFrame(list(itertools.product(*(axes[n] for n in names))), columns=names)


def _column(grid: pd.DataFrame, name: str, dtype=np.float64):
    """The column as an array, or the Request default as a scalar (numpy broadcasts it)."""
    if name in grid.columns:
        return grid[name].to_numpy().astype(dtype, copy=False)
    default = REQUEST_DEFAULTS[name]
    return dtype(np.nan if default is None else default)


def _subset(values, index):
    return values[index] if np.ndim(values) else values


def _full(values, n: int) -> np.ndarray:
    return np.broadcast_to(values, (n,)).copy() if np.ndim(values) == 0 else values


class ArrayOps:
    """Lookups and choices on numpy arrays: the cost model's formulas, a block at a time."""

    @staticmethod
    def piece(breaks: tuple, pieces: tuple, x):
        if not breaks:
            return pieces[0]
        k = np.searchsorted(np.asarray(breaks, dtype=np.float64), x, side="right")
        return tuple(np.asarray(column)[k] for column in zip(*pieces, strict=True))

    @staticmethod
    def where(cond, if_true, if_false):
        if np.ndim(cond) == 0:  # one flag for the whole block: no per-row pass
            return if_true if cond else if_false
        return np.where(cond, if_true, if_false)

    @staticmethod
    def any(x) -> bool:
        return bool(np.any(x))

    expm1 = staticmethod(np.expm1)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def pick(index, table: tuple):
        return np.asarray(table)[index]


ARRAY = ArrayOps()


class Columns(NamedTuple):
    """One block of requests as the model reads them: float64 arrays (or one scalar where
    the whole grid shares a value)."""

    rows: object  # b * h query rows
    chunk: object
    s_q: object  # query bytes
    s_o: object  # answer bytes
    s_kv: object  # KV bytes of the chunk
    probe: object  # the probe's bytes where a request pays it, NaN where not; None: none does
    reuse: object
    segments: object
    fetch_cost: object  # NaN: the device's T_move
    blocks_local: object
    heads: object
    payload: object
    ret: object
    step: Step  # layers, holders, pipelined


def _subset_columns(cols: Columns, index) -> Columns:
    return Columns(
        *(_subset(c, index) for c in cols[:-1]), Step(*(_subset(x, index) for x in cols.step))
    )


def _device(terms, cols: Columns) -> DeviceSide:
    """:func:`device_side` over a block."""
    return device_side(
        ARRAY, terms, cols.rows, cols.chunk, cols.reuse, cols.segments, cols.fetch_cost,
        cols.blocks_local, cols.step.holders,
    )  # fmt: skip


def _options(f, end: int, dev, cols: Columns) -> tuple:
    """(route, fetch) arrays on fabric ``f`` at one end of the coefficients."""
    return option_times(
        ARRAY, f.breaks, f.terms(end), dev, cols.s_q, cols.s_o, cols.s_kv, cols.segments,
        cols.probe, cols.step,
    )  # fmt: skip


def _workers(threads: int | None) -> int:
    if threads is not None:
        return max(1, threads)
    return min(MAX_THREADS, len(os.sched_getaffinity(0)))


@lru_cache(maxsize=4)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xbench-grid")


def decide_grid(profile: Profile, grid, *, threads: int | None = None) -> pd.DataFrame:
    """Evaluate the predicate for every request of ``grid``; one output row per request.

    ``threads``: how many blocks of requests to evaluate at once (default: the CPUs this
    process may use, at most 8; 1 keeps the caller's thread only). Grids of one block
    (65,536 requests) always run on the caller's thread.
    """
    if not isinstance(grid, pd.DataFrame):
        grid = expand(grid)
    unknown = set(grid.columns) - set(REQUEST_DEFAULTS)
    if unknown:
        raise ValueError(
            f"unknown request fields {sorted(unknown)}; use {sorted(REQUEST_DEFAULTS)}"
        )
    n = len(grid)
    raw = _raw_columns(grid)
    names = [f.name for f in profile.fabrics]
    codes = _fabric_codes(grid, profile, names)
    results = {
        "choice": np.empty(n, np.int8),
        "fabric": np.empty(n, np.int16),
        "route": np.empty(n),
        "fetch": np.empty(n),
        "local": np.empty(n),
        "margin": np.empty(n),
        "uncertain": np.empty(n, bool),
        "ranked": np.empty(n, np.int8),
        "prior": np.empty(n, bool),
        "b_star": np.empty(n),
        "u_star": np.empty(n),
        "payload_star": np.empty(n),
        "fetch_cost_star": np.empty(n),
        "n_half": np.empty(n),
    }

    # Blocks small enough that every intermediate stays in cache: numpy is memory-bound
    # otherwise. numpy releases the GIL inside its loops, so blocks run on several threads.
    def run_block(start: int) -> None:
        stop = min(n, start + BLOCK)
        block = _derive({k: (v[start:stop] if np.ndim(v) else v) for k, v in raw.items()})
        part = _decide_block(
            profile, block, None if codes is None else codes[start:stop], stop - start
        )
        for key, value in part.items():
            results[key][start:stop] = value

    starts = range(0, n, BLOCK)
    workers = min(_workers(threads), len(starts))
    if workers <= 1:
        for start in starts:
            run_block(start)
    else:
        list(_pool(workers).map(run_block, starts))
    return pd.concat([grid, _decisions(results, names, grid.index)], axis=1)


# The request fields a grid's columns hold, in the order _derive reads them
RAW_FIELDS = (
    "rows",
    "heads",
    "chunk_tokens",
    "payload_bytes",
    "return_bytes",
    "kv_bytes_per_token",
    "include_probe",
    "probe_bytes",
    "reuse",
    "segments",
    "fetch_cost",
    "blocks_local",
    "layers",
    "holders",
    "pipeline_layers",
)


def _raw_columns(grid: pd.DataFrame) -> dict:
    """Each request field: the grid's column, or its default (a scalar) where it has none."""
    return {
        name: (
            grid[name].to_numpy()
            if name in grid.columns
            else _column(grid, name, bool if name in _FLAGS else np.float64)
        )
        for name in RAW_FIELDS
    }


def _fabric_codes(grid: pd.DataFrame, profile: Profile, names: list):
    """Per request, the index of the fabric it asks for (-1: any); None without a column."""
    if "fabric" not in grid.columns:
        return None
    codes = pd.Categorical(grid["fabric"], categories=names).codes  # -1: any fabric
    bad = grid["fabric"].notna().to_numpy() & (codes < 0)
    if bad.any():
        raise KeyError(
            f"profile {profile.name} has no fabric {grid['fabric'][bad].iloc[0]!r}; it has {', '.join(names)}"
        )
    return codes


def _decisions(results: dict, names: list, index) -> pd.DataFrame:
    """The decisions' columns, as decide_grid returns them beside the requests."""
    return pd.DataFrame(
        {
            "decision": pd.Categorical.from_codes(results["choice"], dtype=CHOICES),
            "fabric_chosen": pd.Categorical.from_codes(results["fabric"], categories=names),
            "t_route": results["route"],
            "t_fetch": results["fetch"],
            "t_local": results["local"],
            "margin": results["margin"],
            "uncertain": results["uncertain"],
            "ranked_by": pd.Categorical.from_codes(results["ranked"], dtype=RANKS),
            "prior": results["prior"],
            "b_star": results["b_star"],
            "u_star": results["u_star"],
            "payload_star": results["payload_star"],
            "fetch_cost_star": results["fetch_cost_star"],
            "n_half_bytes": results["n_half"],
        },
        index=index,
        copy=False,
    )


def _derive(raw: dict) -> Columns:
    """The per-request quantities the model reads, in float64, for one block of requests."""
    f = {
        k: (
            v.astype(np.float64, copy=False)
            if np.ndim(v) and k not in (*_FLAGS, "fetch_cost")
            else v
        )
        for k, v in raw.items()
    }
    rows = f["rows"] * f["heads"]
    chunk = f["chunk_tokens"]
    fetch_cost = (
        raw["fetch_cost"].astype(np.float64) if np.ndim(raw["fetch_cost"]) else raw["fetch_cost"]
    )
    return Columns(
        rows,
        chunk,
        rows * f["payload_bytes"],
        rows * f["return_bytes"],
        chunk * f["kv_bytes_per_token"],
        # the probe's bytes where a request pays the probe round trip, NaN where not
        np.where(raw["include_probe"], f["probe_bytes"], np.nan)
        if np.any(raw["include_probe"])
        else None,
        f["reuse"],
        f["segments"],
        fetch_cost,
        _flag(raw["blocks_local"]),
        f["heads"],
        f["payload_bytes"],
        f["return_bytes"],
        Step(f["layers"], f["holders"], _flag(raw["pipeline_layers"])),
    )


def _flag(values):
    return values.astype(bool) if np.ndim(values) else bool(values)


def _closed_forms(profile: Profile, cols, dev, best_f, n: int) -> list:
    """b*, u*, P* and F* of each request on the fabric chosen for it."""
    out = [np.empty(n) for _ in range(4)]
    s_q, s_o, s_kv, nseg = cols.s_q, cols.s_o, cols.s_kv, cols.segments
    heads, payload, ret = cols.heads, cols.payload, cols.ret
    for k, f in enumerate(profile.fabrics):
        mine = best_f == k
        if not mine.any():
            continue
        forms = closed_forms(
            ARRAY, f.breaks, f.terms(VALUE), heads, payload, ret, s_q, s_o, s_kv, nseg, dev,
            cols.step,
        )  # fmt: skip
        for column, form in zip(out, forms, strict=True):
            column[mine] = np.broadcast_to(form, (n,))[mine]
    return out


def _fabric_times(profile: Profile, cols, codes, dev_val, n: int):
    """Each fabric's route and fetch times (inf where a row asks for another fabric), and
    the fabrics some row may take: (route per fabric, fetch per fabric, [(k, rows)])."""
    nf = len(profile.fabrics)
    route_f, fetch_f, active = np.empty((nf, n)), np.empty((nf, n)), []
    for k, f in enumerate(profile.fabrics):
        rows_k = None if codes is None else (codes == k) | (codes < 0)
        if rows_k is None or rows_k.all():
            route_f[k], fetch_f[k] = _options(f, VALUE, dev_val, cols)
        elif not rows_k.any():
            continue
        else:
            idx = np.flatnonzero(rows_k)
            r, fe = _options(
                f,
                VALUE,
                DeviceSide(*(_subset(d, idx) for d in dev_val)),
                _subset_columns(cols, idx),
            )
            route_f[k], fetch_f[k] = np.inf, np.inf
            route_f[k, idx], fetch_f[k, idx] = r, fe
        active.append((k, rows_k))
    return route_f, fetch_f, active


def _best_fabric(route_f, fetch_f, local, active, n: int):
    """The fabric whose best option is fastest, the first among equals as decide() takes
    it: (its index per row, route there, fetch there). (Masked writes with putmask: argmin
    along the fabric axis is ten times slower.)"""
    first = active[0][0]
    best_f = np.full(n, first, dtype=np.intp)
    if len(active) == 1:
        return best_f, route_f[first], fetch_f[first]
    best_t = np.full(n, np.inf)
    for k, t_k in _best_times(route_f, fetch_f, local, active):
        np.putmask(best_f, t_k < best_t, k)
        np.minimum(best_t, t_k, out=best_t)
    flat = best_f * n + np.arange(n)
    return best_f, route_f.ravel()[flat], fetch_f.ravel()[flat]


def _best_times(route_f, fetch_f, local, active):
    """(fabric, its best option's time per row, inf where the row may not take it)."""
    for k, rows_k in active:
        t_k = np.minimum(np.minimum(route_f[k], fetch_f[k]), local)
        if rows_k is not None and not rows_k.all():
            t_k[~rows_k] = np.inf  # local is open to every row, this fabric is not
        yield k, t_k


def _runner_up(profile: Profile, route_f, fetch_f, local, active, best_f, n: int):
    """Per row, the undominated fabric next to the one chosen (the first among equals), as
    decide() ranks them; -1 where no other competed."""
    kept = {i for i, f in enumerate(profile.fabrics) if f in profile.candidates}
    runner_f, second_t = np.full(n, -1, dtype=np.intp), np.full(n, np.inf)
    for k, t_k in _best_times(route_f, fetch_f, local, [a for a in active if a[0] in kept]):
        better = (t_k < second_t) & (best_f != k)
        np.putmask(runner_f, better, k)
        np.putmask(second_t, better, t_k)
    return runner_f


def _separating(profile: Profile, cols, choice, best_f, runner_f, n: int):
    """:func:`separating_term` per row, as codes of SEPARATING."""
    own = [[np.zeros(n) for _ in range(3)] for _ in range(2)]
    other = [[np.zeros(n) for _ in range(3)] for _ in range(2)]
    for k, f in enumerate(profile.fabrics):
        mine, theirs = best_f == k, runner_f == k
        if not (mine.any() or theirs.any()):
            continue
        parts = wire_parts(
            ARRAY, f.breaks, f.terms(VALUE), cols.s_q, cols.s_o, cols.s_kv, cols.segments,
            cols.step,
        )  # fmt: skip
        for option in range(2):
            for term in range(3):
                value = np.broadcast_to(parts[option][term], (n,))
                own[option][term][mine] = value[mine]
                other[option][term][theirs] = value[theirs]
    codes = separating_term(ARRAY, choice, own, other, runner_f >= 0, labels=(0, 1, 2, 3))
    return np.asarray(codes, dtype=np.int8)


def _priors(profile: Profile, cols, best_f, choice, second, n: int):
    """Whether each decision rests on a prior: the fabric's, or one that enters the
    winner's or the runner-up's time on the device side (:func:`prior_flag`)."""
    prior = np.array([f.prior for f in profile.fabrics])[best_f]
    if prior.all():
        return prior
    given = cols.fetch_cost
    fixed = ~np.isnan(given) if np.ndim(given) else np.full(n, not np.isnan(given))
    return prior_flag(ARRAY, prior, profile.device.prior_by_option, choice, second, fixed)


def _uncertain(profile: Profile, cols, best_f, choice, times, n: int):
    """Whether the coefficients' intervals allow another answer: the cheap bound from
    their relative spreads first, the exact interval evaluation only where it cannot
    decide (and wherever a fetch's time has a saving subtracted)."""
    route, fetch, local, winner, runner = times
    dev, fabrics = profile.device, profile.fabrics
    is_route, is_fetch = choice == 0, choice == 1
    slow = np.array([profile.spread(f.name)[0] for f in fabrics])[best_f]
    fast = np.array([profile.spread(f.name)[1] for f in fabrics])[best_f]
    check = ~(winner * slow < runner * fast)
    if dev.saves_on_splice:  # fetch's time has a term subtracted: the bound does not hold
        # (fetch the winner or, as decide() ranks the runner-up, the second)
        check |= is_fetch | np.where(is_route, fetch <= local, (choice == 2) & (fetch < route))
    uncertain = np.zeros(n, dtype=bool)
    for k, f in enumerate(fabrics):
        mine = check & (best_f == k) if len(fabrics) > 1 else check
        count = int(np.count_nonzero(mine))
        if not count:
            continue
        if count > n // 3:  # most rows: whole arrays beat gathering a subset
            sub, ch, index = cols, choice, None
        else:
            index = np.flatnonzero(mine)
            sub, ch = _subset_columns(cols, index), choice[index]
        dev_hi, dev_lo = _device(dev.terms(HIGH), sub), _device(dev.terms(LOW), sub)
        hi = (*_options(f, HIGH, dev_hi, sub), local_time(dev_hi, sub.step.layers))
        lo = (*_options(f, LOW, dev_lo, sub), local_time(dev_lo, sub.step.layers))
        verdict = interval_reaches(ARRAY, ch, hi, lo)
        if index is None:
            uncertain = np.where(mine, verdict, uncertain)
        else:
            uncertain[index] = verdict
    return uncertain


def _decide_block(profile: Profile, cols, codes, n: int) -> dict:
    dev_val = _device(profile.device.terms(VALUE), cols)
    local = _full(local_time(dev_val, cols.step.layers), n)
    route_f, fetch_f, active = _fabric_times(profile, cols, codes, dev_val, n)
    best_f, route, fetch = _best_fabric(route_f, fetch_f, local, active, n)
    runner_f = _runner_up(profile, route_f, fetch_f, local, active, best_f, n)
    choice, winner, second, runner = choose(ARRAY, route, fetch, local)
    choice = choice.astype(np.int8)
    n_half = np.array([f.half_performance_bytes() for f in profile.fabrics])[best_f]
    b_star, u_star, payload_star, fetch_cost_star = _closed_forms(profile, cols, dev_val, best_f, n)
    times = (route, fetch, local, winner, runner)
    return {
        "b_star": b_star,
        "u_star": u_star,
        "payload_star": payload_star,
        "fetch_cost_star": fetch_cost_star,
        "n_half": n_half,
        "choice": choice,
        "fabric": best_f.astype(np.int16),
        "route": route,
        "fetch": fetch,
        "local": local,
        "margin": runner - winner,
        "uncertain": _uncertain(profile, cols, best_f, choice, times, n),
        "ranked": _separating(profile, cols, choice, best_f, runner_f, n),
        "prior": _priors(profile, cols, best_f, choice, second, n),
    }
