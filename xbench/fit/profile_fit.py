"""From results directories to a Profile: fabric segments, overheads, device terms.

Fabric (per fabric label, pair class and transport):
- segments from the ``offcache`` pattern where the probe ran it (IMB-style cold-cache
  ping-pong: route and fetch messages follow attention, which has streamed the KV cache
  through the CPU's caches), else from ``latency`` (one-way time = half the round trip);
  :func:`wire_regimes` says which;
- the per-message overhead ``o`` from the ``bandwidth`` pattern at small sizes, where a
  window of W messages is limited by per-message cost: o = size / windowed rate;
- alpha = (segment intercept - o), so that a single message costs alpha + o + n/beta,
  exactly the measured one-way time, and each further message in a batch adds o;
- held-out error: refit on 3 of every 4 sizes, predict the 4th, mean |error| / measured;
- where the probe ran ``offgather`` (k pages as k messages, caches cold), the page terms of
  a fetch sent page by page: t - k*o = block_t0 + k*s / block_beta.

Device (from ``xbench kernel`` samples, dense selections preferred):
T_c = t0 + c*(a + R*k); T_m = m0 + R*p*m1 (+ c*m2 where the merges were timed after
attentions over several chunks, ``--in-context``); T_move = gather + splice = g0 + c*g1; T_splice
(a fetch sent block by block from the holder's cache, nothing packed) = s0 + c*s1; where the
sweep also timed attention right after a splice of its chunk (``--in-context``), what a
fetch's first attention saves on the chunk it has just spliced, per chunk size. Where the
sweep also timed attention after idle times (``--idle``), what a call pays for starting after
g of idle, idle_extra * (1 - exp(-g / idle_tau)); where it timed merges after waits
(``--merge-wait``), what a merge adds after its core waited g for a routed answer,
(merge_wait_t0 + R p merge_wait_per_row_partial) (1 - exp(-g / merge_wait_tau)). Terms
without samples come from ``base`` (a priors profile) and stay marked as priors.
"""

from __future__ import annotations

import datetime as _dt
from typing import NamedTuple

import numpy as np
import pandas as pd

from xbench.core import conditions, device_terms
from xbench.core.costmodel import Coef, Device, Fabric, Profile, Segment
from xbench.core.profile import PROFILE_SCHEMA_VERSION
from xbench.core.units import format_size
from xbench.errors import XbenchError
from xbench.fit.bounds import FASTEST_SECONDS_PER_BYTE, mark_bounds
from xbench.fit.linear import fit_linear, percentile_ci
from xbench.fit.segments import fit_piecewise, fit_segmented_linear, predict, segment_start
from xbench.kernels.backend import REFERENCE_ONLY

SMALL_WINDOW_BYTES = 256  # windowed messages this small are limited by per-message cost


def fit_overhead(
    bw: pd.DataFrame, boot: int = 200, seed: int = 0
) -> tuple[float, float, float] | None:
    """(o, low, high) in seconds from small windowed messages, or None without them."""
    small = bw[bw.size_bytes <= SMALL_WINDOW_BYTES]
    if small.empty:
        return None
    per_message = (small.size_bytes / (small.value * 1e6)).to_numpy()
    o = float(np.median(per_message))
    rng = np.random.default_rng(seed)
    draws = np.array([np.median(rng.choice(per_message, len(per_message))) for _ in range(boot)])
    return (o, *percentile_ci(draws, o))


def heldout_mape(n: np.ndarray, t: np.ndarray) -> float | None:
    """Fit on 3 of every 4 sizes, predict the 4th: mean relative error on the held-out medians."""
    sizes = np.unique(n)
    if len(sizes) < 8:
        return None
    held = sizes[3::4]
    train = ~np.isin(n, held)
    fits = fit_piecewise(n[train], t[train], boot=0)
    medians = np.array([np.median(t[n == s]) for s in held])
    return float(np.mean(np.abs(predict(fits, held) - medians) / medians))


WIRE_PATTERNS = ("offcache", "latency")  # in order of preference for the segments


def _wire_groups(samples: pd.DataFrame):
    """((fabric, pair class, transport), pattern used, its samples) per fabric group."""
    measured = samples[~samples.warmup]
    wire = measured[measured.pattern.isin(WIRE_PATTERNS)]
    for key, group in wire.groupby(["fabric", "pair_class", "transport"], sort=False):
        regime = next(p for p in WIRE_PATTERNS if (group.pattern == p).any())
        yield key, regime, group[group.pattern == regime]


def wire_regimes(samples: pd.DataFrame) -> dict[str, str]:
    """Fabric label -> the probe pattern its segments were fitted from."""
    return {str(key[0]): regime for key, regime, _ in _wire_groups(samples)}


