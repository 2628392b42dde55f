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
from dataclasses import fields
from functools import lru_cache

import numpy as np
import pandas as pd

from xbench.core.costmodel import FETCH, LOCAL, ROUTE, Profile, Request

REQUEST_DEFAULTS = {f.name: f.default for f in fields(Request)}
CHOICES = pd.CategoricalDtype([ROUTE, FETCH, LOCAL])
RANKS = pd.CategoricalDtype(["latency", "bandwidth"])
BLOCK = 1 << 16
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


def _device_terms(end_device, cols) -> tuple:
    """(compute+merge shared by route and fetch, fetch's move cost, local time): fabric-free."""
    cb, cp, m0, m1, mb, mp, rec, sb, sp = end_device
    rows, chunk, _, _, _, _, reuse, nseg, fcost, local_mask = cols

    def piece(breaks, pieces):
        if not breaks:
            return pieces[0]
        k = np.searchsorted(np.asarray(breaks), chunk, side="right")
        return tuple(np.asarray(col)[k] for col in zip(*pieces, strict=True))

    c0, c1, c2 = piece(cb, cp)
    g0, g1 = piece(mb, mp)
    t_c = c0 + chunk * (c1 + rows * c2)
    t_cm = t_c + (m0 + rows * (2 * m1))
    move = g0 + chunk * g1
    if sp is not mp and np.any(nseg != 1):  # one message per block: splice, no gather
        s0, s1 = piece(sb, sp)
        move = np.where(nseg != 1, s0 + chunk * s1, move)
    if not np.all(np.isnan(fcost)):
        move = np.where(np.isnan(fcost), move, fcost)
    local = chunk * rec + t_c if np.isfinite(rec) else np.float64(np.inf)
    if np.any(local_mask):
        local = np.where(local_mask, t_c, local)
    return t_cm, move, local


def _options(f, end_fabric, dev_terms, cols) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """route, fetch, local arrays on fabric f at one end of the coefficients."""
    o, segs = end_fabric
    t_cm, _, local = dev_terms[:3]
    _, _, s_q, s_o, s_kv, probe, _, nseg, _, _ = cols
    alphas = np.array([a for a, _ in segs])
    inv_betas = np.array([ib for _, ib in segs])
    breaks = np.asarray(f._breaks, dtype=np.float64)

    def wire(n):
        if len(segs) == 1:
            return n * inv_betas[0] + alphas[0]
        k = np.searchsorted(breaks, n, side="right")
        return alphas[k] + n * inv_betas[k]

    # Fabric-free sums come precomputed (_fabric_free), so each fabric costs few passes.
    fetch_base, inv_uses = dev_terms[3:]
    route = wire(s_q) + (t_cm + 2 * o)
    route += wire(s_o)
    fetch = wire(s_kv) + fetch_base
    fetch += nseg * o
    if np.any(probe >= 0):
        probe_wire = np.where(probe >= 0, 2 * wire(np.maximum(probe, 0)), 0.0)
        route += probe_wire
        fetch += probe_wire
    if inv_uses is not None:
        fetch *= inv_uses
    return route, fetch, local


def _fabric_free(dev_terms, cols) -> tuple:
    """Device terms plus fetch's fabric-free part and 1 / (1 + reuse).

    With reuse r, fetch's time per use is (fetch + r t_cm) / (1 + r): the move is paid once
    and each reuse pays only compute and merge. fetch_base holds t_cm + move + r t_cm.
    """
    t_cm, move, local = dev_terms
    reuse = cols[6]
    fetch_base = t_cm + move
    if np.any(reuse):
        return t_cm, move, local, fetch_base + reuse * t_cm, 1.0 / (1.0 + reuse)
    return t_cm, move, local, fetch_base, None


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
    raw = {
        name: (
            grid[name].to_numpy()
            if name in grid.columns
            else _column(
                grid, name, bool if name in ("include_probe", "blocks_local") else np.float64
            )
        )
        for name in (
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
        )
    }
    names = [f.name for f in profile.fabrics]
    if "fabric" in grid.columns:
        codes = pd.Categorical(grid["fabric"], categories=names).codes  # -1: any fabric
        bad = grid["fabric"].notna().to_numpy() & (codes < 0)
        if bad.any():
            raise KeyError(
                f"profile {profile.name} has no fabric {grid['fabric'][bad].iloc[0]!r}; it has {', '.join(names)}"
            )
    else:
        codes = None
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
    decisions = pd.DataFrame(
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
        },
        index=grid.index,
        copy=False,
    )
    out = pd.concat([grid, decisions], axis=1)
    return out


def _derive(raw: dict) -> tuple:
    """The per-request quantities the model reads, in float64, for one block of requests."""
    f = {
        k: (
            v.astype(np.float64, copy=False)
            if np.ndim(v) and k not in ("include_probe", "blocks_local", "fetch_cost")
            else v
        )
        for k, v in raw.items()
    }
    rows = f["rows"] * f["heads"]
    chunk = f["chunk_tokens"]
    fetch_cost = (
        raw["fetch_cost"].astype(np.float64) if np.ndim(raw["fetch_cost"]) else raw["fetch_cost"]
    )
    return (
        rows,
        chunk,
        rows * f["payload_bytes"],
        rows * f["return_bytes"],
        chunk * f["kv_bytes_per_token"],
        np.where(raw["include_probe"], f["probe_bytes"], -1.0)
        if np.any(raw["include_probe"])
        else np.float64(-1.0),
        f["reuse"],
        f["segments"],
        fetch_cost,
        raw["blocks_local"].astype(bool) if np.ndim(raw["blocks_local"]) else raw["blocks_local"],
    )


