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
process launches (``--runs``), the unit of replication is the launch: on a shared machine a
launch's placement moves all of its samples together by 10-30 %, and a test that counted one
launch's samples as independent would cry wolf. Launch medians are often skewed or
two-humped (where the ranks land: a quarter of the launches a step slower, a tenth far
slower), and there Welch's t on their logs sees a wide standard deviation and misses a
slowdown every launch shares; so from ``RANK_TEST_LAUNCHES`` launches a side the test is
Mann-Whitney's rank test on the launch medians, which holds its level on any shape and
keeps its power on these. Fewer launches than that give a rank test no p-value small
enough to pass (3 against 3: 0.1 at best), and Welch's t on the log launch medians is used.
With fewer than ``MIN_LAUNCHES`` the test falls back to Mann-Whitney on the samples
(pyperf's situation with one process). The ``test`` column says which ran. The ratio's
interval is a percentile bootstrap over the same units.

Each case tested by launch also says how small a change its test could have caught
(``detectable``: 80 % power at the FDR level, as if it were the only case compared) from
its launch-to-launch spread (``launch_sd``: for the rank test a robust sd of the log launch
medians, 1.4826 times their median absolute deviation, each side about its own median, so
that the far hump does not inflate it; for Welch's t their pooled sd): a case called
unchanged with a detectable change of 20 % says little about a 10 % regression, and
:func:`launches_for` gives the launches a side that would detect a change of the threshold
at that spread. For the rank test both use the
normal approximation with its efficiency against the t-test on normal data (3/pi), at two
launches a side fewer (the exact test's discreteness on few launches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

VERDICTS = ("slower", "faster", "unchanged", "inconclusive", "missing", "not comparable")
MIN_LAUNCHES = 3
RANK_TEST_LAUNCHES = 6  # launches a side from which the launch medians are rank-tested
RANK_EFFICIENCY = 3 / math.pi  # Mann-Whitney against the t-test, normal data
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


def launch_test(n_base: int, n_cand: int, gates: Gates) -> str:
    """The test a case with these launches a side gets (the ``test`` column)."""
    fewest = min(n_base, n_cand)
    if fewest >= RANK_TEST_LAUNCHES:
        return "mann-whitney on launch medians"
    if fewest >= gates.min_launches:
        return "welch t on launch medians"
    return "mann-whitney on samples"


def _p_value(base: np.ndarray, cand: np.ndarray, test: str) -> float:
    from scipy import stats

    lb, lc = np.log(base), np.log(cand)
    if test == "welch t on launch medians":
        if np.ptp(lb) == 0 and np.ptp(lc) == 0:  # no spread at all: equal or certainly not
            return 1.0 if lb[0] == lc[0] else 0.0
        return float(stats.ttest_ind(lb, lc, equal_var=False).pvalue)
    if len(lb) < 2 or len(lc) < 2:
        return 1.0
    return float(stats.mannwhitneyu(lb, lc, alternative="two-sided").pvalue)


def launch_spread(base: np.ndarray, cand: np.ndarray) -> float:
    """The spread of the log launch medians the launch test meets: robust for the rank
    test, the pooled sd (each side about its own mean) for Welch's t on few launches."""
    if min(len(base), len(cand)) >= RANK_TEST_LAUNCHES:
        return robust_spread(base, cand)
    lb, lc = np.log(base), np.log(cand)
    dof = len(lb) + len(lc) - 2
    return float(math.sqrt((((lb - lb.mean()) ** 2).sum() + ((lc - lc.mean()) ** 2).sum()) / dof))


def robust_spread(base: np.ndarray, cand: np.ndarray) -> float:
    """Pooled robust sd of the log launch medians: 1.4826 x the median absolute deviation
    of each side about its own median (the sd for normal data, unmoved by a far hump)."""
    lb, lc = np.log(base), np.log(cand)
    deviations = np.concatenate([np.abs(lb - np.median(lb)), np.abs(lc - np.median(lc))])
    return float(1.4826 * np.median(deviations))


def _reach(n: np.ndarray, gates: Gates) -> np.ndarray:
    """Standard errors of the log ratio a change must span to be caught with ``POWER`` at
    ``gates.alpha`` with ``n`` launches a side: Welch's t below RANK_TEST_LAUNCHES, the
    rank test's normal approximation (at its efficiency) from there."""
    from scipy import stats

    n = np.asarray(n, dtype=float)
    # Welch's degrees of freedom on few launches fall below the pooled 2n - 2 (the sample
    # variances differ): 1.5 (n - 1) matches its power at 3-5 a side (drawn normal medians)
    dof = 1.5 * (n - 1)
    welch = stats.t.ppf(1 - gates.alpha / 2, dof) + stats.t.ppf(POWER, dof)
    rank = (stats.norm.ppf(1 - gates.alpha / 2) + stats.norm.ppf(POWER)) / math.sqrt(
        RANK_EFFICIENCY
    )
    # the exact rank test on few launches falls short of the approximation: two launches a
    # side fewer matches its power from 6 to 30 a side (drawn normal launch medians)
    rank_n = np.maximum(n - 2, 1)
    return np.where(n >= RANK_TEST_LAUNCHES, rank * np.sqrt(2 / rank_n), welch * np.sqrt(2 / n))


def detectable_change(base: np.ndarray, cand: np.ndarray, gates: Gates) -> float:
    """The smallest ratio change (0.12 for 12 %) the launch test would catch with
    probability ``POWER`` at level ``gates.alpha`` on launch medians spread as these are,
    for a case tested alone (the FDR correction over many cases raises it unless many
    change together)."""
    sd = launch_spread(base, cand)
    if sd == 0:
        return 0.0
    n = min(len(base), len(cand))
    return float(math.expm1(float(_reach(np.array([n]), gates)[0]) * sd))


def launches_for(change: float, sd: float, gates: Gates, most: int = 1000) -> int | None:
    """Launches a side for the launch test to catch a ``change`` (0.05 for 5 %) with
    probability ``POWER`` at level ``gates.alpha``, when launch medians spread ``sd`` (log,
    robust); None if more than ``most``."""
    n = np.arange(2, most + 1)
    enough = n[_reach(n, gates) * sd <= math.log1p(change)]
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
        test = launch_test(b.launch.nunique(), c.launch.nunique(), gates)
        by_launch = test != "mann-whitney on samples"
        ub, uc = _units(b, by_launch), _units(c, by_launch)
        low, high = _ratio_interval(ub, uc, gates, rng)
        row.update(
            baseline=float(np.median(ub)),
            candidate=float(np.median(uc)),
            ratio=float(np.median(uc) / np.median(ub)),
            ratio_low=low,
            ratio_high=high,
            ci_coverage=gates.confidence,
            p_value=_p_value(ub, uc, test),
            launch_sd=launch_spread(ub, uc) if by_launch else math.nan,
            detectable=detectable_change(ub, uc, gates) if by_launch else math.nan,
            test=test,
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
