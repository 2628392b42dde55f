"""Every term and segment of every profile held to the hardware's ceilings
(``core.implied``), and a fit's coefficients at its own bounds or beyond a ceiling marked,
said in one line each, and flagged on the decisions that rest on them (``fit.bounds``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_fit import _probe_frame, noisy

from xbench.core.costmodel import Coef, Request, decide
from xbench.core.implied import PROTOCOL_EFFICIENCY, beyond_ceilings, implied_rates
from xbench.core.models import get_model
from xbench.core.profile import load_profile, save_profile
from xbench.fit.bounds import RATE_CAP, mark_bounds
from xbench.fit.profile_fit import fit_fabrics, fit_profile
from xbench.resources import profile_path, shipped_profiles

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

PRIORS = load_profile(profile_path("h100-priors"))
H200 = load_profile(profile_path("h200"))


def test_every_term_and_segment_of_every_shipped_profile_is_checked_and_passes():
    for name in shipped_profiles():
        profile = load_profile(profile_path(name))
        rates = implied_rates(profile)
        d = profile.device
        pieces = len(d.compute_segments) + len(d.move_segments) + len(d.splice_segments)
        # compute (memory and FLOP) a piece, merge, move and splice a piece, prefill's two;
        # every fabric's every segment and page rate
        expected = 2 * (1 + len(d.compute_segments)) + 1 + 2 + pieces - len(d.compute_segments)
        expected += 2 + sum(len(f.segments) + (f.block_beta is not None) for f in profile.fabrics)
        assert len(rates) == expected, name
        assert beyond_ceilings(profile) == [], [r.line() for r in beyond_ceilings(profile)]


def _with_device(profile, **terms):
    return dataclasses.replace(profile, device=dataclasses.replace(profile.device, **terms))


def test_each_kind_of_term_beyond_its_ceiling_is_caught():
    """A recompute at 0.5 us a token (2,426 TFLOP/s, past even the FP8 peak), an attention
    segment with no time per token (16 rows read KV faster than HBM3e), a TCP link at the
    raw line rate; and a page rate above the link."""
    ns = 1e-9
    segment = H200.device.compute_segments[0]
    cases = {
        "device recompute_per_token": _with_device(
            PRIORS, recompute_per_token=Coef(3e-6, 0.5e-6, 1e-5, "s/token", prior=True)
        ),
        "device compute_per_token (>= 11585 tokens)": _with_device(
            H200,
            compute_segments=(
                (segment[0], segment[1], Coef(0.0, 0.0, 0.092 * ns, "s/token"), segment[3]),
            ),
        ),
        "device move_per_token (>= 2896 tokens)": _with_device(
            H200,
            move_segments=((2896, Coef(2e-5, 2e-5, 2e-5, "s"), Coef(0.5 * ns, 0.5 * ns, ns, "s")),),
        ),
        "device recompute_per_token2": _with_device(
            PRIORS, recompute_per_token2=Coef(1e-11, 1e-11, 1e-11, "s/token^2")
        ),
    }
    tcp = PRIORS.fabric("tcp")
    line_rate = dataclasses.replace(
        tcp.segments[0], beta=Coef(12.5e9, 8e9, 12.5e9, "B/s", prior=True)
    )
    cases["fabric tcp beta (>= 0 B)"] = dataclasses.replace(
        PRIORS,
        fabrics=tuple(
            dataclasses.replace(f, segments=(line_rate,)) if f.name == "tcp" else f
            for f in PRIORS.fabrics
        ),
    )
    ib = PRIORS.fabric("ib")
    paged = dataclasses.replace(
        ib, block_t0=Coef(2e-5, 2e-5, 2e-5, "s"), block_beta=Coef(6e10, 6e10, 6e10, "B/s")
    )
    cases["fabric ib block_beta"] = dataclasses.replace(
        PRIORS, fabrics=tuple(paged if f.name == "ib" else f for f in PRIORS.fabrics)
    )
    for term, profile in cases.items():
        caught = [r.term for r in beyond_ceilings(profile)]
        assert caught == [term], (term, caught)
    # the TCP ceiling is the line rate less its framing, not the raw rate
    assert 0.93 < PROTOCOL_EFFICIENCY["tcp"] < 0.95


def test_the_prefills_matmuls_are_held_to_the_peak_of_the_weights_dtype():
    """DeepSeek-V3's weights are FP8: its prefill's 1.21 GFLOP a token and layer at 1.0 us
    is 1,213 TFLOP/s, past the H100's dense BF16 peak (989) but within its FP8 one (1,979);
    a BF16 model at that rate is caught, and a profile naming no FP8 peak holds FP8 to the
    BF16 one (the stricter check). Attention's FLOPs stay at the 16-bit rate."""
    fast = _with_device(PRIORS, recompute_per_token=Coef(3e-6, 1e-6, 1e-5, "s/token"))
    assert get_model("deepseek-v3.2").matmul_dtype == "fp8"
    assert beyond_ceilings(fast) == []
    bf16 = dataclasses.replace(get_model("deepseek-v3.2"), matmul_dtype="bf16")
    assert [r.term for r in beyond_ceilings(fast, bf16)] == ["device recompute_per_token"]
    no_fp8 = dataclasses.replace(
        fast, ceilings=dataclasses.replace(PRIORS.ceilings, matmul_fp8=None)
    )
    caught = beyond_ceilings(no_fp8)
    assert [r.term for r in caught] == ["device recompute_per_token"]
    assert "in FP8" in caught[0].line() and "989.0 TFLOP/s" in caught[0].line()
    rates = {r.term: r for r in implied_rates(PRIORS)}
    assert rates["device recompute_per_token"].ceiling == pytest.approx(1979e12)
    assert rates["device recompute_per_token2"].ceiling == pytest.approx(989e12)
    assert rates["device compute_per_row_token"].ceiling == pytest.approx(989e12)


