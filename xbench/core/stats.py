"""Summaries of repeated samples: medians with distribution-free confidence intervals.

Timing samples are skewed (a long right tail from interrupts and preemption), so the
centre is the median and its interval comes from order statistics (the binomial method
asv uses), not from a normal approximation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the binomial CDF from scipy.special, not scipy.stats.binom: the same function without
# scipy.stats' import, several times scipy.special's, which every probe and kernel summary
# would wait for
from scipy.special import bdtr


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    ci_low: float
    ci_high: float
    p01: float
    p99: float
    mean: float
    stdev: float
    minimum: float
    maximum: float
    confidence: float  # coverage actually achieved by [ci_low, ci_high]


def median_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Order-statistic interval for the median: (low, high, achieved coverage).

    Picks the narrowest symmetric pair of order statistics x_(k), x_(n-k+1) whose
    coverage 1 - 2 P(Binom(n, 1/2) <= k-1) is at least ``confidence``. With too few
    samples no pair reaches it; then the range is returned with its lower coverage.
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        raise ValueError("no samples")
    if n == 1:
        return float(x[0]), float(x[0]), 0.0
    alpha = 1.0 - confidence
    best_k, coverage = 1, 1.0 - 2.0 * 0.5**n
    for k in range(1, n // 2 + 1):
        cov = 1.0 - 2.0 * float(bdtr(k - 1, n, 0.5))  # 1 - 2 P(Binom(n, 1/2) <= k-1)
        if cov >= 1.0 - alpha - 1e-12:
            best_k, coverage = k, cov
        else:
            break
    return float(x[best_k - 1]), float(x[n - best_k]), float(coverage)


def summarize(values, confidence: float = 0.95) -> Summary:
    """Median, its interval, tails and spread of one case's samples."""
    x = np.asarray(values, dtype=float)
    lo, hi, cov = median_ci(x, confidence)
    return Summary(
        n=len(x),
        median=float(np.median(x)),
        ci_low=lo,
        ci_high=hi,
        p01=float(np.percentile(x, 1)),
        p99=float(np.percentile(x, 99)),
        mean=float(np.mean(x)),
        stdev=float(np.std(x, ddof=1)) if len(x) > 1 else 0.0,
        minimum=float(np.min(x)),
        maximum=float(np.max(x)),
        confidence=cov,
    )
