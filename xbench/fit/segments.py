"""Piecewise ``t(n) = a + g * n`` fits with breakpoints where the protocol changes.

Breakpoints (MPICH's eager-to-rendezvous switch near 8 KiB, NCCL's protocol changes) are
found by exhaustive search over the gaps between measured sizes, scoring each candidate
segmentation by BIC on relative residuals of the per-size medians: a new segment must pay
for its parameters. Each segment is then fitted to every sample with a robust loss
(scipy's least_squares, soft-L1, on relative residuals), and its coefficients get 95 %
percentile intervals from a bootstrap that resamples the samples within each size.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, nnls

from xbench.fit.linear import fit_linear

MIN_SIZES_PER_SEGMENT = 3
MAX_SEGMENTS = 4


@dataclass(frozen=True)
class LinearFit:
    """t = a + g * n on sizes [lo, hi], with bootstrap intervals."""

    lo: float
    hi: float
    a: float
    g: float
    a_ci: tuple[float, float]
    g_ci: tuple[float, float]


def _nnls_relative(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Non-negative (a, g) minimising sum(((a + g n) - t) / t)^2."""
    design = np.column_stack([1.0 / t, n / t])
    (a, g), _ = nnls(design, np.ones_like(t))
    return float(a), float(g)


def _bic(groups, n_points: int) -> float:
    rss = 0.0
    for n, t in groups:
        a, g = _nnls_relative(n, t)
        rss += float(np.sum(((a + g * n) - t) ** 2 / t**2))
    k = 3 * len(groups) - 1  # a, g per segment plus the breakpoints
    return n_points * np.log(max(rss / n_points, 1e-30)) + k * np.log(n_points)


def find_breaks(sizes: np.ndarray, medians: np.ndarray) -> list[int]:
    """Indices into ``sizes`` where new segments start (BIC-optimal, exhaustive)."""
    m = len(sizes)
    best, best_breaks = _bic([(sizes, medians)], m), []
    gaps = range(MIN_SIZES_PER_SEGMENT, m - MIN_SIZES_PER_SEGMENT + 1)
    for count in range(1, MAX_SEGMENTS):
        for breaks in itertools.combinations(gaps, count):
            edges = [0, *breaks, m]
            if any(edges[i + 1] - edges[i] < MIN_SIZES_PER_SEGMENT for i in range(len(edges) - 1)):
                continue
            groups = [
                (sizes[edges[i] : edges[i + 1]], medians[edges[i] : edges[i + 1]])
                for i in range(len(edges) - 1)
            ]
            score = _bic(groups, m)
            if score < best - 2.0:  # a clearly better model, not a coin toss
                best, best_breaks = score, list(breaks)
    return best_breaks


def _robust(n: np.ndarray, t: np.ndarray, start: tuple[float, float]) -> tuple[float, float]:
    scale = max(float(np.median(t)), 1e-12)
    x0 = np.array([max(start[0], 1e-12) / scale, max(start[1], 1e-18) / scale])

    def resid(p):
        return (p[0] * scale + p[1] * scale * n - t) / t

    sol = least_squares(
        resid, x0, loss="soft_l1", f_scale=0.05, bounds=([0.0, 0.0], [np.inf, np.inf])
    )
    return float(sol.x[0] * scale), float(sol.x[1] * scale)