def fit_fabrics(
    samples: pd.DataFrame, base: Profile | None = None, warnings: list | None = None
) -> list[Fabric]:
    """Fabrics from probe samples. A term without samples comes from ``base`` (and keeps
    its prior flag) or is a placeholder marked prior; each such case adds to ``warnings``."""
    warnings = [] if warnings is None else warnings
    measured = samples[~samples.warmup]
    groups = list(_wire_groups(samples))
    if not groups:
        raise XbenchError(
            "no latency samples to fit a fabric", "run xbench probe with -p latency (the default)"
        )
    fabrics = []
    for key, _, group in groups:
        fabric, pair_class, transport = key
        n = group.size_bytes.to_numpy(float)
        t = group.value.to_numpy(float) * 1e-6
        same_fabric = (
            (measured.fabric == fabric)
            & (measured.pair_class == pair_class)
            & (measured.transport == transport)
        )
        over = fit_overhead(measured[same_fabric & (measured.pattern == "bandwidth")])
        if over is not None:
            overhead = Coef(*over, "s")
        else:
            known = {f.name: f for f in base.fabrics} if base is not None else {}
            if fabric in known:
                overhead = known[fabric].overhead
                source = f"kept {base.name}'s" + (" prior" if overhead.prior else "")
            else:
                overhead = Coef(0.0, 0.0, 0.0, "s", prior=True)
                source = "set to 0 and marked prior"
            warnings.append(
                f"fabric {fabric}: no windowed bandwidth samples of {SMALL_WINDOW_BYTES} B or "
                f"less to fit the per-message overhead o; {source} (probe -p bandwidth measures it)"
            )
        o = overhead.value
        fits = fit_piecewise(n, t)
        windowed = windowed_rates(measured[same_fabric & (measured.pattern == "bandwidth")], o)
        segments = [
            _segment(str(fabric), fits, i, overhead, windowed, warnings) for i in range(len(fits))
        ]
        pages = measured[same_fabric & (measured.pattern == "offgather")]
        page_terms = fit_pages(pages, o)
        if len(pages) and not page_terms:
            warnings.append(
                f"fabric {fabric}: offgather at one page count fits no page terms; a fetch "
                "page by page is priced on the segments (probe --blocks 1,4,16,64 measures them)"
            )
        fabrics.append(
            Fabric(
                str(fabric),
                tuple(segments),
                overhead,
                str(pair_class),
                str(transport),
                heldout_mape(n, t),
                **page_terms,
            )
        )
    return fabrics


# A segment's beta more than this above the windowed bandwidth measured at its sizes is
# capped at that bandwidth (a full window's medians vary by about 1 % from launch to launch)
BETA_ABOVE_WINDOW = 0.03


def windowed_rates(bw: pd.DataFrame, o: float) -> dict[float, float]:
    """Per size, the rate (B/s) a full window of messages sustained once each message's
    overhead is taken off: n / (n / median bandwidth - o) (sizes where o is most of the
    time give no rate)."""
    rates = {}
    for size, group in bw.groupby("size_bytes"):
        per_message = size / (float(np.median(group.value)) * 1e6) - o
        if per_message > 0.1 * (per_message + o):  # o less than 90 % of the message's time
            rates[float(size)] = size / per_message
    return rates


def _segment(fabric: str, fits, i: int, overhead: Coef, windowed: dict, warnings: list):
    """Segment i of a fabric from its latency fit: alpha is the intercept less the overhead,
    beta the slope's rate. Where a bound binds it says so: alpha clamped at 0 (the intercept
    is not above o), beta capped at the windowed bandwidth measured at the segment's sizes
    (the ping-pong line through a shaped link's burst is steeper than the link)."""
    f, o = fits[i], overhead.value
    start = segment_start(fits, i)
    where = f"fabric {fabric}: the segment from {format_size(start)}"
    alpha = Coef(
        max(f.a - o, 0.0),
        max(f.a_ci[0] - overhead.high, 0.0),
        max(f.a_ci[1] - overhead.low, 0.0),
        "s",
    )
    if f.a - o <= 1e-12:
        warnings.append(
            f"{where}: the latencies' intercept ({f.a * 1e6:.2f} us) is not above the "
            f"per-message overhead ({o * 1e6:.2f} us), so alpha is clamped at 0: its small "
            "messages ran faster than the line through its large ones (a shaped link's burst, "
            "or a protocol switch inside the segment)"
        )
    beta = _rate(f.g, *f.g_ci)
    inside = [rate for size, rate in windowed.items() if f.lo <= size <= f.hi]
    if inside and beta.value > max(inside) * (1 + BETA_ABOVE_WINDOW):
        cap = max(inside)
        warnings.append(
            f"{where}: beta from the latencies ({beta.value / 1e6:,.1f} MB/s) is "
            f"{100 * (beta.value / cap - 1):.1f} % above the windowed bandwidth measured at "
            f"those sizes ({cap / 1e6:,.1f} MB/s, the per-message overhead taken off); beta is "
            "capped at it"
        )
        beta = Coef(cap, min(beta.low, cap), cap, "B/s")
    return Segment(start, alpha, beta)


