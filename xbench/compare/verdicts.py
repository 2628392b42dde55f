"""Case-by-case verdicts between two runs: faster, slower, unchanged, inconclusive, missing
or not comparable.

A case is slower (or faster) only when it passes two gates:

1. a significance test on the samples, corrected for the number of cases compared
   (Benjamini-Hochberg: a nightly sweep compares tens of cases, and uncorrected tests at
   5 % would flag one of every twenty by chance);
2. a median ratio beyond ``threshold`` (5 % by default) in that direction.

A case is unchanged only when the data say so: its ratio's interval lies inside
``1 +- threshold`` (on the log scale, an equivalence statement). A ratio near 1 whose interval
reaches past the threshold is inconclusive: the runs could not tell. A case of the baseline
that the candidate lacks is missing (a gate fails on it); one only the candidate has is not
comparable.

The test respects how the runs were made. Where each run holds at least ``MIN_LAUNCHES``
process launches (``--runs``), the unit of replication is the launch: Welch's t-test on the
log of each launch's median, because on a shared machine a launch's placement moves all of
its samples together by 10-30 %, and a test that counted one launch's samples as
independent would cry wolf. With fewer launches the test falls back to Mann-Whitney on the
samples (pyperf's situation with one process), and the result says so (``test`` column).
The ratio's interval is a percentile bootstrap over the same units.

Each case tested by launch also says how small a change its test could have caught
(``detectable``: 80 % power at the FDR level, as if it were the only case compared) from
its launch-to-launch spread (``launch_sd``): a case called unchanged with a detectable change
of 20 % says little about a 10 % regression, and :func:`launches_for` gives the launches a
side that would detect a change of the threshold at that spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

VERDICTS = ("slower", "faster", "unchanged", "inconclusive", "missing", "not comparable")
MIN_LAUNCHES = 3
POWER = 0.8  # the chance of catching a change of the detectable size (the usual design figure)


@dataclass(frozen=True)
class Gates:
    threshold: float = 0.05  # a ratio within 1 +- threshold is unchanged
    alpha: float = 0.05  # false discovery rate over the cases compared
    confidence: float = 0.95  # the ratio interval's coverage
    boot: int = 2000
    seed: int = 0
    min_launches: int = MIN_LAUNCHES  # launches each side needs for the launch-level test


def higher_is_better(unit: str) -> bool:
    """Rates (MB/s, GB/s, FLOP/s) improve upwards; times downwards."""
    return "/s" in str(unit)


def _units(group: pd.DataFrame, by_launch: bool) -> np.ndarray:
    if by_launch:
        return group.groupby("launch").value.median().to_numpy(float)
    return group.value.to_numpy(float)


def _p_value(base: np.ndarray, cand: np.ndarray, by_launch: bool) -> float:
    from scipy import stats

    lb, lc = np.log(base), np.log(cand)
    if by_launch:
        if np.ptp(lb) == 0 and np.ptp(lc) == 0:  # no spread at all: equal or certainly not
            return 1.0 if lb[0] == lc[0] else 0.0
        return float(stats.ttest_ind(lb, lc, equal_var=False).pvalue)
    if len(lb) < 2 or len(lc) < 2:
        return 1.0
    return float(stats.mannwhitneyu(lb, lc, alternative="two-sided").pvalue)


def _spread(base: np.ndarray, cand: np.ndarray) -> float:
    """Pooled sd of the log launch medians, each side about its own mean."""
    lb, lc = np.log(base), np.log(cand)
    dof = len(lb) + len(lc) - 2
    return float(math.sqrt((((lb - lb.mean()) ** 2).sum() + ((lc - lc.mean()) ** 2).sum()) / dof))


def detectable_change(base: np.ndarray, cand: np.ndarray, gates: Gates) -> float:
    """The smallest ratio change (0.12 for 12 %) Welch's test on these launch medians would
    catch with probability ``POWER`` at level ``gates.alpha``, for a case tested alone
    (the FDR correction over many cases raises it unless many change together)."""
    from scipy import stats

    lb, lc = np.log(base), np.log(cand)
    vb, vc = lb.var(ddof=1) / len(lb), lc.var(ddof=1) / len(lc)
    se = math.sqrt(vb + vc)
    if se == 0:
        return 0.0
    dof = (vb + vc) ** 2 / (vb**2 / (len(lb) - 1) + vc**2 / (len(lc) - 1))
    reach = stats.t.ppf(1 - gates.alpha / 2, dof) + stats.t.ppf(POWER, dof)
    return float(math.expm1(reach * se))


def launches_for(change: float, sd: float, gates: Gates, most: int = 1000) -> int | None:
    """Launches a side for Welch's test to catch a ``change`` (0.05 for 5 %) with
    probability ``POWER`` at level ``gates.alpha``, when launch medians spread ``sd`` (log);
    None if more than ``most``."""
    from scipy import stats

    n = np.arange(2, most + 1)
    reach = stats.t.ppf(1 - gates.alpha / 2, 2 * n - 2) + stats.t.ppf(POWER, 2 * n - 2)
    enough = n[reach * sd * np.sqrt(2 / n) <= math.log1p(change)]
    return int(enough[0]) if len(enough) else None


def _ratio_interval(base, cand, gates: Gates, rng) -> tuple[float, float]:
    """Percentile bootstrap of median(cand) / median(base), resampling each side's units."""
    b = rng.choice(base, (gates.boot, len(base)))
    c = rng.choice(cand, (gates.boot, len(cand)))
    ratios = np.median(c, axis=1) / np.median(b, axis=1)
    tail = (1 - gates.confidence) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def compare_frames(base: pd.DataFrame, cand: pd.DataFrame, gates: Gates = Gates()) -> pd.DataFrame:
    """One row per case of either run. Both frames: measured samples with ``case_key``,
    ``case``, ``launch``, ``value`` and ``unit``."""
    from scipy.stats import false_discovery_control

    rng = np.random.default_rng(gates.seed)
    rows = []
    keys = list(dict.fromkeys([*base.case_key.unique(), *cand.case_key.unique()]))
    b_groups = dict(tuple(base.groupby("case_key", sort=False)))
    c_groups = dict(tuple(cand.groupby("case_key", sort=False)))
    for key in keys:
        b, c = b_groups.get(key), c_groups.get(key)
        first = b if b is not None else c
        row = {
            "case": first.case.iloc[0],
            "case_key": key,
            "unit": first.unit.iloc[0],
            "n_baseline": 0 if b is None else len(b),
            "n_candidate": 0 if c is None else len(c),
            "launches_baseline": 0 if b is None else b.launch.nunique(),
            "launches_candidate": 0 if c is None else c.launch.nunique(),
        }
        if c is None:
            row.update(verdict="missing", reason="in the baseline, not in the candidate")
            rows.append(row)
            continue
        if b is None:
            row.update(verdict="not comparable", reason="only in the candidate")
            rows.append(row)
            continue
        by_launch = min(b.launch.nunique(), c.launch.nunique()) >= gates.min_launches
        ub, uc = _units(b, by_launch), _units(c, by_launch)
        low, high = _ratio_interval(ub, uc, gates, rng)
        row.update(
            baseline=float(np.median(ub)),
            candidate=float(np.median(uc)),
            ratio=float(np.median(uc) / np.median(ub)),
            ratio_low=low,
            ratio_high=high,
            ci_coverage=gates.confidence,
            p_value=_p_value(ub, uc, by_launch),
            launch_sd=_spread(ub, uc) if by_launch else math.nan,
            detectable=detectable_change(ub, uc, gates) if by_launch else math.nan,
            test="welch t on launch medians" if by_launch else "mann-whitney on samples",
            reason="",
        )
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in (
        "baseline",
        "candidate",
        "ratio",
        "ratio_low",
        "ratio_high",
        "p_value",
        "ci_coverage",
        "launch_sd",
        "detectable",
    ):
        if col not in frame:
            frame[col] = math.nan
    for col in ("test", "reason", "verdict"):
        if col not in frame:
            frame[col] = None
    tested = frame.p_value.notna()
    frame["q_value"] = math.nan
    if tested.any():
        frame.loc[tested, "q_value"] = false_discovery_control(
            frame.loc[tested, "p_value"].to_numpy()
        )
    frame.loc[tested, "verdict"] = [
        verdict(r.ratio, r.q_value, r.unit, gates, (r.ratio_low, r.ratio_high))
        for r in frame[tested].itertuples()
    ]
    frame["change"] = [
        _change(r.ratio, r.unit) if r.ratio == r.ratio else math.nan for r in frame.itertuples()
    ]
    return frame


