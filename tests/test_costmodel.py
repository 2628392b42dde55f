"""The cost model and predicate: closed forms vs numeric evaluation, grid vs scalar, priors."""

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from xbench.core.costmodel import (
    HIGH,
    LOW,
    Coef,
    Device,
    Fabric,
    Profile,
    Request,
    Segment,
    break_evens,
    decide,
    thresholds,
    times,
)
from xbench.core.grid import decide_grid
from xbench.core.parts import phase_times
from xbench.core.profile import load_profile

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

PRIORS = "profiles/h100-priors.toml"


def c(v, spread=0.0, unit="s"):
    return Coef(v, v * (1 - spread), v * (1 + spread), unit)


def one_segment_profile(
    alpha,
    beta,
    o,
    t0,
    per_token,
    per_row_token,
    move0,
    move1,
    splice=None,
    spread=0.0,
    pages=None,
    wait=None,
    saving=None,
):
    """One fabric, one device; ``splice`` = (t0, per_token) of T_splice, or None; ``pages``
    = (block_t0, block_beta) of a fetch page by page, or None; ``wait`` = (t0,
    per_row_partial, tau) of route's merge after its wait, or None; ``saving`` = [(tokens,
    seconds)] a fetch's first attention saves on its spliced chunk (may be negative), or None."""
    fabric = Fabric(
        "ib",
        (Segment(0.0, c(alpha, spread), c(beta, spread, "B/s")),),
        c(o, spread),
        block_t0=None if pages is None else c(pages[0], spread),
        block_beta=None if pages is None else c(pages[1], spread, "B/s"),
    )
    device = Device(
        "d",
        c(t0, spread),
        c(per_token, spread, "s/token"),
        c(per_row_token, spread, "s/row-token"),
        c(1e-6, spread),
        c(1e-10, spread, "s/row-partial"),
        c(move0, spread),
        c(move1, spread, "s/token"),
        splice_t0=None if splice is None else c(splice[0], spread),
        splice_per_token=None if splice is None else c(splice[1], spread, "s/token"),
        merge_per_token=c(1e-9, spread, "s/token"),
        merge_wait_t0=None if wait is None else c(wait[0], spread),
        merge_wait_per_row_partial=None if wait is None else c(wait[1], spread, "s/row-partial"),
        merge_wait_tau=None if wait is None else c(wait[2], spread),
        spliced_saving=tuple(
            (float(t), Coef(v, v - abs(v) * spread, v + abs(v) * spread, "s"))
            for t, v in (saving or ())
        ),
    )
    return Profile("p", (fabric,), device)


coefs = st.fixed_dictionaries(
    {
        "alpha": st.floats(1e-7, 1e-4),
        "beta": st.floats(1e8, 1e12),
        "o": st.floats(0, 1e-5),
        "t0": st.floats(0, 1e-3),
        "per_token": st.floats(0, 1e-7),
        "per_row_token": st.floats(0, 1e-9),
        "move0": st.floats(0, 1e-2),
        "move1": st.floats(0, 1e-7),
        "splice": st.none() | st.tuples(st.floats(0, 1e-2), st.floats(0, 1e-7)),
        "pages": st.none() | st.tuples(st.floats(0, 1e-4), st.floats(1e8, 1e12)),
        "wait": st.none() | st.tuples(st.floats(0, 1e-3), st.floats(0, 1e-9), st.floats(1e-5, 0.1)),
        "saving": st.none()
        | st.lists(
            st.tuples(st.integers(1, 65536), st.floats(-1e-4, 1e-3)),
            min_size=1,
            max_size=4,
            unique_by=lambda point: point[0],
        ),
    }
)
shapes = st.fixed_dictionaries(
    {
        "heads": st.integers(1, 128),
        "chunk_tokens": st.integers(1, 65536),
        "payload_bytes": st.integers(64, 4096),
        "return_bytes": st.integers(64, 4096),
        "kv_bytes_per_token": st.integers(64, 2048),
        "segments": st.integers(1, 64),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes)
def test_b_star_separates_route_from_fetch(k, shape):
    # without the merge-wait terms route's and fetch's merges cancel: b* is exact at any rows
    profile = one_segment_profile(**{**k, "wait": None})
    f, dev = profile.fabrics[0], profile.device
    b_star, _ = thresholds(f, dev, Request(rows=1, **shape))
    assume(math.isfinite(b_star) and 2 <= b_star <= 1e6)
    for b, route_wins in ((math.floor(b_star * 0.999), True), (math.ceil(b_star * 1.001), False)):
        assume(b >= 1)
        route, fetch, _ = times(f, dev, Request(rows=b, **shape))
        assert (route < fetch) == route_wins, (b, b_star, route, fetch)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes, st.integers(1, 4096))