def fit_pages(samples: pd.DataFrame, o: float) -> dict:
    """block_t0 and block_beta from ``offgather`` samples (k pages as k messages, cold):
    t - k*o = block_t0 + k*s / block_beta, the model's wire for a fetch page by page; {}
    without samples at two page counts or more."""
    if samples.empty or samples.blocks.nunique() < 2:
        return {}
    k = samples.blocks.to_numpy(float)
    moved = k * samples.block_bytes.to_numpy(float)
    t = samples.value.to_numpy(float) * 1e-6 - k * o
    (t0, *t0_ci), (g, *g_ci) = fit_linear(np.column_stack([np.ones_like(k), moved]), t)
    return {"block_t0": Coef(t0, *t0_ci, "s"), "block_beta": _rate(g, *g_ci)}


def _rate(g: float, g_lo: float, g_hi: float) -> Coef:
    """A rate (B/s) from a fitted time per byte and its interval: the slow end of the rate
    is the high end of the time."""
    fastest = FASTEST_SECONDS_PER_BYTE
    g = max(g, fastest)
    return Coef(1.0 / g, 1.0 / max(g_hi, g), 1.0 / max(min(g_lo, g), fastest), "B/s")


def _coef(triple, unit: str) -> Coef:
    return Coef(triple[0], triple[1], triple[2], unit)


def _fit_per_token(terms: dict, kind: str, chunk: np.ndarray, seconds: np.ndarray) -> int:
    """t = t0 + c * per_token, piecewise in the chunk, into terms[<kind>_t0,
    <kind>_per_token, <kind>_segments]; returns the number of pieces."""
    pieces = fit_segmented_linear(chunk, np.column_stack([np.ones_like(chunk), chunk]), seconds)
    (_, (t0, per_token)), rest = pieces[0], pieces[1:]
    terms[f"{kind}_t0"], terms[f"{kind}_per_token"] = _coef(t0, "s"), _coef(per_token, "s/token")
    terms[f"{kind}_segments"] = tuple(
        (start, _coef(a, "s"), _coef(b, "s/token")) for start, (a, b) in rest
    )
    return len(pieces)


def _fit_prefill(terms: dict, notes: dict, prefill: pd.DataFrame, samples: pd.DataFrame) -> None:
    """T_recompute's terms from a prefill sweep (xbench kernel --kernels prefill): its
    attention over L tokens is a0 + (a1 L + a2 L^2) x heads swept / heads, as T_recompute
    is per layer on one device for the model's every head: a0, the call's fixed time, is
    recompute_t0 (a call's launch does not grow with its heads) and a2 recompute_per_token2.
    recompute_per_token adds to a1 the layer's matmuls: 2 x active parameters / layers FLOP
    per token at the matmul rate this run measured, where the model publishes its active
    parameters (otherwise the linear term is left to the base)."""
    from xbench.core.models import get_model
    from xbench.kernels.summary import ceilings_from

    model = get_model(str(prefill["model"].iloc[0]))
    per_head = model.q_heads / prefill.heads.to_numpy(float)
    length = prefill.chunk_tokens.to_numpy(float)
    seconds = prefill.value.to_numpy(float) * 1e-6
    # the swept heads' share of the model's: a1 and a2 come out for its every head
    design = np.column_stack([np.ones_like(length), length / per_head, length**2 / per_head])
    a0, a1, a2 = fit_linear(design, seconds)
    terms["recompute_t0"] = _coef(a0, "s")
    terms["recompute_per_token2"] = _coef(a2, "s/token^2")
    rate = ceilings_from(samples).get("matmul_flops_per_s")
    swept = (
        f"{len(prefill)} samples of {int(prefill.heads.iloc[0])} heads, scaled to {model.q_heads}"
    )
    if model.active_params and rate:
        matmuls = 2 * model.active_params / model.layers / rate
        terms["recompute_per_token"] = _coef(tuple(x + matmuls for x in a1), "s/token")
        notes["recompute"] = (
            f"{swept}; per token adds {matmuls * 1e6:.1f} us of matmuls "
            f"(2 x {model.active_params:.3g} / {model.layers} FLOP at {rate / 1e12:.2f} TFLOP/s)"
        )
    else:
        notes["recompute"] = (
            f"{swept}; the linear term from the base ({model.name} has no active_params or no matmul ceiling)"
        )


# One pass of one case: its median is compared within the pass (drift cancels). Not the
# timing rank: a two-rank sweep alternates it case by case, so a shape's idle case and its
# back-to-back case are often timed by different ranks of the same launch.
PASS_KEYS = ["rows", "heads", "chunk_tokens", "partials", "process_run", "round"]