def fit_piecewise(
    n: np.ndarray, t: np.ndarray, *, boot: int = 200, seed: int = 0
) -> list[LinearFit]:
    """Segments over samples (n bytes, t seconds)."""
    n, t = np.asarray(n, float), np.asarray(t, float)
    sizes = np.unique(n)
    medians = np.array([np.median(t[n == s]) for s in sizes])
    if len(sizes) >= 2 * MIN_SIZES_PER_SEGMENT:
        breaks = find_breaks(sizes, medians)
    else:
        breaks = []
    edges = [0, *breaks, len(sizes)]
    rng = np.random.default_rng(seed)
    fits = []
    for i in range(len(edges) - 1):
        seg_sizes = sizes[edges[i] : edges[i + 1]]
        mask = np.isin(n, seg_sizes)
        sn, st = n[mask], t[mask]
        a, g = _robust(sn, st, _nnls_relative(seg_sizes, medians[edges[i] : edges[i + 1]]))
        by_size = [st[sn == s] for s in seg_sizes]
        draws = []
        for _ in range(boot):
            meds = np.array([np.median(rng.choice(v, len(v))) for v in by_size])
            draws.append(_nnls_relative(seg_sizes, meds))
        draws = np.array(draws).reshape(-1, 2) if draws else np.array([[a, g]])
        a_ci = (float(np.percentile(draws[:, 0], 2.5)), float(np.percentile(draws[:, 0], 97.5)))
        g_ci = (float(np.percentile(draws[:, 1], 2.5)), float(np.percentile(draws[:, 1], 97.5)))
        fits.append(
            LinearFit(
                float(seg_sizes[0]),
                float(seg_sizes[-1]),
                a,
                g,
                (min(a_ci[0], a), max(a_ci[1], a)),
                (min(g_ci[0], g), max(g_ci[1], g)),
            )
        )
    return fits


def predict(fits: list[LinearFit], n) -> np.ndarray:
    """Evaluate segments; a size between two segments takes the segment it is nearer (geometrically)."""
    n = np.atleast_1d(np.asarray(n, float))
    starts = np.array([segment_start(fits, i) for i in range(len(fits))])
    k = np.searchsorted(starts[1:], n, side="right")
    a = np.array([f.a for f in fits])[k]
    g = np.array([f.g for f in fits])[k]
    return a + g * n


def segment_start(fits: list[LinearFit], i: int) -> float:
    """Where segment i begins: 0 for the first, else the geometric midpoint of the gap."""
    if i == 0:
        return 0.0
    return float(np.sqrt(fits[i - 1].hi * fits[i].lo))


def fit_segmented_linear(
    key, design, t, *, min_keys: int = 2, max_segments: int = 3, boot: int = 200, seed: int = 0
):
    """Piecewise-in-``key`` fit of t = design @ x (x >= 0) with breaks between distinct keys.

    Used for device terms whose slope changes where the chunk outgrows a cache. Returns
    [(start_key, [(value, low, high) per design column])]; a piece starts at the
    geometric midpoint of the gap before it (0 for the first).
    """
    key, design, t = np.asarray(key, float), np.asarray(design, float), np.asarray(t, float)
    rows = {}
    for i, row in enumerate(map(tuple, np.column_stack([key, design]))):
        rows.setdefault(row, []).append(t[i])
    group_x = np.array([r[1:] for r in rows])
    group_key = np.array([r[0] for r in rows])
    group_t = np.array([np.median(v) for v in rows.values()])
    keys = np.unique(key)
    cols = design.shape[1]

    def score(edges):
        rss, m = 0.0, len(group_t)
        for lo, hi in zip(edges[:-1], edges[1:], strict=False):
            mask = (group_key >= keys[lo]) & (group_key <= keys[hi - 1])
            w = group_x[mask] / group_t[mask, None]
            x, _ = nnls(w, np.ones(mask.sum()))
            rss += float(np.sum((w @ x - 1.0) ** 2))
        k = cols * (len(edges) - 1) + len(edges) - 2
        return m * np.log(max(rss / m, 1e-30)) + k * np.log(m)

    def feasible(edges):
        for lo, hi in zip(edges[:-1], edges[1:], strict=False):
            mask = (group_key >= keys[lo]) & (group_key <= keys[hi - 1])
            if hi - lo < min_keys or mask.sum() < cols:
                return False
        return True

    best_edges = [0, len(keys)]
    best = score(best_edges)
    for count in range(1, max_segments):
        for breaks in itertools.combinations(range(1, len(keys)), count):
            edges = [0, *breaks, len(keys)]
            if feasible(edges):
                sc = score(edges)
                if sc < best - 2.0:
                    best, best_edges = sc, edges
    pieces = []
    for lo, hi in zip(best_edges[:-1], best_edges[1:], strict=False):
        mask = (key >= keys[lo]) & (key <= keys[hi - 1])
        start = 0.0 if lo == 0 else float(np.sqrt(keys[lo - 1] * keys[lo]))
        pieces.append((start, fit_linear(design[mask], t[mask], boot=boot, seed=seed)))
    return pieces
