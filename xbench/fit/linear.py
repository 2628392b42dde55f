"""Robust non-negative linear fits with bootstrap intervals: the one solver every fit uses."""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares, nnls


def percentile_ci(draws: np.ndarray, value: float) -> tuple[float, float]:
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(min(lo, value)), float(max(hi, value))


def fit_linear(
    design: np.ndarray, t: np.ndarray, boot: int = 200, seed: int = 0
) -> list[tuple[float, float, float]]:
    """Non-negative coefficients of t = design @ x, robust in relative terms, with bootstrap CIs."""
    w = design / t[:, None]
    x0, _ = nnls(w, np.ones_like(t))
    scale = np.where(x0 > 0, x0, np.abs(np.linalg.lstsq(w, np.ones_like(t), rcond=None)[0]) + 1e-30)

    def resid(p):
        return (design @ (p * scale) - t) / t

    sol = least_squares(
        resid, np.where(x0 > 0, 1.0, 0.0), loss="soft_l1", f_scale=0.05, bounds=(0, np.inf)
    )
    x = sol.x * scale
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(boot):
        idx = rng.integers(0, len(t), len(t))
        d, _ = nnls(w[idx], np.ones(len(idx)))
        draws.append(d)
    draws = np.array(draws)
    return [(float(x[j]), *percentile_ci(draws[:, j], float(x[j]))) for j in range(design.shape[1])]
