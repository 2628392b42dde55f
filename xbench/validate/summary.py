"""What ``xbench validate`` reports: each measured case against the model's prediction."""

from __future__ import annotations


def summarize_validation(samples, profile, fabric: str):
    """Per case: measured median (95 % CI), the model's prediction, and the relative error."""
    import pandas as pd

    from xbench.core.costmodel import Request, decide
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
        d = decide(profile, req)
        predicted = {"route": d.t_route, "fetch": d.t_fetch, "local": d.t_local}[option] * 1e6
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
    """The figures validate reports from its summary: MAPE, worst case, MAPE per option."""
    err = summary.error.abs()
    per = summary.groupby("option", sort=False).error.apply(lambda e: e.abs().mean())
    return {"mape": float(err.mean()), "worst": float(err.max()), "by_option": per.to_dict()}