def test_a_profile_keeps_its_fp8_peak_when_saved(tmp_path):
    saved = load_profile(save_profile(PRIORS, tmp_path / "p.toml"))
    assert saved.ceilings.matmul_fp8 == pytest.approx(1979e12)
    assert saved.ceilings.matmul_for("fp8") == pytest.approx(1979e12)
    assert saved.ceilings.matmul_for("bf16") == pytest.approx(989e12)


def _pages_that_do_not_grow(rng, o):
    """offgather whose times, less their overheads, shrink as the pages grow (a loaded
    machine's noise on few page counts): the slope's bound binds."""
    return [
        dict(
            pattern="offgather", fabric="ib", pair_class="inter-node", transport="mpi",
            size_bytes=k * 4096, blocks=k, block_bytes=4096, value=v * 1e6, warmup=False,
        )
        for k in (2, 4, 8)
        for v in noisy(30e-6 + k * o - k * 0.5e-6, rng, noise=0.002)
    ]  # fmt: skip


def test_a_fit_at_its_bounds_says_so_marks_the_terms_and_decide_flags_them(tmp_path):
    rng = np.random.default_rng(5)
    o = 0.4e-6
    frame = _probe_frame(rng, alpha=20e-6, beta=10e9, o=o)
    probe = pd.concat([frame, pd.DataFrame(_pages_that_do_not_grow(rng, o))], ignore_index=True)
    (ib,) = fit_fabrics(probe)
    assert ib.block_beta.value == pytest.approx(RATE_CAP)  # the fit's cap, as it happens
    probe["return_bytes"], probe["rows"] = np.nan, np.nan  # no round trips
    warnings = []
    profile = fit_profile(probe, pd.DataFrame(), name="t", base=PRIORS, warnings=warnings)
    fitted = profile.fabric("ib")
    assert fitted.block_beta.bound and fitted.block_beta.prior and fitted.prior
    assert "not measured" in fitted.block_beta.source
    said = [w for w in warnings if "block_beta" in w]
    assert len(said) == 1 and "marked bound" in said[0] and "\n" not in said[0]
    # the mark survives the file, and a decision that pages over ib rests on it
    path = save_profile(profile, tmp_path / "t.toml")
    again = load_profile(path)
    assert again.fabric("ib").block_beta.bound
    paged = Request(rows=1, heads=16, chunk_tokens=4096, segments=64, fabric="ib")
    assert decide(again, paged).prior