def _idle_extras(attn: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(idle seconds, extra seconds) per idle case and pass: its median less the median of
    the same shape timed back to back in the same launch and round (drift cancels)."""
    keys = [k for k in PASS_KEYS if k in attn.columns]
    warm = attn[attn.idle_us == 0].groupby(keys).value.median()
    idle = attn[attn.idle_us > 0].groupby([*keys, "idle_us"]).value.median()
    gaps, extras = [], []
    for key, t in idle.items():
        base = warm.get(key[:-1])
        if base is not None:
            gaps.append(key[-1] * 1e-6)
            extras.append((t - base) * 1e-6)
    return np.array(gaps), np.array(extras)


def _fit_spliced_saving(
    terms: dict, notes: dict, attn: pd.DataFrame, spliced: pd.DataFrame, boot: int = 200
) -> None:
    """spliced_saving: per chunk, attention over pages from memory less the same attention
    right after a splice of its chunk, each pass's medians paired (launch, round and the
    timing rank: drift and the two cores' speeds cancel; the sweep times a pair on one
    rank), the median over passes; the interval from resampling the passes, then each
    one's samples. A saving whose interval holds 0 is taken as none: on the 2-vCPU VM the
    passes at 4,096 tokens and more differed by +-1 ms in sign (+586, -1,233, +397 us)
    where validate's fetch saved nothing it could resolve either."""
    keys = [k for k in (*PASS_KEYS, "timed_by") if k in attn.columns]
    cold = {key: g.value.to_numpy(float) for key, g in attn.groupby(keys)}
    rng = np.random.default_rng(0)
    points = []
    for chunk, at_chunk in spliced.groupby("chunk_tokens"):
        pairs = [
            (cold[key], g.value.to_numpy(float)) for key, g in at_chunk.groupby(keys) if key in cold
        ]
        if not pairs:
            continue
        value = np.median([np.median(c) - np.median(h) for c, h in pairs])
        draws = []
        for _ in range(boot):
            passes = rng.integers(len(pairs), size=len(pairs))
            draws.append(
                np.median(
                    [
                        np.median(rng.choice(c, len(c))) - np.median(rng.choice(h, len(h)))
                        for c, h in (pairs[i] for i in passes)
                    ]
                )
            )
        lo, hi = percentile_ci(np.array(draws), value)
        if lo <= 0 <= hi:  # the passes do not agree on its sign: no saving established
            value = 0.0
        points.append((float(chunk), Coef(value * 1e-6, lo * 1e-6, hi * 1e-6, "s")))
    if points:
        terms["spliced_saving"] = tuple(points)
        shown = ", ".join(
            f"{int(t)}: {c.value * 1e6:.0f} us" if c.value else f"{int(t)}: none" for t, c in points
        )
        notes["spliced_saving"] = f"{len(spliced)} samples after a splice ({shown})"


def _fit_saturating(gaps: np.ndarray, y: np.ndarray, per: np.ndarray | None = None):
    """Least squares of y = (e0 + per * e1) (1 - exp(-g / tau)) (without ``per``, y = e0 (1
    - exp(-g / tau))), e0, e1 >= 0; y may be negative (differences). Returns (the
    parameters, their bootstrap draws over the (case, pass) points, 200 of them) or None
    when no fit converges."""
    from scipy.optimize import curve_fit

    top = max(float(np.median(y[gaps == gaps.max()])), 1e-6)
    if per is None:

        def model(g, e, tau):
            return e * -np.expm1(-g / tau)

        x, p0, bounds = gaps, (top, float(np.median(gaps))), ([0.0, 1e-5], [1.0, 1.0])
    else:

        def model(x, e0, e1, tau):
            return (e0 + x[1] * e1) * -np.expm1(-x[0] / tau)

        x = np.vstack([gaps, per])
        p0 = (top, 0.0, float(np.median(gaps)))
        bounds = ([0.0, 0.0, 1e-5], [1.0, 1e-3, 1.0])

    def solve(idx):
        return curve_fit(model, x[..., idx], y[idx], p0=p0, bounds=bounds)[0]

    try:
        params = solve(np.arange(len(y)))
    except (RuntimeError, ValueError):
        return None
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(200):
        idx = rng.integers(0, len(y), len(y))
        if len(np.unique(gaps[idx])) < 2:
            continue
        try:
            draws.append(solve(idx))
        except (RuntimeError, ValueError):
            continue
    return params, np.array(draws) if draws else params[None, :]


def _coefs_of(params, draws, units) -> list[Coef]:
    return [
        Coef(float(v), *percentile_ci(draws[:, i], float(v)), unit)
        for i, (v, unit) in enumerate(zip(params, units, strict=True))
    ]


def _fit_idle(terms: dict, notes: dict, gaps: np.ndarray, extras: np.ndarray) -> None:
    """idle_extra and idle_tau of extra = E (1 - exp(-g / tau)), in seconds (extras are
    differences and may be negative, so not the relative fit)."""
    fit = _fit_saturating(gaps, extras)
    if fit is None:
        notes["idle"] = f"{len(gaps)} points, no fit converged"
        return
    terms["idle_extra"], terms["idle_tau"] = _coefs_of(*fit, ("s", "s"))
    notes["idle"] = (
        f"{len(gaps)} idle cases x passes at {len(np.unique(gaps))} idle times, "
        f"each against the same shape back to back in its pass"
    )


