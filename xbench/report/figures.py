"""The report's figures (matplotlib, Agg: files only, no display needed).

Each function takes frames the library already produces and returns a Figure, or None when
its input holds nothing to draw.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLOURS = {"route": "#1f77b4", "fetch": "#ff7f0e", "local": "#2ca02c"}


def _times_over_powers_of_two(time_ax, title: str, *below) -> None:
    """A panel of times in us (log-log) over panels that share its power-of-two axis
    (sizes, rows): one grid and scale for all, the title and legend on the times."""
    for ax in (time_ax, *below):
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    time_ax.set_yscale("log")
    time_ax.set_title(title)
    time_ax.set_ylabel("us")
    time_ax.legend(fontsize=7)


def probe_figure(samples: pd.DataFrame, fabrics) -> plt.Figure | None:
    """Per fabric: one-way latency against size with the fitted segments over the samples
    and their residuals, and windowed bandwidth against size."""
    measured = samples[~samples.warmup]
    wire = measured[measured.pattern.isin(["offcache", "latency"])]
    if wire.empty:
        return None
    fitted = {f.name: f for f in fabrics}
    names = list(dict.fromkeys(wire.fabric))
    fig, axes = plt.subplots(3, len(names), figsize=(5.5 * len(names), 10), squeeze=False)
    fig.suptitle("Fabrics: latency and bandwidth against message size")
    for col, name in enumerate(names):
        lat_ax, res_ax, bw_ax = axes[0][col], axes[1][col], axes[2][col]
        rows = wire[wire.fabric == name]
        for pattern, group in rows.groupby("pattern"):
            med = group.groupby("size_bytes").value.median()
            lat_ax.scatter(
                group.size_bytes, group.value, s=6, alpha=0.3, label=f"{pattern} samples"
            )
            lat_ax.plot(med.index, med.values, "o", ms=4, label=f"{pattern} median")
        fab = fitted.get(name)
        sizes = np.unique(rows.size_bytes)
        if fab is not None and len(sizes):
            grid = np.geomspace(max(sizes.min(), 1), sizes.max(), 200)
            model = np.array([fab.wire(n) for n in grid]) * 1e6
            lat_ax.plot(grid, model, "k-", lw=1.2, label="fitted segments")
            for seg in fab.segments[1:]:
                lat_ax.axvline(seg.min_bytes, color="grey", ls=":", lw=0.8)
            med = rows.groupby("size_bytes").value.median()
            predicted = np.array([fab.wire(n) for n in med.index]) * 1e6
            res_ax.plot(
                med.index, 100 * (predicted - med.values) / med.values, "s-", color="#d62728", ms=4
            )
        res_ax.axhline(0, color="k", lw=0.8)
        bw = measured[(measured.pattern == "bandwidth") & (measured.fabric == name)]
        if not bw.empty:
            med = bw.groupby("size_bytes").value.median()
            bw_ax.plot(med.index, med.values / 1e3, "o-", color="#9467bd", ms=4, label="windowed")
            bw_ax.legend(fontsize=8)
        _times_over_powers_of_two(lat_ax, f"{name}: one-way time", res_ax, bw_ax)
        res_ax.set_ylabel("fit residual, %")
        bw_ax.set_ylabel("GB/s")
        bw_ax.set_xlabel("message size, bytes")
    fig.tight_layout()
    return fig


def round_trip_figure(
    points: pd.DataFrame,
    target: float,
    warm: pd.DataFrame | None = None,
    errors: dict | None = None,
) -> plt.Figure | None:
    """Per fabric: the batched round trips the probe measured (median and quartiles, by
    rows) against the fitted model's (route's two messages), and the model's error, with
    the study's target band (``target``, a fraction); ``warm``, the same points against
    segments refitted from warm latency where the fabric's came from cold caches;
    ``errors`` (``fit.profile_fit.rtt_errors``): each fabric's mean absolute error and
    worst case in its title, as ``xbench fit`` reports them."""
    if points.empty:
        return None
    names = list(dict.fromkeys(points.fabric))
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 7), squeeze=False)
    fig.suptitle("Batched round trips (rtt): measured against the model")
    for col, name in enumerate(names):
        time_ax, error_ax = axes[0][col], axes[1][col]
        mine = points[points.fabric == name].sort_values("rows")
        below, above = mine.measured_us - mine.low_us, mine.high_us - mine.measured_us
        time_ax.errorbar(
            mine.rows, mine.measured_us, yerr=[below, above], fmt="o", ms=4, capsize=3,
            label="measured (median, quartiles)",
        )  # fmt: skip
        time_ax.plot(mine.rows, mine.predicted_us, "k-", lw=1.2, label="model (fitted segments)")
        error_ax.plot(mine.rows, 100 * mine.error, "s-", color="#d62728", ms=4)
        refit = pd.DataFrame() if warm is None else warm[warm.fabric == name].sort_values("rows")
        if not refit.empty:
            label = "model (refitted from warm latency)"
            time_ax.plot(refit.rows, refit.predicted_us, "k--", lw=1.2, label=label)
            error_ax.plot(refit.rows, 100 * refit.error, "^--", color="#9467bd", ms=4, label=label)
            error_ax.legend(fontsize=7)
        error_ax.axhspan(-100 * target, 100 * target, color="grey", alpha=0.15, lw=0)
        error_ax.axhline(0, color="k", lw=0.8)
        title = f"{name}: round trip of b rows"
        e = (errors or {}).get(name)
        if e is not None and e["mape"] == e["mape"]:
            title += f"\nmean abs. error {100 * e['mape']:.1f} %, worst {100 * e['worst']:+.1f} %"
        _times_over_powers_of_two(time_ax, title, error_ax)
        error_ax.set_ylabel(f"model error, % (band: +-{100 * target:.0f} %)")
        error_ax.set_xlabel("rows b")
    fig.tight_layout()
    return fig


def roofline_figure(summary: pd.DataFrame, ceilings: dict) -> plt.Figure | None:
    """The kernel sweep against the device's ceilings: attained FLOP/s against arithmetic
    intensity, with the measured copy bandwidth and matmul rate as the roof."""
    rows = summary[(summary.kernel == "partial_attention") & (summary.flops > 0)]
    # the roofline is of calls back to back from memory, not after idle nor on a chunk that
    # a splice has just left in cache
    for column in ("idle_us", "after_splice_tokens"):
        if column in rows:
            rows = rows[rows[column] == 0]
    if rows.empty or not ceilings:
        return None
    intensity = rows.flops / rows.bytes_moved
    fig, ax = plt.subplots(figsize=(7, 5))
    copy, peak = ceilings.get("copy_bytes_per_s"), ceilings.get("matmul_flops_per_s")
    x = np.geomspace(max(intensity.min() / 4, 1e-2), intensity.max() * 4, 200)
    if copy and peak:
        ax.plot(x, np.minimum(x * copy, peak) / 1e9, "k-", lw=1.5, label="roof (measured)")
    for rows_n, group in rows.groupby("rows"):
        i = group.flops / group.bytes_moved
        ax.plot(i, group.flops / (group.median_us * 1e-6) / 1e9, "o-", ms=5, label=f"{rows_n} rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(
        f"MLA partial attention against the ceilings ({rows.backend.iloc[0]} on {rows.device.iloc[0]})"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def decision_map(profile, heads: int = 16, rows=None, chunks=None) -> plt.Figure | None:
    """Rows x chunk coloured by the option the predicate picks, one panel per fabric; cells
    whose decision the intervals leave uncertain are hatched."""
    from xbench.core.grid import decide_grid

    rows = rows or [1, 2, 4, 8, 16, 32, 64, 128]
    chunks = chunks or [64 * 2**k for k in range(10)]
    names = [f.name for f in profile.fabrics]
    if not names:
        return None
    cols = min(3, len(names))
    lines = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(lines, cols, figsize=(4.6 * cols, 3.8 * lines), squeeze=False)
    codes = {"route": 0, "fetch": 1, "local": 2}
    cmap = matplotlib.colors.ListedColormap([COLOURS["route"], COLOURS["fetch"], COLOURS["local"]])
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        grid = pd.DataFrame(
            [(b, c, name, heads) for b in rows for c in chunks],
            columns=["rows", "chunk_tokens", "fabric", "heads"],
        )
        out = decide_grid(profile, grid, threads=1)
        choice = out.decision.astype(str).map(codes).to_numpy().reshape(len(rows), len(chunks))
        unsure = out.uncertain.to_numpy().reshape(len(rows), len(chunks))
        ax.imshow(choice, cmap=cmap, vmin=0, vmax=2, origin="lower", aspect="auto")
        for i, j in zip(*np.nonzero(unsure), strict=True):
            ax.add_patch(
                matplotlib.patches.Rectangle(
                    (j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="white", lw=0
                )
            )
        ax.set_xticks(range(len(chunks)), [str(c) for c in chunks], rotation=60, fontsize=7)
        ax.set_yticks(range(len(rows)), [str(b) for b in rows], fontsize=7)
        ax.set_title(name)
        ax.set_xlabel("chunk, tokens")
        ax.set_ylabel("rows (decode tokens)")
    for k in range(len(names), lines * cols):
        axes[k // cols][k % cols].axis("off")
    handles = [matplotlib.patches.Patch(color=c, label=o) for o, c in COLOURS.items()]
    handles.append(matplotlib.patches.Patch(facecolor="grey", hatch="///", label="uncertain"))
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"Decision map of profile {profile.name} ({heads} heads)")
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig


def break_even_figure(profile, heads: int = 16, chunks=None) -> plt.Figure | None:
    """Where route and fetch trade places along the two porting coefficients, per fabric
    against the chunk (one decode row, one layer): the routed bytes a row (out and back)
    below which route wins (P*, with the default request's bytes marked), and a layer's move
    cost below which fetch wins (F*, with the profile's own T_move). A fabric drawn where
    the point exists (positive and finite)."""
    from xbench.core.costmodel import Request
    from xbench.core.grid import decide_grid

    chunks = chunks or [64 * 2**k for k in range(10)]
    names = [f.name for f in profile.fabrics]
    if not names:
        return None
    grid = pd.DataFrame(
        [(c, name, heads) for name in names for c in chunks],
        columns=["chunk_tokens", "fabric", "heads"],
    )
    out = decide_grid(profile, grid, threads=1)
    fig, (bytes_ax, move_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in names:
        mine = out[out.fabric == name]
        for ax, column, scale in (
            (bytes_ax, "payload_star", 1.0),
            (move_ax, "fetch_cost_star", 1e6),
        ):
            values = mine[column].to_numpy() * scale
            shown = np.isfinite(values) & (values > 0)
            if shown.any():
                ax.plot(mine.chunk_tokens[shown], values[shown], "o-", ms=3, label=name)
    request = Request(heads=heads)
    bytes_ax.axhline(
        request.payload_bytes + request.return_bytes, color="grey", ls="--", lw=1,
        label=f"the default row ({request.payload_bytes} + {request.return_bytes} B)",
    )  # fmt: skip
    move_ax.plot(
        chunks, [profile.device.move(c) * 1e6 for c in chunks], "k--", lw=1,
        label="the profile's T_move",
    )  # fmt: skip
    bytes_ax.set_title("route wins below P* (routed bytes a row)")
    bytes_ax.set_ylabel("bytes a row, out and back")
    move_ax.set_title("fetch wins below F* (a layer's move)")
    move_ax.set_ylabel("us")
    for ax in (bytes_ax, move_ax):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("chunk, tokens")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Break-even points of profile {profile.name} (1 row of {heads} heads, a layer)")
    fig.tight_layout()
    return fig


def validate_figure(summary: pd.DataFrame) -> plt.Figure | None:
    """Predicted against measured per case, with the 7 % band the model aims for."""
    if summary.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 6))
    for option, group in summary.groupby("option"):
        ax.errorbar(
            group.measured_us,
            group.predicted_us,
            xerr=[group.measured_us - group.ci_low_us, group.ci_high_us - group.measured_us],
            fmt="o",
            color=COLOURS.get(option),
            label=option,
            ms=5,
        )
    lo = float(min(summary.measured_us.min(), summary.predicted_us.min())) * 0.8
    hi = float(max(summary.measured_us.max(), summary.predicted_us.max())) * 1.25
    x = np.geomspace(lo, hi, 50)
    ax.plot(x, x, "k-", lw=1, label="predicted = measured")
    ax.fill_between(x, x * 0.93, x * 1.07, color="grey", alpha=0.2, label="+-7 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured, us")
    ax.set_ylabel("predicted, us")
    mape = 100 * summary.error.abs().mean()
    bias = 100 * summary.error.mean()
    ax.set_title(f"validate: MAPE {mape:.1f} %, bias {bias:+.1f} %")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def comparison_figure(cases: pd.DataFrame) -> plt.Figure | None:
    """Each case's candidate/baseline ratio with its interval, coloured by verdict."""
    rows = cases[cases.ratio.notna()]
    if rows.empty:
        return None
    colour = {
        "slower": "#d62728",
        "faster": "#2ca02c",
        "unchanged": "#7f7f7f",
        "inconclusive": "#bcbd22",
    }
    fig, ax = plt.subplots(figsize=(8, max(3, 0.28 * len(rows) + 1.5)))
    y = np.arange(len(rows))
    for yi, r in zip(y, rows.itertuples(), strict=True):
        c = colour.get(r.verdict, "k")
        ax.plot([r.ratio_low, r.ratio_high], [yi, yi], "-", color=c, lw=2)
        ax.plot(r.ratio, yi, "o", color=c, ms=5)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y, rows.case.tolist(), fontsize=7)
    ax.set_xlabel("candidate / baseline (median, with interval)")
    ax.set_title("Comparison: ratio per case")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [
        matplotlib.lines.Line2D([], [], color=c, marker="o", label=v) for v, c in colour.items()
    ]
    ax.legend(handles=handles, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def simulation_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """Per fabric: each policy's p50 and p99 latency (log scale), and the path shares."""
    if frame.empty:
        return None
    fabrics = list(dict.fromkeys(frame.fabric))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(frame) + 2.5))
    labels = [f"{r.fabric} {r.policy}" for r in frame.itertuples()]
    y = np.arange(len(frame))
    lat, share = axes
    lat.barh(y - 0.2, frame.p50_us, height=0.4, color="#1f77b4", label="p50")
    lat.barh(y + 0.2, frame.p99_us, height=0.4, color="#d62728", label="p99")
    lat.set_xscale("log")
    lat.set_yticks(y, labels, fontsize=8)
    lat.set_xlabel("latency, us")
    lat.legend(fontsize=8)
    lat.grid(True, axis="x", alpha=0.3)
    left = np.zeros(len(frame))
    colours = {"present": "#7f7f7f", **COLOURS}
    for path, colour in colours.items():
        values = frame[f"share_{path}"].to_numpy()
        share.barh(y, values, left=left, color=colour, label=path)
        left += values
    share.set_yticks(y, [""] * len(frame))
    share.set_xlim(0, 1)
    share.set_xlabel("share of requests")
    share.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Simulated policies ({', '.join(fabrics)})")
    fig.tight_layout()
    return fig