def test_each_bound_is_marked_once_with_one_line():
    """alpha at 0, a rate at its cap, a per-token device term at 0 (flat and a piece), and
    a term beyond a ceiling: each marked, each one line; priors and base terms untouched."""
    ib = PRIORS.fabric("ib")
    fitted_ib = dataclasses.replace(
        ib,
        overhead=Coef(1e-6, 1e-6, 1e-6, "s"),
        segments=(
            dataclasses.replace(
                ib.segments[0],
                alpha=Coef(0.0, 0.0, 1e-6, "s"),
                beta=Coef(RATE_CAP, 1e9, RATE_CAP, "B/s"),
            ),
        ),
    )
    segment = H200.device.compute_segments[0]
    zero = Coef(0.0, 0.0, 1e-10, "s/token")
    device = dataclasses.replace(
        H200.device,
        move_per_token=zero,
        compute_segments=((segment[0], segment[1], zero, segment[3]),),
        compute_per_row_token=Coef(1e-13, 1e-13, 1e-13, "s/row-token"),  # 21,760 TFLOP/s
    )
    profile = dataclasses.replace(
        H200,
        fabrics=tuple(fitted_ib if f.name == "ib" else f for f in H200.fabrics),
        device=device,
    )
    fitted = {"move_per_token", "compute_per_token", "compute_per_row_token"}
    marked, lines = mark_bounds(profile, fitted)
    f = marked.fabric("ib")
    assert f.segments[0].alpha.bound and f.segments[0].beta.bound and not f.overhead.bound
    d = marked.device
    assert d.move_per_token.bound and d.compute_segments[0][2].bound
    assert d.compute_per_row_token.bound  # beyond the matmul ceiling
    assert not d.compute_t0.bound and not d.recompute_per_token.bound
    assert len(lines) == 5 and all("\n" not in line for line in lines), lines
    assert sum("compute_per_row_token" in line and "impossible" in line for line in lines) == 1
    assert mark_bounds(H200, set())[1] == []  # a shipped profile has nothing to mark


def test_a_profile_says_prior_and_bound_as_true_or_false(tmp_path):
    text = Path(profile_path("h100-priors")).read_text()
    bad = text.replace("prior = true, source", 'prior = "yes", source', 1)
    (tmp_path / "bad.toml").write_text(bad)
    from xbench.core.profile import ProfileError

    with pytest.raises(ProfileError, match="true or false"):
        load_profile(tmp_path / "bad.toml")


def test_what_a_fit_took_from_its_base_is_never_marked_and_the_sweeps_model_sets_the_check():
    """A base's fabrics and pieces (a time at 0 there is the base's to answer for) stay as
    they are; the ceiling check reads the swept model's bytes: v4-flash reads 528 B of KV
    a token, where DeepSeek-V3.2's 1152 B would call its attention faster than HBM."""
    from xbench.core.models import get_model

    ib = PRIORS.fabric("ib")
    zero_alpha = dataclasses.replace(
        ib, segments=(dataclasses.replace(ib.segments[0], alpha=Coef(0.0, 0.0, 1e-6, "s")),)
    )
    segment = H200.device.compute_segments[0]
    base = dataclasses.replace(
        H200,
        fabrics=tuple(zero_alpha if f.name == "ib" else f for f in H200.fabrics),
        device=dataclasses.replace(
            H200.device,
            compute_segments=(
                (segment[0], segment[1], Coef(0.0, 0.0, 1e-10, "s/token"), segment[3]),
            ),  # fmt: skip
        ),
    )
    marked, lines = mark_bounds(base, set(), set())
    assert lines == [] and marked == base
    # 528 B a token at 80 % of 4.8 TB/s: possible for v4-flash, not for 1152 B a token
    fast = Coef(528 / 3.84e12, 528 / 3.84e12, 1e-9, "s/token")
    fitted = dataclasses.replace(
        H200, device=dataclasses.replace(H200.device, compute_per_token=fast)
    )
    _, default = mark_bounds(fitted, {"compute_per_token"}, set())
    _, flash = mark_bounds(fitted, {"compute_per_token"}, set(), get_model("deepseek-v4-flash"))
    assert any("compute_per_token implies" in line for line in default), default
    assert not any("compute_per_token implies" in line for line in flash), flash


