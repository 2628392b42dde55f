"""Summary rows of probe samples: one per case, medians with 95 % intervals."""

from __future__ import annotations

import pandas as pd

from xbench.core.stats import summarize
from xbench.core.units import format_size
from xbench.results.schema import PROBE_CASE_KEYS

CASE_KEYS = PROBE_CASE_KEYS
SUMMARY_COLUMNS = [
    "pattern",
    "transport",
    "fabric",
    "loop",
    "pair",
    "pair_class",
    "size_bytes",
    "size",
    "rows",
    "window",
    "blocks",
    "metric",
    "n",
    "median",
    "aggregate",
    "ci_low",
    "ci_coverage",
    "ci_high",
    "p99",
    "unit",
]


def summarize_samples(samples: pd.DataFrame, *, include_overhead: bool = False) -> pd.DataFrame:
    """Group measured (non-warm-up) samples by case and summarize each."""
    measured = samples[~samples["warmup"]]
    if not include_overhead:
        measured = measured[measured["pattern"] != "overhead"]
    rows = []
    for key, group in measured.groupby(CASE_KEYS, dropna=False, sort=False):
        case = dict(zip(CASE_KEYS, key, strict=True))
        s = summarize(group["value"].to_numpy())
        iters = group["iterations"].to_numpy(float)
        values = group["value"].to_numpy(float)
        rows.append(
            {
                **case,
                "pair": f"{case['rank_a']}-{case['rank_b']}",
                "size": format_size(int(case["size_bytes"])),
                "n": s.n,
                "median": s.median,
                # OSU's statistic: total time over total iterations (for rates, total
                # bytes over total time), whatever the samples' lengths
                "aggregate": (
                    iters.sum() / (iters / values).sum()
                    if case["unit"] == "MB/s"
                    else (values * iters).sum() / iters.sum()
                ),
                "ci_low": s.ci_low,
                "ci_coverage": s.confidence,
                "ci_high": s.ci_high,
                "p99": s.p99,
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    return frame[SUMMARY_COLUMNS].reset_index(drop=True)


def overhead(samples: pd.DataFrame) -> dict[str, float]:
    """Median per-iteration loop overhead in us, by loop kind."""
    rows = samples[samples["pattern"] == "overhead"]
    return {loop: float(g["value"].median()) for loop, g in rows.groupby("loop")}