def test_b_star_at_the_requests_rows_says_which_side_it_is_on(k, shape, rows):
    """With route's merge after a wait, route and fetch differ by a merge that grows with the
    rows: b* is the crossing of the line through the request's own rows, so it says on which
    side that request lies (not where the crossing is for others)."""
    assume(k["wait"] is not None)
    profile = one_segment_profile(**k)
    f, dev = profile.fabrics[0], profile.device
    request = Request(rows=rows, **shape)
    b_star, _ = thresholds(f, dev, request)
    route, fetch, _ = times(f, dev, request)
    assume(abs(route - fetch) > 1e-9 * max(route, fetch))
    assert (route < fetch) == (rows < b_star), (rows, b_star, route, fetch)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes, st.integers(1, 64))
def test_u_star_separates_fetch_with_reuse(k, shape, rows):
    profile = one_segment_profile(**k)
    f, dev = profile.fabrics[0], profile.device
    _assert_u_star_separates(f, dev, Request(rows=rows, **shape))


def _assert_u_star_separates(f, dev, base) -> None:
    """Just below u* uses route wins, just above fetch does (u* kept to 2-1e6 uses)."""
    _, u_star = thresholds(f, dev, base)
    assume(math.isfinite(u_star) and 2 <= u_star <= 1e6)
    for uses, fetch_wins in (
        (math.floor(u_star * 0.999), False),
        (math.ceil(u_star * 1.001), True),
    ):
        assume(uses >= 1)
        route, fetch, _ = times(f, dev, base._replace(reuse=uses - 1))
        assert (fetch < route) == fetch_wins, (uses, u_star, route, fetch)


