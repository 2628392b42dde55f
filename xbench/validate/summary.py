"""What ``xbench validate`` reports: each measured case against the model's prediction."""

from __future__ import annotations

PHASE_COLUMNS = ("send", "attention", "return", "merge", "transfer", "move")


def summarize_validation(samples, profile, fabric: str):
    """Per case: measured median (with its interval), the model's prediction, the relative
    error, and the same per phase (``measured_<phase>_us``, ``predicted_<phase>_us``)."""
    import math

    import pandas as pd

    from xbench.core.costmodel import Request
    from xbench.core.parts import step_parts
    from xbench.core.stats import summarize

    measured = samples[~samples.warmup]
    rows = []
    for (option, b, h, c, dtype, n_seg), group in measured.groupby(
        ["option", "rows", "heads", "chunk_tokens", "dtype", "segments"], sort=False
    ):
        s = summarize(group.value.to_numpy())
        elem = 2 if dtype == "bf16" else 4
        req = Request(
            rows=int(b),
            heads=int(h),
            chunk_tokens=int(c),
            payload_bytes=576 * elem,
            return_bytes=512 * elem + 4,
            kv_bytes_per_token=576 * elem,
            fabric=fabric,
            segments=int(n_seg),
            blocks_local=option == "local",
        )
        parts = step_parts(profile, req)  # decide's times, and their phases
        predicted = getattr(parts, option) * 1e6
        model_phases = parts.phases()[option]
        phases = {}
        for name in PHASE_COLUMNS:
            timed = group[f"{name}_us"].dropna() if f"{name}_us" in group else ()
            phases[f"measured_{name}_us"] = float(timed.median()) if len(timed) else math.nan
            phases[f"predicted_{name}_us"] = model_phases.get(name, math.nan) * 1e6
        rows.append(
            {
                "option": option,
                "rows": int(b),
                "heads": int(h),
                "chunk_tokens": int(c),
                "segments": int(n_seg),
                "measured_us": s.median,
                "ci_low_us": s.ci_low,
                "ci_coverage": s.confidence,
                "ci_high_us": s.ci_high,
                "predicted_us": predicted,
                "error": (predicted - s.median) / s.median,
                "correct": bool(group.correct.all()),
                "max_abs_error": float(group.max_abs_error.max()),
                **phases,
            }
        )
    frame = pd.DataFrame(rows)
    # Diagnostic, not a held-out figure: the same prediction with this run's measured T_c
    # (the local option) in place of the fitted one, which separates drift in the compute
    # fit from error in how the phases compose (wire, merge, move).
    local = frame[frame.option == "local"].set_index(["rows", "chunk_tokens"]).measured_us
    fitted_tc = frame[frame.option == "local"].set_index(["rows", "chunk_tokens"]).predicted_us
    keys = list(zip(frame.rows, frame.chunk_tokens, strict=True))
    frame["predicted_with_measured_tc_us"] = [
        p - fitted_tc.get(k, float("nan")) + local.get(k, float("nan"))
        for p, k in zip(frame.predicted_us, keys, strict=True)
    ]
    frame["composition_error"] = (
        frame.predicted_with_measured_tc_us - frame.measured_us
    ) / frame.measured_us
    return frame


def validation_errors(summary) -> dict:
    """The figures validate reports from its summary: MAPE, worst case, MAPE per option, and
    the bias (mean signed error: negative when the model predicts too little) overall and
    per option. A bias near the MAPE means one sign on every case: a condition, not noise."""
    err = summary.error.abs()
    by = summary.groupby("option", sort=False).error
    return {
        "mape": float(err.mean()),
        "worst": float(err.max()),
        "bias": float(summary.error.mean()),
        "by_option": by.apply(lambda e: e.abs().mean()).to_dict(),
        "bias_by_option": by.mean().to_dict(),
    }


def phase_errors(summary):
    """Per option and phase: measured and predicted medians summed over the cases, and the
    mean signed error of the phase relative to the option's measured total (so phases of
    different sizes compare: which term is off, and by how much of the whole)."""
    import pandas as pd

    rows = []
    for option, group in summary.groupby("option", sort=False):
        for name in PHASE_COLUMNS:
            measured, predicted = group[f"measured_{name}_us"], group[f"predicted_{name}_us"]
            if predicted.isna().all():
                continue
            share = ((predicted - measured) / group.measured_us).dropna()
            rows.append(
                {
                    "option": option,
                    "phase": name,
                    "measured_us": float(measured.sum())
                    if measured.notna().any()
                    else float("nan"),
                    "predicted_us": float(predicted.sum()),
                    "error_of_total": float(share.mean()) if len(share) else float("nan"),
                }
            )
    return pd.DataFrame(rows)