def _fit_merge_wait(terms: dict, notes: dict, waited: pd.DataFrame) -> None:
    """merge_wait_t0, _per_row_partial and _tau of the extra a merge pays after spinning g
    (a route's wait for its answer), t - T_m(R, p, 0) = (w0 + R p w1) (1 - exp(-g / tau)),
    against the merge term the fit just found without its in-context term (no attention
    precedes these merges). Each (case, pass) median is one point."""
    m0, m1 = terms["merge_t0"].value, terms["merge_per_row_partial"].value
    keys = [k for k in PASS_KEYS if k in waited.columns]
    medians = waited.groupby([*keys, "wait_us"]).value.median().reset_index()
    per = (medians.rows * medians.heads * medians.partials).to_numpy(float)
    extra = medians.value.to_numpy(float) * 1e-6 - (m0 + per * m1)
    gaps = medians.wait_us.to_numpy(float) * 1e-6
    fit = _fit_saturating(gaps, extra, per) if len(np.unique(gaps)) >= 2 else None
    if fit is None:
        notes["merge_wait"] = f"{len(gaps)} points, no fit converged"
        return
    names = ("merge_wait_t0", "merge_wait_per_row_partial", "merge_wait_tau")
    terms.update(zip(names, _coefs_of(*fit, ("s", "s/row-partial", "s")), strict=True))
    notes["merge_wait"] = (
        f"{len(gaps)} merge cases x passes after {len(np.unique(gaps))} waits, "
        f"against the merge term"
    )


class _KernelSamples(NamedTuple):
    """A kernel run's timed samples, parted by what each family's fit reads."""

    back_to_back: pd.DataFrame  # dense calls one after another: most terms' samples
    spliced: pd.DataFrame | None  # attentions on a chunk just spliced (a fetch's first)
    idle: pd.DataFrame | None  # attentions after the device idled, and their twins
    waited: pd.DataFrame | None  # merges after a wait


def _part_samples(samples: pd.DataFrame, notes: dict) -> _KernelSamples:
    """The timed samples (no warm-ups, no ceilings, no correctness references; dense where
    the run has dense ones) parted into back-to-back, spliced, idle and waited cases."""
    measured = (
        samples[~samples.warmup & ~samples.kernel.str.startswith("ceiling_")]
        if not samples.empty
        else samples
    )
    reference = measured.backend.isin(REFERENCE_ONLY) if "backend" in measured.columns else None
    if reference is not None and reference.any():  # correctness references time nothing real
        notes["skipped"] = f"{int(reference.sum())} samples of {', '.join(REFERENCE_ONLY)}"
        measured = measured[~reference]
    if not measured.empty and (~measured["sparse"]).any():
        measured = measured[~measured["sparse"]]
    spliced = idle = waited = None
    if "after_splice_tokens" in measured.columns and (measured.after_splice_tokens > 0).any():
        spliced = measured[measured.after_splice_tokens > 0]  # a fetch's first attention
        measured = measured[measured.after_splice_tokens == 0]
    after_idle = measured.idle_us > 0 if "idle_us" in measured.columns else None
    if after_idle is not None and (after_idle & (measured.kernel == "partial_attention")).any():
        idle = measured[measured.kernel == "partial_attention"]  # idle cases and their twins
        measured = measured[~after_idle]  # the other terms are back-to-back times
    if "wait_us" in measured.columns and (measured.wait_us > 0).any():
        waited = measured[(measured.wait_us > 0) & (measured.kernel == "merge")]
        measured = measured[measured.wait_us == 0]
    return _KernelSamples(measured, spliced, idle, waited)


def _of_kernel(measured: pd.DataFrame, kernel: str) -> pd.DataFrame | None:
    """A kernel's samples, where they span at least two shapes (a line needs two)."""
    rows = measured[measured.kernel == kernel] if not measured.empty else measured
    if len(rows) and rows[["rows", "chunk_tokens"]].drop_duplicates().shape[0] >= 2:
        return rows
    return None


def _fit_compute(terms: dict, notes: dict, attn: pd.DataFrame) -> None:
    """T_c(R, c) = t0 + c (a + R k), piecewise over c where the samples break."""
    r = (attn.rows * attn.heads).to_numpy(float)
    c = attn.chunk_tokens.to_numpy(float)
    pieces = fit_segmented_linear(
        c,
        np.column_stack([np.ones_like(c), c, c * r]),
        attn.value.to_numpy(float) * 1e-6,
        min_keys=1,
    )
    (_, (t0, a, k)), rest = pieces[0], pieces[1:]
    terms.update(
        compute_t0=_coef(t0, "s"),
        compute_per_token=_coef(a, "s/token"),
        compute_per_row_token=_coef(k, "s/row-token"),
    )
    terms["compute_segments"] = tuple(
        (start, _coef(t0, "s"), _coef(a, "s/token"), _coef(k, "s/row-token"))
        for start, (t0, a, k) in rest
    )
    notes["compute"] = (
        f"{len(attn)} samples, {attn['dtype'].iloc[0]}, {attn['model'].iloc[0]}, {len(pieces)} piece(s)"
    )