@settings(max_examples=60, deadline=None)
@given(
    coefs,
    st.floats(0.0, 0.5),
    st.lists(
        st.tuples(
            st.integers(1, 512), st.integers(1, 20000), st.integers(0, 50), st.integers(1, 8)
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_grid_equals_scalar(k, spread, requests):
    profile = one_segment_profile(**k, spread=spread)
    grid = pd.DataFrame(requests, columns=["rows", "chunk_tokens", "reuse", "segments"])
    out = decide_grid(profile, grid)
    for row, segments in zip(out.itertuples(), grid.segments, strict=True):
        req = Request(
            rows=row.rows, chunk_tokens=row.chunk_tokens, reuse=row.reuse, segments=segments
        )
        d = decide(profile, req)
        assert (d.choice, d.uncertain, d.ranked_by, d.prior) == (
            row.decision,
            row.uncertain,
            row.ranked_by,
            row.prior,
        )
        assert d.t_route == pytest.approx(row.t_route, rel=1e-12) and d.t_fetch == pytest.approx(
            row.t_fetch, rel=1e-12
        )


def test_a_fetch_sent_block_by_block_pays_the_splice_not_the_gather():
    k = dict(alpha=1e-6, beta=1e10, o=2e-7, t0=1e-5, per_token=1e-9, per_row_token=0.0)
    packed_only = one_segment_profile(**k, move0=5e-6, move1=4e-9)
    both = one_segment_profile(**k, move0=5e-6, move1=4e-9, splice=(2e-6, 1e-9))
    f = both.fabrics[0]
    assert both.device.move(1000) == pytest.approx(5e-6 + 4e-6)
    assert both.device.move(1000, segments=16) == pytest.approx(2e-6 + 1e-6)
    assert packed_only.device.move(1000, segments=16) == packed_only.device.move(1000)
    packed = decide(both, Request(rows=1, chunk_tokens=1000))
    paged = decide(both, Request(rows=1, chunk_tokens=1000, segments=16))
    # 15 more messages cost 15 o; T_splice (3 us) replaces T_move (9 us)
    assert paged.t_fetch - packed.t_fetch == pytest.approx(15 * 2e-7 - (9e-6 - 3e-6))
    fallback = decide(packed_only, Request(rows=1, chunk_tokens=1000, segments=16))
    assert fallback.t_fetch - packed.t_fetch == pytest.approx(15 * 2e-7)
    b_star, _ = thresholds(f, both.device, Request(rows=1, chunk_tokens=1000, segments=16))
    b_packed, _ = thresholds(f, both.device, Request(rows=1, chunk_tokens=1000))
    assert b_star < b_packed  # a cheaper fetch leaves route fewer batch sizes


def test_piecewise_fabric_uses_the_segment_of_each_size():
    f = Fabric(
        "shm",
        (Segment(0, c(1e-6), c(1e9, unit="B/s")), Segment(8192, c(4e-6), c(1e10, unit="B/s"))),
        c(0.0),
    )
    assert f.wire(1000) == pytest.approx(1e-6 + 1000 / 1e9)
    assert f.wire(100000) == pytest.approx(4e-6 + 100000 / 1e10)
    assert f.wire(100000, messages=3) == pytest.approx(4e-6 + 100000 / 1e10)  # o = 0


def test_uncertain_only_where_the_intervals_allow_the_other_answer():
    k = dict(
        alpha=2e-6,
        beta=5e10,
        o=1e-7,
        t0=1e-5,
        per_token=1e-9,
        per_row_token=1e-12,
        move0=1e-4,
        move1=1e-9,
    )
    shape = dict(heads=16, chunk_tokens=64)
    exact = one_segment_profile(**k, spread=0.0)
    b_star, _ = thresholds(exact.fabrics[0], exact.device, Request(rows=1, **shape))
    near, far = max(1, round(b_star)), 1
    assert b_star > 20
    assert not decide(exact, Request(rows=near, **shape)).uncertain  # zero-width intervals: never
    loose = one_segment_profile(**k, spread=0.3)
    assert decide(
        loose, Request(rows=near, **shape)
    ).uncertain  # at the tie, 30 % intervals allow both
    tight = one_segment_profile(**k, spread=0.01)
    assert not decide(
        tight, Request(rows=far, **shape)
    ).uncertain  # far from the tie, 1 % cannot flip it


@settings(max_examples=300, deadline=None)
@given(
    coefs,
    shapes,
    st.integers(1, 512),
    st.integers(0, 20),
    st.floats(0.0, 0.6),
    st.floats(0.0, 1e-6),
    st.none() | st.floats(1e-9, 1e-5),
)
def test_uncertain_is_what_the_intervals_say_whichever_check_decides(
    k, shape, rows, reuse, spread, w1_high, recompute
):
    """decide()'s verdict is the exact intervals' one, with coefficients fitted at ~0 over
    a wide interval (as a CPU fit leaves route's merge-wait per row-partial), fetch's saving
    subtracted, and local with a known recompute cost or none."""
    profile = one_segment_profile(**k, spread=spread)
    device = profile.device
    if device.merge_wait_tau is not None:
        wide = Coef(1e-16, 0.0, w1_high, "s/row-partial")
        device = dataclasses.replace(device, merge_wait_per_row_partial=wide)
    if recompute is not None:
        cost = Coef(recompute, recompute / 3, recompute * 3, "s/token")
        device = dataclasses.replace(device, recompute_per_token=cost)
    profile = Profile("p", profile.fabrics, device)
    f = profile.fabrics[0]
    request = Request(rows=rows, reuse=reuse, **shape)
    d = decide(profile, request)
    win = ("route", "fetch", "local").index(d.choice)
    hi, lo = times(f, device, request, HIGH), times(f, device, request, LOW)
    assert d.uncertain == (hi[win] >= min(v for i, v in enumerate(lo) if i != win))


def test_priors_route_decode_on_every_fabric_and_prefer_the_device_initiated_one():
    """A decode row without reuse is routed on every fabric; the best fabric is the one
    whose small message costs least (overhead and latency together), and on one NIC the
    device-initiated path beats the host-initiated one (the study's premise: no kernel end
    and host post before each send)."""
    profile = load_profile(PRIORS)
    assert profile.rests_on_priors
    for f in profile.fabrics:
        d = decide(profile, Request(rows=1, heads=128, chunk_tokens=2048, fabric=f.name))
        assert d.choice == "route" and d.prior, f.name
    best = decide(profile, Request(rows=1, heads=128, chunk_tokens=2048))
    small = {f.name: f.overhead.value + f.segments[0].alpha.value for f in profile.fabrics}
    assert best.fabric == min(small, key=small.get) == "ibgda"
    on = {n: decide(profile, Request(1, 128, 2048, fabric=n)).t_route for n in ("ib", "ibgda")}
    assert on["ibgda"] < on["ib"]


def test_latency_not_bandwidth_picks_the_fabric_for_small_payloads():
    dev = one_segment_profile(1e-6, 1e10, 0, 1e-5, 0, 0, 1e-3, 0).device
    low_latency = Fabric("ib", (Segment(0, c(1e-6), c(2.5e10, unit="B/s")),), c(1e-7))
    high_bandwidth = Fabric("roce", (Segment(0, c(8e-6), c(1e11, unit="B/s")),), c(1e-7))
    profile = Profile("two", (low_latency, high_bandwidth), dev)
    small = decide(profile, Request(rows=1, heads=1, chunk_tokens=4096))
    assert (small.choice, small.fabric, small.ranked_by) == ("route", "ib", "latency")
    big = decide(profile, Request(rows=4096, heads=128, chunk_tokens=4096))
    assert big.fabric == "roce" and big.ranked_by == "bandwidth"


def test_cost_model_imports_without_mpi_torch_or_numpy():
    code = "import sys, xbench; p = xbench.load_profile('profiles/h100-priors.toml'); print(xbench.decide(p, xbench.Request()).choice); print(sorted(m for m in ('torch', 'mpi4py', 'numpy', 'pandas') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "route" and out[1] == "[]"


def test_reuse_amortises_fetch():
    profile = load_profile(PRIORS)
    base = Request(rows=1, heads=128, chunk_tokens=8192, fabric="ib")
    assert decide(profile, base).choice == "route"
    _, u_star = thresholds(profile.fabric("ib"), profile.device, base)
    heavy = Request(rows=1, heads=128, chunk_tokens=8192, fabric="ib", reuse=math.ceil(u_star))
    assert decide(profile, heavy).choice == "fetch"
    assert np.isclose(decide(profile, heavy).t_route, decide(profile, base).t_route)


def test_grid_blocks_on_threads_equal_one_thread_and_scalar_decide():
    """Several blocks, a fabric column naming some fabrics and leaving others open."""
    from xbench.core.grid import BLOCK

    profile = load_profile("profiles/h100-priors.toml")
    names = [f.name for f in profile.fabrics]
    rng = np.random.default_rng(5)
    n = 2 * BLOCK + 123
    grid = pd.DataFrame(
        {
            "rows": rng.integers(1, 512, n),
            "chunk_tokens": rng.integers(1, 20000, n),
            "reuse": rng.integers(0, 30, n),
            "fabric": pd.Series(rng.choice([*names, None], n), dtype="object"),
        }
    )
    one = decide_grid(profile, grid, threads=1)
    many = decide_grid(profile, grid, threads=3)
    pd.testing.assert_frame_equal(one, many)
    for i in rng.integers(0, n, 40):
        row = grid.iloc[i]
        fabric = row.fabric if isinstance(row.fabric, str) else None
        d = decide(
            profile,
            Request(
                rows=int(row.rows),
                chunk_tokens=int(row.chunk_tokens),
                reuse=int(row.reuse),
                fabric=fabric,
            ),
        )
        assert (d.choice, d.fabric, d.uncertain) == (
            one.decision[i],
            one.fabric_chosen[i],
            one.uncertain[i],
        )
        assert d.t_route == pytest.approx(one.t_route[i], rel=1e-12)


def _full_ranking(profile, request):
    """decide()'s fabric choice by brute force: every fabric, first of the fastest on ties."""
    best = None
    for f in profile.fabrics:
        route, fetch, local = times(f, profile.device, request)
        tw = min(route, fetch, local)
        if best is None or tw < best[0]:
            best = (tw, f.name, route, fetch)
    return best[1:]


# Coefficients from a small set, so that fabrics often tie or dominate one another exactly.
_alpha = st.sampled_from([1e-6, 2e-6, 5e-6, 2e-5])
_beta = st.sampled_from([1e9, 1.2e10, 5e10, 4.5e11])
_fabric_specs = st.lists(
    st.tuples(
        st.lists(st.tuples(_alpha, _beta), min_size=1, max_size=3),
        st.sampled_from([0.0, 5e-8, 3e-7, 3e-6]),
        st.lists(st.sampled_from([1024, 8192, 65536, 1 << 20]), min_size=2, max_size=2),
        st.none() | st.tuples(_alpha, _beta),  # page terms (probe -p offgather)
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(
    _fabric_specs,
    st.lists(
        st.tuples(
            st.integers(1, 512),
            st.integers(1, 32768),
            st.sampled_from([0, 1, 10, 1000]),
            st.sampled_from([None, 0.0, 1e-4, 3e-3]),
            st.booleans(),
            st.booleans(),
            st.sampled_from([1, 4, 64]),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_decide_over_all_fabrics_equals_the_full_ranking(specs, requests):
    """Skipping dominated fabrics never changes the answer: ties, local wins, probes included."""
    fabrics = []
    for i, (segs, o, breaks, pages) in enumerate(specs):
        starts = [0.0, *sorted(set(breaks))][: len(segs)]
        segs = segs[: len(starts)]  # two equal breaks leave room for two segments
        fabrics.append(
            Fabric(
                f"f{i}",
                tuple(
                    Segment(s, c(a), c(b, unit="B/s"))
                    for s, (a, b) in zip(starts, segs, strict=True)
                ),
                c(o),
                block_t0=None if pages is None else c(pages[0]),
                block_beta=None if pages is None else c(pages[1], unit="B/s"),
            )
        )
    base = one_segment_profile(1e-6, 1e10, 0, 1e-5, 1e-9, 1e-12, 1e-3, 1e-9)
    profile = Profile("p", tuple(fabrics), base.device)
    for rows, chunk, reuse, fetch_cost, blocks_local, probe, segments in requests:
        req = Request(
            segments=segments,
            rows=rows,
            heads=16,
            chunk_tokens=chunk,
            reuse=reuse,
            fetch_cost=fetch_cost,
            blocks_local=blocks_local,
            include_probe=probe,
        )
        d = decide(profile, req)
        assert (d.fabric, d.t_route, d.t_fetch) == _full_ranking(profile, req)


def test_a_fabric_with_faster_pages_is_ranked_even_where_its_segments_are_slower():
    """A fabric slower at every message size can still fetch page by page faster (its
    offgather terms): it stays a candidate, and a fetch of many pages picks it."""
    base = one_segment_profile(1e-6, 1e10, 0, 1e-5, 1e-9, 1e-12, 1e-3, 1e-9)
    fast = Fabric("ib", (Segment(0.0, c(1e-6), c(2e10, unit="B/s")),), c(1e-7))
    paged = Fabric(
        "roce",
        (Segment(0.0, c(2e-6), c(1e10, unit="B/s")),),
        c(1e-7),
        block_t0=c(1e-6),
        block_beta=c(4e10, unit="B/s"),
    )
    profile = Profile("p", (fast, paged), base.device)
    assert [f.name for f in profile.candidates] == ["ib", "roce"]
    req = Request(rows=4096, heads=16, chunk_tokens=4096, segments=64)
    assert decide(profile, req).fabric == "roce"
    assert decide(profile, Request(rows=4096, heads=16, chunk_tokens=4096)).fabric == "ib"
    with pytest.raises(ValueError, match="come together"):
        Fabric("ib", fast.segments, c(1e-7), block_t0=c(1e-6))


def test_dominated_fabrics_are_not_ranked():
    profile = load_profile(PRIORS)
    ranked = [f.name for f in profile.candidates]
    # ib, roce and tcp are slower than ibgda at every size (o: the host's post before each
    # send; alpha; beta): never the best fabric. nvlink's bandwidth wins large messages
    assert ranked == ["nvlink", "ibgda"]


def test_recompute_grows_with_the_square_of_the_chunk_and_local_reads_it():
    """T_recompute(c) = c p1 + c^2 p2 (attention's quadratic term, where the profile has
    it), the one formula decide's local option and the prefill simulation read."""
    from xbench.core.costmodel import Request, times

    prof = load_profile(PRIORS)
    d = prof.device
    p1, p2 = d.recompute_per_token.value, d.recompute_per_token2.value
    for c in (1024, 16384):
        assert d.recompute(c) == pytest.approx(c * p1 + c * c * p2)
        r = Request(rows=1, heads=16, chunk_tokens=c, fabric="ib")
        assert times(prof.fabric("ib"), d, r)[2] == pytest.approx(d.recompute(c) + d.compute(16, c))
    # per token, a long prefill costs more than a short one
    assert d.recompute(16384) / 16384 > d.recompute(1024) / 1024
    assert prof.device.prior_by_option[2]  # the quadratic prior marks local as resting on priors


def test_one_catalogue_of_device_terms_that_device_reader_and_writer_follow(tmp_path):
    """Every coefficient field of Device is a catalogue line and no line is missing a field;
    a profile holding every term writes each in its catalogue unit and reads back equal;
    the terms that come together are refused apart, whichever group."""
    from xbench.core import device_terms
    from xbench.core.profile import save_profile
    from xbench.files import tomllib  # (tomli before Python 3.11)

    coef_fields = {
        f.name
        for f in dataclasses.fields(Device)
        if f.init and "Coef" in str(f.type) and not f.name.endswith("segments")
    }
    assert coef_fields == {t.name for t in device_terms.TERMS}
    prior = load_profile(PRIORS)
    every = dict.fromkeys(
        (t.name for t in device_terms.TERMS), Coef(2e-6, 1e-6, 4e-6, "s", prior=True)
    )
    device = dataclasses.replace(prior.device, **every)
    path = save_profile(dataclasses.replace(prior, device=device), tmp_path / "all.toml")
    written = tomllib.loads(path.read_text())["device"]
    assert {t.name: t.shown for t in device_terms.TERMS} == {
        name: written[name]["unit"] for name in device_terms.BY_NAME
    }
    back = load_profile(str(path)).device
    for term in device_terms.TERMS:
        got, want = getattr(back, term.name), getattr(device, term.name)
        assert math.isclose(got.value, want.value, rel_tol=1e-12), term
        assert math.isclose(got.high, want.high, rel_tol=1e-12), term
    for names in device_terms.TOGETHER.values():
        for name in names:
            with pytest.raises(ValueError, match="come together"):
                dataclasses.replace(device, **{name: None})


def test_every_shipped_term_has_a_source_and_no_term_beats_the_hardware_it_names():
    """Each coefficient of each shipped profile says where its value comes from (a prior its
    own source; a measured term the run it was fitted from, as decide --sources shows it),
    each profile names its hardware's ceilings, and no term's fast end implies a bandwidth
    or a FLOP rate above them; the priors that did (a move at 1.5 ps a token, 768 TB/s; a
    merge at 1 ps a row-partial) are caught."""
    from xbench.cli.terms import coefficient_frame
    from xbench.core import device_terms
    from xbench.core.implied import implied_rates
    from xbench.resources import profile_path, shipped_profiles

    shipped = [profile_path(name) for name in shipped_profiles()]
    assert {"h100-priors", "h200"} <= set(shipped_profiles())
    for path in shipped:
        profile = load_profile(path)
        assert profile.ceilings is not None, path
        coefs = [f.overhead for f in profile.fabrics]
        coefs += [c for f in profile.fabrics for s in f.segments for c in (s.alpha, s.beta)]
        coefs += [c for t in device_terms.TERMS if (c := getattr(profile.device, t.name))]
        assert all(c.source or not c.prior for c in coefs), [c for c in coefs if not c.source]
        shown = coefficient_frame(profile)
        assert len(shown) >= len(coefs) and shown.source.str.len().gt(0).all(), path
        rates = implied_rates(profile)
        assert len(rates) >= 5 + len(profile.fabrics)
        assert all(r.within for r in rates), [r for r in rates if not r.within]
    profile = load_profile(PRIORS)
    impossible = dataclasses.replace(
        profile.device,
        move_per_token=Coef(1.5e-12, 1e-12, 5e-12, "s/token", prior=True),
        merge_per_row_partial=Coef(1e-12, 0.5e-12, 3e-12, "s/row-partial", prior=True),
    )
    caught = {
        r.term
        for r in implied_rates(dataclasses.replace(profile, device=impossible))
        if not r.within
    }
    assert caught == {"device move_per_token", "device merge_per_row_partial"}


# ---------------------------------------------------------------------------------------
# A decode step: L layers, the chunk on k holders, route's round trip pipelined or not.
# ---------------------------------------------------------------------------------------

steps = st.tuples(st.integers(1, 96), st.integers(1, 8), st.booleans())


def test_a_step_pays_route_per_layer_and_moves_every_layers_kv_once():
    """The accounting written out by hand on one fabric and one device (no merge-wait,
    no saving): route L times its round trip, attention and merge; fetch one message of
    L layers' KV, L moves; local L attentions; pipelined route one round trip."""
    alpha, beta, o = 2e-6, 1e10, 1e-6
    profile = one_segment_profile(alpha, beta, o, 5e-6, 1e-9, 1e-12, 3e-5, 2e-9)
    f, dev = profile.fabrics[0], profile.device
    layers, rows, chunk, heads = 61, 4, 2048, 16
    one = Request(rows=rows, chunk_tokens=chunk, heads=heads)
    step = one._replace(layers=layers)
    R = rows * heads
    t_c = dev.compute(R, chunk)
    t_m = dev.merge(R, 2, chunk)
    s_q, s_o, s_kv = R * one.payload_bytes, R * one.return_bytes, chunk * one.kv_bytes_per_token
    round_trip = 2 * alpha + 2 * o + (s_q + s_o) / beta
    route, fetch, local = times(f, dev, step)
    assert route == pytest.approx(layers * (t_c + t_m + round_trip), rel=1e-12)
    moved = alpha + o + layers * s_kv / beta + layers * dev.move(chunk)
    assert fetch == pytest.approx(moved + layers * (t_c + t_m), rel=1e-12)
    assert local == pytest.approx(layers * (t_c + dev.recompute(chunk)), rel=1e-12)
    piped, _, _ = times(f, dev, step._replace(pipeline_layers=True))
    assert piped == pytest.approx(layers * (t_c + t_m) + round_trip, rel=1e-12)


def test_holders_split_the_attention_and_multiply_the_messages():
    """k holders: each attends c / k at once, the requester sends k queries (k overheads on
    its link) and merges k + 1 partials; the k answers, and a fetch's k shares, are sent by
    their holders at once (one overhead) and come in through the requester's link."""
    alpha, beta, o = 2e-6, 1e10, 1e-6
    profile = one_segment_profile(alpha, beta, o, 5e-6, 1e-9, 1e-12, 3e-5, 2e-9)
    f, dev = profile.fabrics[0], profile.device
    k, rows, chunk, heads = 4, 2, 8192, 8
    r = Request(rows=rows, chunk_tokens=chunk, heads=heads, holders=k)
    R = rows * heads
    s_q, s_o, s_kv = R * r.payload_bytes, R * r.return_bytes, chunk * r.kv_bytes_per_token
    route, fetch, _ = times(f, dev, r)
    wire = 2 * alpha + (k + 1) * o + k * (s_q + s_o) / beta
    assert route == pytest.approx(
        dev.compute(R, chunk / k) + dev.merge(R, k + 1, chunk) + wire, rel=1e-12
    )
    moved = alpha + o + s_kv / beta + dev.move(chunk)
    assert fetch == pytest.approx(moved + dev.compute(R, chunk) + dev.merge(R, 2, chunk), rel=1e-12)
    phases = phase_times(f, dev, r)
    assert sum(phases["route"].values()) == pytest.approx(route, rel=1e-12)
    assert sum(phases["fetch"].values()) == pytest.approx(fetch, rel=1e-12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes, st.integers(1, 4096), steps)
def test_b_star_over_a_step_says_which_side_the_request_is_on(k, shape, rows, step):
    """b* at the request's own rows (the attention of a holder's share and the merge of
    k + 1 partials grow with the rows), over L layers and k holders, pipelined or not."""
    layers, holders, pipelined = step
    profile = one_segment_profile(**k)
    f, dev = profile.fabrics[0], profile.device
    request = Request(rows=rows, layers=layers, holders=holders, pipeline_layers=pipelined, **shape)
    b_star, _ = thresholds(f, dev, request)
    route, fetch, _ = times(f, dev, request)
    assume(abs(route - fetch) > 1e-9 * max(route, fetch))
    assert (route < fetch) == (rows < b_star), (rows, b_star, route, fetch)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes, st.integers(1, 64), steps)
def test_u_star_over_a_step_separates_fetch_with_reuse(k, shape, rows, step):
    layers, holders, pipelined = step
    profile = one_segment_profile(**k)
    f, dev = profile.fabrics[0], profile.device
    base = Request(rows=rows, layers=layers, holders=holders, pipeline_layers=pipelined, **shape)
    _assert_u_star_separates(f, dev, base)


@settings(max_examples=60, deadline=None)
@given(
    coefs,
    st.floats(0.0, 0.5),
    st.lists(
        st.tuples(st.integers(1, 512), st.integers(1, 20000), st.integers(0, 50), steps),
        min_size=1,
        max_size=20,
    ),
)
def test_grid_equals_scalar_over_steps(k, spread, requests):
    profile = one_segment_profile(**k, spread=spread)
    grid = pd.DataFrame(
        [(b, c, r, *step) for b, c, r, step in requests],
        columns=["rows", "chunk_tokens", "reuse", "layers", "holders", "pipeline_layers"],
    )
    out = decide_grid(profile, grid)
    for row in out.itertuples():
        req = Request(
            rows=row.rows, chunk_tokens=row.chunk_tokens, reuse=row.reuse, layers=row.layers,
            holders=row.holders, pipeline_layers=bool(row.pipeline_layers),
        )  # fmt: skip
        d = decide(profile, req)
        assert (d.choice, d.uncertain, d.ranked_by, d.prior) == (
            row.decision, row.uncertain, row.ranked_by, row.prior,
        )  # fmt: skip
        assert d.t_route == pytest.approx(row.t_route, rel=1e-12)
        assert d.t_fetch == pytest.approx(row.t_fetch, rel=1e-12)
        b_star, u_star = thresholds(profile.fabrics[0], profile.device, req)
        assert b_star == pytest.approx(row.b_star, rel=1e-12)
        assert u_star == pytest.approx(row.u_star, rel=1e-12)
        payload_star, move_star = break_evens(profile.fabrics[0], profile.device, req)
        assert payload_star == pytest.approx(row.payload_star, rel=1e-12)
        assert move_star == pytest.approx(row.fetch_cost_star, rel=1e-9, abs=1e-15)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(coefs, shapes, st.integers(1, 512), st.sampled_from([0, 1, 10]), steps)
def test_the_break_even_points_say_where_route_and_fetch_trade_places(k, shape, rows, reuse, step):
    """F*: fetch wins exactly while a layer's move costs less (fetch is linear in it, route
    does not read it). P*: at the request's own payload, route wins exactly when its routed
    bytes a row are below P* (with the merge-wait terms the crossing of others moves)."""
    layers, holders, pipelined = step
    profile = one_segment_profile(**k)
    f, dev = profile.fabrics[0], profile.device
    request = Request(
        rows=rows, reuse=reuse, layers=layers, holders=holders, pipeline_layers=pipelined,
        **shape,
    )  # fmt: skip
    payload_star, move_star = break_evens(f, dev, request)
    route, fetch, _ = times(f, dev, request)
    assume(abs(route - fetch) > 1e-9 * max(route, fetch))
    routed = request.payload_bytes + request.return_bytes
    assert (route < fetch) == (routed < payload_star), (routed, payload_star, route, fetch)
    assume(math.isfinite(move_star) and move_star > 1e-9)
    for move, fetch_wins in ((move_star * 0.999, True), (move_star * 1.001, False)):
        route, fetch, _ = times(f, dev, request._replace(fetch_cost=move))
        assume(abs(route - fetch) > 1e-9 * max(route, fetch))
        assert (fetch < route) == fetch_wins, (move, move_star, route, fetch)


@settings(max_examples=200, deadline=None)
@given(coefs, shapes, st.integers(1, 512), steps)
def test_wire_parts_add_up_to_the_wire(k, shape, rows, step):
    """The terms the by column compares are the wire's, grouped by coefficient."""
    from xbench.core.costmodel import SCALAR, Step, wire_costs, wire_parts

    f = one_segment_profile(**k).fabrics[0]
    r = Request(rows=rows, **shape)
    s_q, s_o = rows * r.heads * r.payload_bytes, rows * r.heads * r.return_bytes
    s_kv = r.chunk_tokens * r.kv_bytes_per_token
    layers, holders, pipelined = step
    route_wire, fetch_wire, _ = wire_costs(
        SCALAR, f.breaks, f.terms(), s_q, s_o, s_kv, r.segments, layers, holders
    )
    route, fetch = wire_parts(SCALAR, f.breaks, f.terms(), s_q, s_o, s_kv, r.segments, Step(*step))
    assert sum(route) == pytest.approx((1 if pipelined else layers) * route_wire, rel=1e-12)
    assert sum(fetch) == pytest.approx(fetch_wire, rel=1e-12)


def test_by_names_the_term_that_separated_the_fabrics():
    """Two undominated fabrics, each better at one term: the by column names the term the
    runner-up pays most over the chosen fabric; where local wins it names none, and a fabric
    alone is ranked by the largest of its own terms."""
    dev = one_segment_profile(1e-6, 1e10, 0, 1e-5, 0, 0, 1e-3, 0).device

    def fabric(name, alpha=1e-6, beta=2.5e10, o=1e-7):
        return Fabric(name, (Segment(0, c(alpha), c(beta, unit="B/s")),), c(o))

    small = Request(rows=1, heads=1, chunk_tokens=4096)
    big = Request(rows=4096, heads=128, chunk_tokens=4096)
    for first, second, request, term in (
        # a proxy's o against a longer latency (NCCL against IBGDA)
        (fabric("a", alpha=2e-6), fabric("b", o=4e-6), small, "overhead"),
        (fabric("a"), fabric("b", alpha=8e-6, beta=1e11), small, "latency"),
        (fabric("a", alpha=8e-6, beta=1e11), fabric("b"), big, "bandwidth"),
    ):
        profile = Profile("two", (first, second), dev)
        assert len(profile.candidates) == 2
        d = decide(profile, request)
        assert (d.fabric, d.ranked_by) == ("a", term)
    alone = decide(Profile("one", (fabric("a", o=4e-6),), dev), small)
    assert alone.ranked_by == "overhead"  # 2 x 4 us of o against 2 us of alpha
    two = Profile("two", (fabric("a"), fabric("b", alpha=8e-6, beta=1e11)), dev)
    here = decide(two, small._replace(blocks_local=True))
    assert (here.choice, here.ranked_by) == ("local", "none")


def test_a_grid_of_defaults_needs_no_column():
    """A grid naming only fabrics (every request field at its default) is all constants
    once compiled: its answers are decide()'s, row by row; an empty grid answers nothing."""
    profile = load_profile(PRIORS)
    fabrics = [None, "ib", "nvlink"]
    out = decide_grid(profile, pd.DataFrame({"fabric": fabrics}))
    for fabric, row in zip(fabrics, out.itertuples(), strict=True):
        d = decide(profile, Request(fabric=fabric))
        assert (d.choice, d.fabric, d.ranked_by, d.uncertain) == (
            row.decision, row.fabric_chosen, row.ranked_by, row.uncertain,
        )  # fmt: skip
        assert d.t_route == row.t_route and d.t_fetch == row.t_fetch
    assert decide_grid(profile, pd.DataFrame({"rows": pd.Series([], dtype=int)})).empty