def test_a_prefill_calls_fixed_time_is_paid_once_a_call_and_a_layer():
    """recompute_t0: a layer's prefill call costs it however few its tokens; decide's local
    pays it once a layer, a prefill after cached tokens once (the pairs are the new tokens'
    with all they attend), and a profile keeps it."""
    from xbench.core.parts import prefill_time, step_parts

    t0 = Coef(40e-6, 20e-6, 80e-6, "s", prior=True)
    with_t0 = _with_device(PRIORS, recompute_t0=t0)
    d, plain = with_t0.device, PRIORS.device
    assert d.recompute(1000) == pytest.approx(plain.recompute(1000) + 40e-6, rel=1e-12)
    p1, p2 = plain.recompute_per_token.value, plain.recompute_per_token2.value
    assert d.recompute(1000, 3000) == pytest.approx(
        40e-6 + 1000 * p1 + (4000**2 - 3000**2) * p2, rel=1e-12
    )
    assert prefill_time(d, 1000, 3000, layers=61, gpus=8) == pytest.approx(
        61 * d.recompute(1000, 3000) / 8, rel=1e-12
    )
    request = Request(rows=1, heads=16, chunk_tokens=4096, payload_bytes=1152, layers=61)
    local = decide(with_t0, request).t_local
    assert local == pytest.approx(decide(PRIORS, request).t_local + 61 * 40e-6, rel=1e-9)
    assert step_parts(with_t0, request).phases()["local"]["recompute"] == pytest.approx(
        61 * d.recompute(4096), rel=1e-12
    )
    # each end of the intervals reads its own end of t0
    from xbench.core.costmodel import HIGH, LOW, DeviceTerms

    assert DeviceTerms(*d.terms(LOW)).recompute_t0 == 20e-6
    assert DeviceTerms(*d.terms(HIGH)).recompute_t0 == 80e-6


def test_the_prefill_fit_reads_the_calls_fixed_time_unscaled_by_heads():
    from xbench.fit.profile_fit import _fit_prefill

    rng = np.random.default_rng(0)
    t0, a1, a2 = 30e-6, 2e-9, 5e-13  # per head swept: 16 of the model's 128
    rows = []
    for length in (256, 512, 1024, 2048, 4096, 8192):
        for _ in range(5):
            seconds = t0 + 16 * (a1 * length + a2 * length**2)
            rows.append(
                dict(model="deepseek-v3.2", heads=16, chunk_tokens=length,
                     value=seconds * 1e6 * rng.normal(1, 0.003))
            )  # fmt: skip
    terms, notes = {}, {}
    _fit_prefill(terms, notes, pd.DataFrame(rows), pd.DataFrame({"kernel": []}))
    assert terms["recompute_t0"].value == pytest.approx(t0, rel=0.05)
    assert terms["recompute_per_token2"].value == pytest.approx(128 * a2, rel=0.05)
    assert terms["recompute_t0"].low <= terms["recompute_t0"].value <= terms["recompute_t0"].high


def test_a_profile_keeps_a_prefill_calls_fixed_time(tmp_path):
    t0 = Coef(40e-6, 20e-6, 80e-6, "s", prior=True, source="a measured launch")
    saved = load_profile(save_profile(_with_device(PRIORS, recompute_t0=t0), tmp_path / "p.toml"))
    assert saved.device.recompute_t0.value == pytest.approx(40e-6)
    assert saved.device.recompute_t0.prior
    assert saved.device.recompute(100) == pytest.approx(PRIORS.device.recompute(100) + 40e-6)