def _fit_merge(terms: dict, notes: dict, merge: pd.DataFrame) -> None:
    """T_m(R, p, c) = m0 + R p m1 (+ c m2 where merges were timed after attentions over
    several chunks)."""
    rp = (merge.rows * merge.heads * merge.partials).to_numpy(float)
    t = merge.value.to_numpy(float) * 1e-6
    after = merge.after_tokens.to_numpy(float) if "after_tokens" in merge else np.zeros_like(rp)
    if len(np.unique(after)) >= 2:  # timed after attentions over several chunks
        m0, m1, m2 = fit_linear(np.column_stack([np.ones_like(rp), rp, after]), t)
        terms["merge_per_token"] = _coef(m2, "s/token")
    else:
        m0, m1 = fit_linear(np.column_stack([np.ones_like(rp), rp]), t)
    terms.update(merge_t0=_coef(m0, "s"), merge_per_row_partial=_coef(m1, "s/row-partial"))
    context = "after attention" if after.any() else "back to back"
    notes["merge"] = f"{len(merge)} samples, {context}"


def _fit_moves(terms: dict, notes: dict, gather, splice) -> None:
    """T_move = gather at the holder + splice at the requester (their samples paired per
    chunk), and T_splice alone: the move of a fetch sent block by block from the holder's
    cache."""
    if gather is not None and splice is not None:
        rng = np.random.default_rng(0)
        cs, ts = [], []
        for chunk in sorted(set(gather.chunk_tokens) & set(splice.chunk_tokens)):
            g = gather[gather.chunk_tokens == chunk].value.to_numpy(float)
            sp = splice[splice.chunk_tokens == chunk].value.to_numpy(float)
            n = max(len(g), len(sp))
            cs += [chunk] * n
            ts += list((rng.choice(g, n) + rng.choice(sp, n)) * 1e-6)
        pieces = _fit_per_token(terms, "move", np.array(cs, float), np.array(ts))
        notes["move"] = f"gather + splice, {pieces} piece(s)"
    if splice is not None:
        c, t = splice.chunk_tokens.to_numpy(float), splice.value.to_numpy(float) * 1e-6
        notes["splice"] = f"{len(splice)} samples, {_fit_per_token(terms, 'splice', c, t)} piece(s)"


# The optional terms a fit takes from its base where its samples do not give them (a merge's
# per-token term is not among them: it belongs to the merge fitted beside it)
FROM_BASE = tuple(
    t.name for t in device_terms.TERMS if not t.required and t.name != "merge_per_token"
)


def _fill_from_base(terms: dict, notes: dict, base: Device | None) -> None:
    """The terms the samples did not give, from ``base`` (refused without one where a
    required term is missing); each one taken is listed in notes["from_base"]."""
    missing = [t for t in device_terms.REQUIRED if t not in terms]
    if missing and base is None:
        raise XbenchError(
            f"no kernel samples for {', '.join(sorted({m.split('_')[0] for m in missing}))}",
            "run xbench kernel into the results you fit, or pass --base profiles/h100-priors.toml",
        )
    terms.setdefault("compute_segments", ())
    terms.setdefault("move_segments", ())
    if "compute_t0" in missing and base is not None:
        terms["compute_segments"] = base.compute_segments
    if "move_t0" in missing and base is not None:
        terms["move_segments"] = base.move_segments
    if "splice_t0" not in terms and base is not None and base.splice_t0 is not None:
        terms["splice_segments"] = base.splice_segments
    if "spliced_saving" not in terms and base is not None and base.spliced_saving:
        terms["spliced_saving"] = base.spliced_saving
        notes.setdefault("from_base", []).append("spliced_saving")
    for term in missing + list(FROM_BASE):
        if term not in terms:
            terms[term] = getattr(base, term) if base is not None else None
            if terms[term] is not None:
                notes.setdefault("from_base", []).append(term)


def fit_device(samples: pd.DataFrame, base: Device | None, name: str) -> tuple[Device, dict]:
    """Device terms from kernel samples; the rest from ``base``. Returns (device, notes)."""
    notes: dict = {}
    terms: dict = {}
    parts = _part_samples(samples, notes)
    measured = parts.back_to_back
    if parts.idle is not None and len(parts.idle):
        gaps, extras = _idle_extras(parts.idle)
        if len(np.unique(gaps)) >= 2:
            _fit_idle(terms, notes, gaps, extras)
    attn = _of_kernel(measured, "partial_attention")
    if attn is not None:
        _fit_compute(terms, notes, attn)
        if parts.spliced is not None:
            _fit_spliced_saving(terms, notes, attn, parts.spliced)
    merge = measured[measured.kernel == "merge"] if not measured.empty else measured
    if len(merge) and merge.rows.nunique() >= 2:
        _fit_merge(terms, notes, merge)
        if parts.waited is not None and len(parts.waited):
            _fit_merge_wait(terms, notes, parts.waited)
    _fit_moves(terms, notes, _of_kernel(measured, "gather"), _of_kernel(measured, "splice"))
    prefill = measured[measured.kernel == "prefill"] if not measured.empty else measured
    if len(prefill) and prefill.chunk_tokens.nunique() >= 3:
        _fit_prefill(terms, notes, prefill, samples)
    _fill_from_base(terms, notes, base)
    return Device(name, **terms), notes