def sensitivity(frame: pd.DataFrame, gates: Gates) -> str | None:
    """One line on what the comparison could have caught, from its cases tested by launch:
    the detectable change over them, and the launches a side that would catch a change of
    the threshold at their median spread. None when no case was tested by launch."""
    tested = frame.dropna(subset=["detectable"])
    if tested.empty:
        return None
    low, mid, high = np.percentile(100 * tested.detectable, [0, 50, 100])
    launches = min(tested.launches_baseline.min(), tested.launches_candidate.min())
    need = launches_for(gates.threshold, float(tested.launch_sd.median()), gates)
    more = f"about {need}" if need else "over 1000"
    return (
        f"smallest change a case could catch ({100 * POWER:.0f} % power, each alone): "
        f"{mid:.0f} % at the median ({low:.0f}-{high:.0f} %) with {launches} launches a side; "
        f"at this launch-to-launch spread, {more} launches a side would catch "
        f"{100 * gates.threshold:g} %"
    )


def _change(ratio: float, unit: str) -> float:
    """How much worse (positive) or better (negative) the candidate is, as a fraction."""
    return (1 / ratio - 1) if higher_is_better(unit) else ratio - 1


def verdict(
    ratio: float, q_value: float, unit: str, gates: Gates, interval: tuple[float, float]
) -> str:
    """Slower or faster past both gates; unchanged when the ratio's interval lies within the
    threshold either way; else inconclusive."""
    bound = math.log1p(gates.threshold)
    if abs(math.log(ratio)) > bound and q_value < gates.alpha:
        return "slower" if _change(ratio, unit) > 0 else "faster"
    if all(abs(math.log(end)) <= bound for end in interval):
        return "unchanged"
    return "inconclusive"
