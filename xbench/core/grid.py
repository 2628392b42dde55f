"""The predicate over many requests at once (numpy), with the same answers as :func:`decide`.

``decide_grid(profile, grid)`` takes a DataFrame with one request per row (columns named as
:class:`~xbench.core.costmodel.Request` fields; missing ones take the Request defaults),
or a mapping of field -> list of values whose cartesian product is the grid. It returns
the grid with the decision columns appended.

It runs the same formula as :func:`decide` (``costmodel.decision_formula``), traced for
numpy blocks (:mod:`xbench.core.tracing`): once per profile, fabric asked for, and set of
columns the grid has (a field it lacks is a constant, folded in), then block by block; for
a grid of NATIVE_ROWS requests or more, the same traced lines run as C, row by row with the
GIL released (:mod:`xbench.core.native_code`), with the same answers to the bit.
"""

from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from xbench.core import native_code
from xbench.core.costmodel import (
    FETCH,
    LOCAL,
    ROUTE,
    SEPARATING,
    Profile,
    Request,
    _Shape,
    decision_formula,
)
from xbench.core.tracing import Tracer, TracingOps

REQUEST_DEFAULTS = dict(Request._field_defaults)
CHOICES = pd.CategoricalDtype([ROUTE, FETCH, LOCAL])
RANKS = pd.CategoricalDtype(list(SEPARATING))
# Blocks small enough that every intermediate stays in cache: numpy is memory-bound
# otherwise. numpy releases the GIL inside its loops, so blocks run on several threads.
BLOCK = 1 << 16
MAX_THREADS = 8
FLAGS = ("include_probe", "blocks_local", "pipeline_layers")
# What the compiled block returns, in decision_formula's order (codes where it names)
OUTPUTS = (
    "choice", "fabric", "route", "fetch", "local", "margin", "uncertain", "ranked", "prior",
    "b_star", "u_star", "payload_star", "fetch_cost_star", "n_half",
)  # fmt: skip
_DTYPES = {
    "choice": np.int8,
    "fabric": np.int16,
    "ranked": np.int8,
    "uncertain": bool,
    "prior": bool,
}