# The study validated its model's batched round trips within this relative error
RTT_TARGET = 0.07


def rtt_points(probe: pd.DataFrame, fabrics) -> pd.DataFrame:
    """Per fabric and shape of the probe's ``rtt`` pattern (b rows of P bytes out, b of R
    back): the measured round trip's median and quartiles (us), the fabric's prediction
    (wire(b P) + wire(b R): route's two messages), and its error (prediction / measured -
    1). Empty without rtt samples."""
    columns = ["fabric", "rows", "out_bytes", "back_bytes", "measured_us", "low_us"]
    columns += ["high_us", "predicted_us", "error"]
    if probe.empty:
        return pd.DataFrame(columns=columns)
    rtt = probe[(probe.pattern == "rtt") & ~probe.warmup]
    points = []
    for f in fabrics:
        for (size, back), g in rtt[rtt.fabric == f.name].groupby(["size_bytes", "return_bytes"]):
            measured = float(np.median(g.value))
            predicted = (f.wire(float(size)) + f.wire(float(back))) * 1e6
            low, high = np.percentile(g.value, [25, 75])
            points.append(
                (f.name, int(g.rows.iloc[0]), float(size), float(back), measured, float(low),
                 float(high), predicted, predicted / measured - 1)
            )  # fmt: skip
    return pd.DataFrame(points, columns=columns)


def noise_points(points: pd.DataFrame) -> pd.Series:
    """Which round trips (rows of :func:`rtt_points`) no model of bytes can price: a batch
    whose lower quartile lies above the upper quartile of a larger batch of the same fabric
    and bytes a row (more rows never move fewer bytes): noise the metric leaves out, and
    names."""
    noise = pd.Series(False, index=points.index)
    for _, g in points.groupby(["fabric"], sort=False):
        per_row = g.out_bytes / g.rows
        for i, r in g.iterrows():
            larger = g[(g.rows > r.rows) & np.isclose(per_row, r.out_bytes / r.rows)]
            noise[i] = bool((r.low_us > larger.high_us).any())
    return noise


def rtt_errors(probe: pd.DataFrame, fabrics) -> dict[str, dict]:
    """Per fabric with rtt samples, the study's metric on them (:func:`rtt_points`): the
    mean absolute error over the round trips (``mape``) and the worst (``worst``, signed,
    at ``worst_rows``), leaving out the noise :func:`noise_points` finds (``excluded``:
    their rows); and the signed errors' range and median over every point."""
    points = rtt_points(probe, fabrics)
    noise = noise_points(points)
    out = {}
    for name, g in points.groupby("fabric", sort=False):
        kept = g[~noise[g.index]]
        worst = kept.loc[kept.error.abs().idxmax()] if len(kept) else None
        out[str(name)] = {
            "shapes": len(g),
            "mape": float(kept.error.abs().mean()) if len(kept) else float("nan"),
            "worst": float(worst.error) if worst is not None else float("nan"),
            "worst_rows": int(worst.rows) if worst is not None else 0,
            "excluded": [int(r) for r in g[noise[g.index]].rows],
            "error_low": float(g.error.min()),
            "error_median": float(g.error.median()),
            "error_high": float(g.error.max()),
        }
    return out


def rtt_line(name: str, e: dict, pattern: str = "latency") -> str:
    """One line: a fabric's mean absolute error on its batched round trips, the worst, the
    points left out, against the study's target."""
    kept = e["shapes"] - len(e.get("excluded", []))
    line = (
        f"fabric {name}: the model on the measured batched round trips (rtt, {kept} shapes; "
        f"segments fitted from {pattern}): mean absolute error {100 * e['mape']:.1f} %, worst "
        f"{100 * e['worst']:+.1f} % at {e['worst_rows']} rows"
    )
    if e.get("excluded"):
        rows = ", ".join(str(r) for r in e["excluded"])
        line += f"; left out as noise (slower than a larger batch): {rows} rows"
    within = e["mape"] <= RTT_TARGET
    return line + (f"; {'within' if within else 'beyond'} the study's {100 * RTT_TARGET:.0f} %")


def warm_refits(probe: pd.DataFrame) -> list[Fabric]:
    """The fabrics whose segments came from cold-cache ping-pong (``offcache``), refitted
    from their ``latency`` samples. rtt's loop runs warm, as latency's does, so these check
    the model's form (wire(b P) + wire(b R)) on round trips in their own regime, while the
    profile keeps the cold segments that price routed and fetched messages after attention
    (what validate measures). Empty where no fabric has both."""
    if probe.empty:
        return []
    cold = [name for name, pattern in wire_regimes(probe).items() if pattern == "offcache"]
    warm = probe[probe.fabric.isin(cold) & (probe.pattern != "offcache")]
    if not (warm.pattern == "latency").any():
        return []
    return fit_fabrics(warm, warnings=[])


