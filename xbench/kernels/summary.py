"""Summary rows of kernel samples: median time with its interval, achieved rates, shares."""

from __future__ import annotations

import pandas as pd

from xbench.core.stats import summarize
from xbench.results.schema import KERNEL_CASE_KEYS

CASE_KEYS = KERNEL_CASE_KEYS


def ceilings_from(samples: pd.DataFrame) -> dict[str, float]:
    """copy bytes/s and matmul FLOP/s recorded in a run (empty when not measured)."""
    out = {}
    for kernel, key, num in (
        ("ceiling_copy", "copy_bytes_per_s", "bytes_moved"),
        ("ceiling_matmul", "matmul_flops_per_s", "flops"),
    ):
        rows = samples[samples.kernel == kernel]
        if len(rows):
            out[key] = float((rows[num] / (rows["value"] * 1e-6)).median())
    return out


def summarize_kernels(samples: pd.DataFrame) -> pd.DataFrame:
    ceilings = ceilings_from(samples)
    measured = samples[~samples.warmup & ~samples.kernel.str.startswith("ceiling_")]
    rows = []
    for key, group in measured.groupby(CASE_KEYS, sort=False):
        case = dict(zip(CASE_KEYS, key, strict=True))
        s = summarize(group["value"].to_numpy())
        t = s.median * 1e-6
        gbps = case["bytes_moved"] / t / 1e9
        gflops = case["flops"] / t / 1e9
        rows.append(
            {
                **case,
                "n": s.n,
                "median_us": s.median,
                "ci_low_us": s.ci_low,
                "ci_coverage": s.confidence,
                "ci_high_us": s.ci_high,
                "p99_us": s.p99,
                "gb_per_s": gbps,
                "gflop_per_s": gflops,
                "copy_share": gbps * 1e9 / ceilings["copy_bytes_per_s"]
                if "copy_bytes_per_s" in ceilings
                else float("nan"),
                "matmul_share": gflops * 1e9 / ceilings["matmul_flops_per_s"]
                if "matmul_flops_per_s" in ceilings
                else float("nan"),
            }
        )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        # bound / time, with bound = max(bytes / copy bandwidth, FLOPs / matmul rate), both
        # the rates torch's copy and GEMM reached in the same run: a share of what the
        # library reached here, not of the hardware's peak (a kernel can pass it: above 1)
        frame["bound_share"] = frame[["copy_share", "matmul_share"]].max(axis=1, skipna=True)
    return frame