def expand(axes: dict) -> pd.DataFrame:
    """Cartesian product of the given request fields."""
    names = list(axes)
    return pd.DataFrame(list(itertools.product(*(axes[n] for n in names))), columns=names)


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
    always run on the caller's thread.
    """
    if not isinstance(grid, pd.DataFrame):
        grid = expand(grid)
    unknown = set(grid.columns) - set(REQUEST_DEFAULTS)
    if unknown:
        raise ValueError(
            f"unknown request fields {sorted(unknown)}; use {sorted(REQUEST_DEFAULTS)}"
        )
    n = len(grid)
    columns = _columns(grid)
    names = [f.name for f in profile.fabrics]
    results = {key: np.empty(n, _DTYPES.get(key, np.float64)) for key in OUTPUTS}
    tasks = []
    for fabric, rows in _by_fabric(grid, profile, names):
        compiled = _compiled(profile, fabric, tuple(columns), n if rows is None else len(rows))
        starts = range(0, n if rows is None else len(rows), BLOCK)
        tasks += [(compiled, rows, start) for start in starts]

    def run(task) -> None:
        compiled, rows, start = task
        if rows is None:  # the block's rows are a slice: the answers go straight in
            where = slice(start, min(n, start + BLOCK))
            out = tuple(results[key][where] for key in OUTPUTS)
        else:
            where = rows[start : start + BLOCK]
            out = tuple(np.empty(len(where), results[key].dtype) for key in OUTPUTS)
        block = tuple(column[where] for column in columns.values())
        with np.errstate(all="ignore"):  # inf and NaN are answers here (no recompute cost)
            answer = compiled(block, out)
        for key, value, written in zip(OUTPUTS, answer, out, strict=True):
            if value is not None:  # a constant, or an input passed through
                results[key][where] = value
            elif rows is not None:
                results[key][where] = written

    workers = min(_workers(threads), len(tasks))
    if workers <= 1:
        for task in tasks:
            run(task)
    else:
        list(_pool(workers).map(run, tasks))
    return pd.concat([grid, _decisions(results, names, grid.index)], axis=1)


# A column that holds only this value everywhere is left out: the default it equals is
# folded in, and the terms it would switch on drop out (no fetch cost given, no probe, ...)
_INERT = {
    "fetch_cost": math.nan, "include_probe": False, "blocks_local": False,
    "pipeline_layers": False, "segments": 1, "layers": 1, "holders": 1,
}  # fmt: skip


def _columns(grid: pd.DataFrame) -> dict:
    """The request fields the grid has, as arrays the model reads (float64; flags bool)."""
    columns = {}
    for name in REQUEST_DEFAULTS:
        if name not in grid.columns or name == "fabric":
            continue
        values = grid[name].to_numpy().astype(bool if name in FLAGS else np.float64)
        inert = _INERT.get(name, None)
        if inert is not None and _all_equal(values, inert):
            continue
        columns[name] = values
    return columns


def _all_equal(values: np.ndarray, value) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return bool(np.isnan(values).all())
    return bool((values == value).all())


def _by_fabric(grid: pd.DataFrame, profile: Profile, names: list):
    """(fabric asked for or None, its rows or None for all) for each group of requests."""
    if "fabric" not in grid.columns:
        yield None, None
        return
    codes = pd.Categorical(grid["fabric"], categories=names).codes  # -1: any fabric
    bad = grid["fabric"].notna().to_numpy() & (codes < 0)
    if bad.any():
        raise KeyError(
            f"profile {profile.name} has no fabric {grid['fabric'][bad].iloc[0]!r}; it has {', '.join(names)}"
        )
    if len(codes) and (codes == codes[0]).all():  # one group (no sort, no index)
        yield (None if codes[0] < 0 else names[codes[0]]), None
        return
    for code in np.unique(codes):
        yield (None if code < 0 else names[code]), np.flatnonzero(codes == code)


# A grid this large is worth a C build of its shape (once; then cached on disk)
NATIVE_ROWS = 100_000


@dataclass
class _BlockForms:
    """decision_formula traced for numpy blocks of one shape: the numpy form, and its C
    form once a grid was large enough (``native_code.mode``; False: it has none)."""

    tracer: Tracer
    answer: tuple
    numpy: object
    native: object = None


def _compiled(profile: Profile, fabric: str | None, present: tuple, rows: int):
    """decision_formula for numpy blocks of the columns ``present`` (a field absent takes
    the Request default, folded in), in C for a grid of ``rows`` >= NATIVE_ROWS; kept on
    the profile."""
    key = ("grid", fabric, present)
    forms = profile._decide.get(key)
    if forms is None:
        forms = profile._decide[key] = _traced(profile, fabric, present)
    wanted = native_code.mode()
    if forms.native is None and (wanted == "native" or (wanted == "auto" and rows >= NATIVE_ROWS)):
        dtypes = tuple(np.dtype(_DTYPES.get(name, np.float64)).name for name in OUTPUTS)
        built = native_code.build_block(forms.tracer, present, forms.answer, dtypes, forms.numpy)
        forms.native = built or False
    return forms.native or forms.numpy


def _traced(profile: Profile, fabric: str | None, present: tuple) -> _BlockForms:
    shape = _Shape(
        fabric,
        None if "fetch_cost" in present else False,
        None if "include_probe" in present else False,
        None if "blocks_local" in present else False,
        "segments" not in present,
        "layers" not in present,
        "holders" not in present,
        None if "pipeline_layers" in present else False,
        codes=True,
    )
    tracer = Tracer(array=True)

    def read(name: str):
        if name in present:
            return tracer.input(name, "b" if name in FLAGS else "f")
        default = REQUEST_DEFAULTS[name]
        return np.nan if default is None else default

    answer = decision_formula(TracingOps(tracer), profile, shape, read)
    numpy_form = tracer.compile("decide_block", present, answer)
    return _BlockForms(tracer, answer, numpy_form)


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