def _rtt_warnings(errors: dict, warm: dict, wire_pattern: dict, warnings: list) -> None:
    """A line per fabric whose round trips its segments, or its warm refit, miss by more
    than the target on average; the warm refit's beside the profile's where there is one."""
    for name, e in errors.items():
        refit = warm.get(name)
        if e["mape"] <= RTT_TARGET and (refit is None or refit["mape"] <= RTT_TARGET):
            continue
        line = rtt_line(name, e, wire_pattern.get(name, "latency"))
        if refit is not None:
            line += (
                f"; refitted from its warm latency samples, as rtt runs: mean absolute error "
                f"{100 * refit['mape']:.1f} %"
            )
        warnings.append(line)


def _swept_model(kernel: pd.DataFrame):
    """The model preset whose shapes the kernel sweep timed (the physics check's bytes and
    FLOPs), or None (DeepSeek-V3.2's) where the samples name none or several."""
    from xbench.core.models import get_model

    names = set(kernel["model"].dropna().unique()) if "model" in kernel else set()
    if len(names) != 1:
        return None
    try:
        return get_model(str(names.pop()))
    except XbenchError:  # a model this version does not know: the default shapes
        return None


def kernel_software(run_meta: list[dict]) -> dict:
    """What timed the device terms, from the first kernel run's metadata: the device, the
    attention backend, torch and Triton (fields a run did not record are left out)."""
    for meta in run_meta:
        if meta.get("command") == "kernel":
            found = {
                "device": meta.get("device_name") or meta.get("cpu_model"),
                "backend": meta.get("backend"),
                "torch": meta.get("torch"),
                "triton": meta.get("triton"),
            }
            return {k: v for k, v in found.items() if v is not None}
    return {}


def fit_profile(
    probe: pd.DataFrame,
    kernel: pd.DataFrame,
    *,
    name: str,
    base: Profile | None = None,
    run_meta: list[dict] | None = None,
    warnings: list | None = None,
) -> Profile:
    """A profile from probe and kernel samples (either may be empty when ``base`` fills in).

    What the fit had to take from ``base`` or leave as a placeholder goes to ``warnings``
    (one line each) and to the profile's provenance.
    """
    warnings = [] if warnings is None else warnings
    fabrics = fit_fabrics(probe, base, warnings) if not probe.empty else []
    if not fabrics:
        if base is None:
            raise XbenchError(
                "no probe samples to fit", "pass a results directory written by xbench probe"
            )
        fabrics = list(base.fabrics)
    meta = run_meta or []
    software = kernel_software(meta)
    device, notes = fit_device(
        kernel, base.device if base else None, software.get("device", "device")
    )
    fitted = conditions.merged(meta)
    kept_prefill = [t for t in notes.get("from_base", []) if t.startswith("recompute_")]
    on_cpu = conditions.timed_on_cpu
    if kept_prefill and on_cpu(fitted) and not on_cpu(base.provenance.get("conditions", {})):
        # local's time would add a GPU's prefill to this CPU's attention, without a word
        warnings.append(
            f"device: {' and '.join(kept_prefill)} kept from {base.name}, a GPU's prefill, "
            "beside this CPU's attention in local's time; xbench kernel --kernels prefill "
            "measures this device's"
        )
    wire_pattern = wire_regimes(probe) if not probe.empty else {}
    round_trips = rtt_errors(probe, fabrics)
    warm_round_trips = rtt_errors(probe, warm_refits(probe))
    _rtt_warnings(round_trips, warm_round_trips, wire_pattern, warnings)
    provenance = {
        "kind": "fit",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "schema_version": PROFILE_SCHEMA_VERSION,
        "run_ids": sorted({m.get("run_id", "?") for m in meta}),
        "hosts": sorted({h for m in meta for h in (m.get("hosts") or [m.get("hostname", "?")])}),
        "git_revisions": sorted({m.get("git_revision") or "?" for m in meta}),
        "device_notes": {k: (", ".join(v) if isinstance(v, list) else v) for k, v in notes.items()},
        "heldout_mape": {f.name: f.heldout_mape for f in fabrics if f.heldout_mape is not None},
        "wire_pattern": wire_pattern,
        "rtt_error": round_trips,
        "rtt_error_warm": warm_round_trips,
        "conditions": fitted,
    }
    if software:
        provenance["software"] = software
    if base is not None:
        provenance["base"] = base.name
    # the base's hardware ceilings hold a fit on that hardware's kind (a GPU's), not a CPU's
    ceilings = base.ceilings if base is not None and not on_cpu(fitted) else None
    fitted_terms = set(device_terms.BY_NAME) - set(notes.get("from_base", []))
    measured_fabrics = set(probe.fabric.unique()) if not probe.empty else set()
    profile, bound = mark_bounds(
        Profile(name, tuple(fabrics), device, provenance, ceilings),
        fitted_terms,
        measured_fabrics,
        _swept_model(kernel),
    )
    warnings.extend(bound)
    if warnings:
        provenance["warnings"] = list(warnings)
    return profile