def _decide_block(profile: Profile, cols, codes, n: int) -> dict:
    dev = profile.device
    dev_val = _fabric_free(_device_terms(dev._ends[0], cols), cols)
    local = _full(dev_val[2], n)
    nf = len(profile.fabrics)
    # Each fabric's route and fetch times (inf where a row asks for another fabric).
    route_f, fetch_f, active = np.empty((nf, n)), np.empty((nf, n)), []
    for k, f in enumerate(profile.fabrics):
        rows_k = None if codes is None else (codes == k) | (codes < 0)
        if rows_k is None or rows_k.all():
            route_f[k], fetch_f[k], _ = _options(f, f._val, dev_val, cols)
        elif not rows_k.any():
            continue
        else:
            idx = np.flatnonzero(rows_k)
            r, fe, _ = _options(
                f,
                f._val,
                tuple(None if d is None else _subset(d, idx) for d in dev_val),
                tuple(_subset(c, idx) for c in cols),
            )
            route_f[k], fetch_f[k] = np.inf, np.inf
            route_f[k, idx], fetch_f[k, idx] = r, fe
        active.append((k, rows_k))
    # The fabric whose best option is fastest; the first among equals, as decide() does.
    # (Masked writes with putmask: argmin along the fabric axis is ten times slower.)
    first = active[0][0]
    best_f = np.full(n, first, dtype=np.intp)
    if len(active) == 1:
        route, fetch = route_f[first], fetch_f[first]
    else:
        best_t = np.full(n, np.inf)
        for k, rows_k in active:
            t_k = np.minimum(np.minimum(route_f[k], fetch_f[k]), local)
            if rows_k is not None and not rows_k.all():
                t_k[~rows_k] = np.inf  # local is open to every row, this fabric is not
            np.putmask(best_f, t_k < best_t, k)
            np.minimum(best_t, t_k, out=best_t)
        flat = best_f * n + np.arange(n)
        route, fetch = route_f.ravel()[flat], fetch_f.ravel()[flat]
    choice = np.where(
        (route <= fetch) & (route <= local), 0, np.where(fetch <= local, 1, 2)
    ).astype(np.int8)
    is_route, is_fetch = choice == 0, choice == 1
    winner = np.where(is_route, route, np.where(is_fetch, fetch, local))
    runner = np.where(
        is_route,
        np.minimum(fetch, local),
        np.where(is_fetch, np.minimum(route, local), np.minimum(route, fetch)),
    )
    fabrics = profile.fabrics
    n_half = np.array([f._n_half for f in fabrics])[best_f]
    # A prior counts where it is the fabric's, or where it enters the winner's or the
    # runner-up's time on the device side.
    prior = np.array([f._prior for f in fabrics])[best_f]
    if not prior.all():
        flags = np.array(dev._prior_by_option)
        second = np.where(
            is_route,
            np.where(fetch <= local, 1, 2),
            np.where(is_fetch, np.where(route <= local, 0, 2), np.where(route <= fetch, 0, 1)),
        )
        fixed = ~np.isnan(cols[8]) if np.ndim(cols[8]) else np.full(n, not np.isnan(cols[8]))
        move_flag = np.where(fixed, flags[0], flags[1])
        by_choice = np.where(choice == 0, flags[0], np.where(choice == 1, move_flag, flags[2]))
        by_second = np.where(second == 0, flags[0], np.where(second == 1, move_flag, flags[2]))
        prior |= by_choice | by_second
    # Uncertainty: cheap bound first, exact intervals only where the bound cannot decide.
    slow = np.array([profile._bound[f.name][0] for f in fabrics])[best_f]
    fast = np.array([profile._bound[f.name][1] for f in fabrics])[best_f]
    check = ~(winner * slow < runner * fast)
    uncertain = np.zeros(n, dtype=bool)
    for k, f in enumerate(fabrics):
        mine = check & (best_f == k) if nf > 1 else check
        count = int(np.count_nonzero(mine))
        if not count:
            continue
        if count > n // 3:  # most rows: whole arrays beat gathering a subset
            sub, ch, index = cols, choice, None
        else:
            index = np.flatnonzero(mine)
            sub, ch = tuple(_subset(c, index) for c in cols), choice[index]
        hi = _options(f, f._hi, _fabric_free(_device_terms(dev._ends[2], sub), sub), sub)
        lo = _options(f, f._lo, _fabric_free(_device_terms(dev._ends[1], sub), sub), sub)
        r0, f0 = ch == 0, ch == 1
        hi_w = np.where(r0, hi[0], np.where(f0, hi[1], hi[2]))
        lo_r = np.where(
            r0,
            np.minimum(lo[1], lo[2]),
            np.where(f0, np.minimum(lo[0], lo[2]), np.minimum(lo[0], lo[1])),
        )
        verdict = hi_w >= lo_r
        if index is None:
            uncertain = np.where(mine, verdict, uncertain)
        else:
            uncertain[index] = verdict
    size = np.where(is_fetch, cols[4], cols[2])
    return {
        "choice": choice,
        "fabric": best_f.astype(np.int16),
        "route": route,
        "fetch": fetch,
        "local": local,
        "margin": runner - winner,
        "uncertain": uncertain,
        "ranked": (size >= n_half).astype(np.int8),
        "prior": prior,
    }