VALIDATION_MARKERS = {
    "profile": ("o", "#7f7f7f"),
    "calibrated": ("s", "#9467bd"),
    "replayed": ("D", "#d62728"),
}
VALIDATION_LABELS = {"profile": "profile", "calibrated": "calibrated", "replayed": "own costs"}


def simulation_validation_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """``simulate --validate``: per policy and statistic (p50, p99), the replay's latency
    as a bar with one replay's largest distance from the median over rounds as its error bar
    (how far one replay strays: not the interval of a median's error, which the table
    gives) and the 10 % band around it, and the simulations (profile, calibrated, own
    costs) as markers on it."""
    if frame.empty:
        return None
    policies = list(dict.fromkeys(frame.policy))
    y = np.arange(len(policies))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.7 * len(policies) + 2.5))
    for ax, stat in zip(axes, ("p50", "p99"), strict=True):
        measured = frame.groupby("policy", sort=False)[f"measured_{stat}_us"].first()[policies]
        floor = frame.groupby("policy", sort=False)[f"floor_{stat}_us"].first()[policies]
        real = measured.to_numpy() / 1e3
        spread = np.nan_to_num(floor.to_numpy()) * real
        ax.barh(y, real, height=0.5, color="#c7c7c7", xerr=spread, capsize=3, label="replay")
        for i, value in enumerate(real):
            ax.fill_betweenx(
                [i - 0.3, i + 0.3],
                0.9 * value,
                1.1 * value,
                color="#2ca02c",
                alpha=0.15,
                lw=0,
                label="within 10 %" if i == 0 else None,
            )
        for costs, (marker, colour) in VALIDATION_MARKERS.items():
            rows = frame[frame.costs == costs].set_index("policy")
            if rows.empty:
                continue
            at = [policies.index(p) for p in rows.index]
            ax.plot(
                rows[f"simulated_{stat}_us"] / 1e3,
                at,
                marker,
                color=colour,
                ms=7,
                ls="none",
                label=VALIDATION_LABELS[costs],
            )
        ax.set_yticks(y, policies)
        ax.set_xlabel(f"{stat} latency, ms")
        ax.grid(True, axis="x", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()  # one legend, below the panels
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    replays = int(frame.replays.iloc[0])
    how = (
        f"medians of {replays} rounds, error bar: one replay's largest distance from them"
        if replays > 1
        else "one round"
    )
    fig.suptitle(f"Simulated against replayed ({how})")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


PREFILL_COLOURS = {"local": "#2ca02c", "offload": "#8c564b", "predicate": "#9467bd"}


def prefill_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """Per fabric: mean and p99 latency against the offload threshold (the grid search),
    the always-local, always-offload and predicate policies as lines; and what the link
    and the share of offloaded requests do as the threshold moves."""
    grid = frame[frame.policy == "threshold"].sort_values("threshold_tokens")
    if grid.empty:
        return None
    fabrics = list(dict.fromkeys(grid.fabric))
    fig, axes = plt.subplots(len(fabrics), 2, figsize=(11, 3.6 * len(fabrics)), squeeze=False)
    for (lat, use), fabric in zip(axes, fabrics, strict=True):
        g = grid[grid.fabric == fabric]
        lat.plot(g.threshold_tokens, g.mean_ms / 1e3, "o-", ms=3, label="threshold: mean")
        lat.plot(g.threshold_tokens, g.p99_ms / 1e3, "s--", ms=3, label="threshold: p99")
        for row in frame[(frame.fabric == fabric) & (frame.policy != "threshold")].itertuples():
            lat.axhline(
                row.mean_ms / 1e3,
                color=PREFILL_COLOURS[row.policy],
                lw=1,
                label=f"{row.policy}: mean",
            )
        best = g[g.best]
        if len(best):
            lat.axvline(best.threshold_tokens.iloc[0], color="k", ls=":", lw=1, label="best t")
            use.axvline(best.threshold_tokens.iloc[0], color="k", ls=":", lw=1)
        lat.set_xscale("log")
        lat.set_yscale("log")
        lat.set_xlabel("offload above t uncached tokens")
        lat.set_ylabel("latency, s")
        lat.set_title(f"{fabric}: latency against the threshold")
        lat.legend(fontsize=7)
        lat.grid(True, alpha=0.3)
        use.plot(g.threshold_tokens, g.link_util, "o-", ms=3, label="link busy")
        use.plot(g.threshold_tokens, g.share_offloaded, "s-", ms=3, label="requests offloaded")
        use.plot(g.threshold_tokens, g.remote_util, "^-", ms=3, label="remote cluster busy")
        use.plot(g.threshold_tokens, g.local_util, "v-", ms=3, label="local cluster busy")
        use.set_xscale("log")
        use.set_ylim(0, 1.05)
        use.set_xlabel("offload above t uncached tokens")
        use.set_title(f"{fabric}: what the threshold loads")
        use.legend(fontsize=7)
        use.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# the study's figures for prefill-as-a-service: PrfaaS's throughput over each baseline
PRFAAS_STUDY = {"vs_homogeneous": 0.54, "vs_naive": 0.32}


def _split_label(row) -> str:
    """ ", P/D p/d": this cluster's instances prefilling and decoding, where it decodes."""
    decoding = getattr(row, "decode_instances", None)
    if decoding is None or pd.isna(decoding) or not decoding:
        return ""
    return f", P/D {row.prefill_instances:.0f}/{decoding:.0f}"


def saturation_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """Per fabric: the highest arrival rate each deployment keeps up with, its gain over
    the homogeneous deployments (this cluster alone; as many GPUs as both) and the naive
    one written on its bar, the study's beside."""
    if frame.empty:
        return None
    fabrics = list(dict.fromkeys(frame.fabric))
    fig, axes = plt.subplots(1, len(fabrics), figsize=(7 * len(fabrics), 3.8), squeeze=False)
    for ax, fabric in zip(axes[0], fabrics, strict=True):
        f = frame[frame.fabric == fabric]
        bars = ax.barh(f.deployment, f.max_rate_per_s, color="#1f77b4")
        for bar, row in zip(bars, f.itertuples(), strict=True):
            ax.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                " "
                + " / ".join(
                    f"{100 * vs:+.0f}%" if vs == vs else "-"
                    for vs in (row.vs_homogeneous, getattr(row, "vs_same_gpus", None), row.vs_naive)
                    if vs is not None
                )
                + _split_label(row),
                va="center",
                fontsize=8,
            )
        ax.invert_yaxis()
        ax.set_xlim(0, 1.75 * f.max_rate_per_s.max())
        ax.set_xlabel("highest rate kept up with, requests/s")
        ax.set_title(
            f"{fabric}: deployments at saturation (vs homogeneous / same GPUs / naive)\nthe "
            "study: "
            f"+{100 * PRFAAS_STUDY['vs_homogeneous']:.0f}% vs the same GPUs, "
            f"+{100 * PRFAAS_STUDY['vs_naive']:.0f}% vs naive",
            fontsize=9,
        )
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def sharing_figure(calls: pd.DataFrame, steps: pd.DataFrame, facts: dict) -> plt.Figure | None:
    """Shared-KV batching: one call of B queries over a shared chunk against B calls, with
    the knee and the device's ridge point marked (memory-bound to compute-bound); and a
    decode step's gain over each request holding its own copy, against the shared
    context, in device time and per GPU (where the profile gives a GPU's memory), with its
    bound and the paper's 538.7x."""
    if calls.empty and steps.empty:
        return None
    fig, (per_call, per_step) = plt.subplots(1, 2, figsize=(12, 4))
    per_call.plot(calls.batch, calls.gain, "o-", ms=3, label="B calls / one batched call")
    for at, label, style in ((facts.get("knee"), "knee", ":"), (facts.get("ridge"), "ridge", "--")):
        if at and math.isfinite(at):
            per_call.axvline(at, color="k", ls=style, lw=1, label=f"{label}: B = {at:,.0f}")
    if facts.get("call_bound"):
        per_call.axhline(facts["call_bound"], color="grey", lw=1, label="a call's bound")
    per_call.set_xscale("log", base=2)
    per_call.set_yscale("log")
    per_call.set_xlabel("queries B over one shared chunk")
    per_call.set_ylabel("gain")
    per_call.set_title(f"{facts.get('model', '')}: batched against separate calls")
    per_call.legend(fontsize=7)
    per_call.grid(True, which="both", alpha=0.3)
    per_step.plot(steps.shared_tokens, steps.gain, "o-", ms=3, label="step, device time")
    if "moska_gain_per_gpu" in steps and steps.moska_gain_per_gpu.notna().all():
        per_step.plot(steps.shared_tokens, steps.moska_gain_per_gpu, "s--", ms=3, label="per GPU")
        per_step.plot(
            steps.shared_tokens,
            steps.apart_gain_per_gpu,
            "^:",
            ms=3,
            label="per GPU, unique KV on GPUs of its own",
        )
    if facts.get("ceiling"):
        per_step.axhline(facts["ceiling"], color="grey", lw=1, label="bound")
    if facts.get("paper"):
        per_step.axhline(facts["paper"], color="r", ls=":", lw=1, label="paper")
    per_step.set_xscale("log", base=2)
    per_step.set_yscale("log")
    per_step.set_xlabel("shared context, tokens")
    per_step.set_title("a decode step against each request's own copy")
    per_step.legend(fontsize=7)
    per_step.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def span_hits_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """Per span call, asked in order: its KV-cache hit rate under prefix caching and under
    position-independent caching, and beside it, where priced, each one's time to first
    token (log scale: the ratio is what it shows)."""
    if frame.empty:
        return None
    priced = "ttft_dependent_s" in frame and frame.ttft_dependent_s.notna().all()
    fig, axes = plt.subplots(
        1, 2 if priced else 1, figsize=(12 if priced else 10, 0.35 * len(frame) + 1.6),
        squeeze=False, sharey=True,
    )  # fmt: skip
    y = np.arange(len(frame))
    ax = axes[0][0]
    ax.barh(y - 0.2, 100 * frame.hit_rate_dependent, 0.4, label="prefix caching")
    ax.barh(y + 0.2, 100 * frame.hit_rate_independent, 0.4, label="position-independent")
    ax.set_yticks(y, frame.expr, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("KV-cache hit rate, % of the call's input tokens")
    ax.set_title("span calls, asked in order")
    ax.legend(fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    if priced:
        ttft = axes[0][1]
        ttft.barh(y - 0.2, 1e3 * frame.ttft_dependent_s, 0.4, label="prefix caching")
        ttft.barh(y + 0.2, 1e3 * frame.ttft_independent_s, 0.4, label="position-independent")
        ttft.set_xscale("log")
        ttft.set_xlabel("time to first token, ms (the whole model's prefill of what missed)")
        ttft.set_title("time to first token")
        ttft.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def copies_figure(frame: pd.DataFrame) -> plt.Figure | None:
    """Per fabric and policy: a top-k workload's throughput over each request attending its
    own copy, beside the closed form's gain at the same queries per call."""
    if frame.empty:
        return None
    labels = [f"{r.fabric}\n{r.policy}" for r in frame.itertuples()]
    x = np.arange(len(frame))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(frame) + 2), 3.8))
    ax.bar(x - 0.2, frame.gain, 0.4, label="simulated (queues, links, merges)")
    ax.bar(x + 0.2, frame.closed_form_gain, 0.4, label="closed form at the same q/call")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("throughput over a copy each")
    ax.set_title("top-k routing, batched at the holders, against a copy of the context each")
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
