"""decide()'s native form (xbench.core.native_code) against its Python form, to the bit."""

import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_costmodel import coefs, one_segment_profile, shapes
from test_tracing import _on_floats, _same

from xbench.core import native_code
from xbench.core.costmodel import Request, decide
from xbench.core.profile import load_profile

pytestmark = [
    pytest.mark.nompi,  # starts no MPI (conftest: the Open MPI run skips it)
    pytest.mark.skipif(
        not native_code.available(),
        reason="the native predicate needs gcc and Python's headers (python3-dev)",
    ),
]
PROFILES = (
    "profiles/h100-priors.toml",
    "tests/data/vm-cpu-profile.toml",
    "tests/data/engine-fixture.toml",
)
# request shapes (each a function of its own): the fetch's move given or modelled, the
# probe and a locally held chunk counted, one layer or a step over holders, pipelined
SHAPES = (
    {},
    {"fetch_cost": 3e-3, "include_probe": True},
    {"blocks_local": True, "segments": 16},
    {"layers": 61, "holders": 3, "pipeline_layers": True},
)


@pytest.fixture
def native(monkeypatch, tmp_path):
    monkeypatch.setenv("XBENCH_PREDICATE", "native")
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))  # built here, not found cached


def _requests(fabric, shape):
    for rows in (1, 8, 512, 8.0):  # a float where an int is usual: the same bits
        for chunk in (64, 1000, 65536):
            for reuse in (0, 10):
                for payload in (1152, 1 << 20):
                    yield Request(
                        rows=rows, chunk_tokens=chunk, reuse=reuse, payload_bytes=payload,
                        fabric=fabric, **shape,
                    )  # fmt: skip


def test_native_decide_is_the_python_form_on_the_shipped_and_fitted_profiles(native):
    for path in PROFILES:
        profile = load_profile(path)
        for fabric in (None, profile.fabrics[-1].name):
            for shape in SHAPES:
                for request in _requests(fabric, shape):
                    assert _same(decide(profile, request), _on_floats(profile, request))
        # built: C functions, not the Python form
        assert all(map(native_code.is_native, profile._decide.values()))


def test_the_native_form_computes_and_hands_over_only_what_it_cannot_hold(native):
    from xbench.core.costmodel import _shape_of, decision_formula
    from xbench.core.tracing import Tracer, TracingOps

    profile = load_profile("profiles/h100-priors.toml")
    request = Request(rows=4)
    tracer = Tracer()
    results = decision_formula(TracingOps(tracer), profile, _shape_of(request), tracer.input)
    python = tracer.compile("decide_compiled", Request._fields, results)
    handed = []

    def fallback(r):
        handed.append(r)
        return python(r)

    compiled = native_code.build(tracer, Request._fields, results, fallback)
    for rows in (1, 8, 512, 8.0):
        assert _same(compiled(request._replace(rows=rows)), python(request._replace(rows=rows)))
    assert handed == []
    compiled(request._replace(rows=2**60))
    assert handed == [request._replace(rows=2**60)]


def test_what_the_native_form_cannot_hold_exactly_goes_to_the_python_form(native):
    """Integers past 2**53 (exact in Python, not in a double), fields that are not exact
    ints or floats, a zero divisor: the Python form answers (or raises) as it would."""
    import numpy as np

    profile = load_profile("profiles/h100-priors.toml")
    for request in (
        Request(rows=2**60),
        Request(rows=np.int64(8), chunk_tokens=np.float32(1024.0)),
        Request(rows=True),
    ):
        assert _same(decide(profile, request), _on_floats(profile, request))
    with pytest.raises(ZeroDivisionError):
        _on_floats(profile, Request(reuse=-1))
    with pytest.raises(ZeroDivisionError):
        decide(profile, Request(reuse=-1))


@settings(max_examples=12, deadline=None)
@given(coefs, shapes, st.floats(0.0, 0.6))
def test_native_decide_on_random_profiles(k, shape, spread):
    profile = one_segment_profile(**k, spread=spread)
    with tempfile.TemporaryDirectory() as cache, pytest.MonkeyPatch.context() as env:
        env.setenv("XBENCH_PREDICATE", "native")
        env.setenv("XBENCH_CACHE_DIR", cache)
        for rows in (1, 16, 300):
            for reuse in (0, 3, 1000):
                request = Request(rows=rows, reuse=reuse, **shape)
                assert _same(decide(profile, request), _on_floats(profile, request))
        assert all(map(native_code.is_native, profile._decide.values()))


def test_a_function_turns_native_after_its_calls_and_python_stays(monkeypatch, tmp_path):
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XBENCH_PREDICATE", raising=False)
    monkeypatch.setattr(native_code, "AFTER_CALLS", 3)
    profile = load_profile("profiles/h100-priors.toml")
    request = Request(rows=4)
    answers = [decide(profile, request) for _ in range(5)]
    assert all(_same(a, answers[0]) for a in answers)
    (compiled,) = profile._decide.values()
    assert native_code.is_native(compiled)
    assert list(tmp_path.glob("xbench_predicate_*"))  # cached for the next process
    monkeypatch.setenv("XBENCH_PREDICATE", "python")
    again = load_profile("profiles/h100-priors.toml")
    for _ in range(5):
        decide(again, request)
    (kept,) = again._decide.values()
    assert not native_code.is_native(kept) and kept.__name__ == "decide_compiled"


def test_a_line_without_a_c_form_keeps_the_python_form():
    """An operation on objects (a string compared) has no C form: no build, no error."""
    from xbench.core.tracing import Tracer

    tracer = Tracer()
    x = tracer.input("x", kind="x")
    same = x == "ib"
    assert native_code.build(tracer, ("x",), (same,), lambda r: None) is None
    # nor has a block that chooses between objects
    from xbench.core.tracing import TracingOps

    block = Tracer(array=True)
    y = block.input("y")
    named = TracingOps(block).where(y > 1.0, "many", "few")
    assert native_code.build_block(block, ("y",), (named,), ("int8",), lambda c, o: None) is None


def _grid(profile, n: int, seed: int):
    """Requests with every field varying: flags, a fetch cost given or not (NaN), steps
    over holders, fabrics named or left to the predicate."""
    rng = np.random.default_rng(seed)
    names = [f.name for f in profile.fabrics]
    return pd.DataFrame(
        {
            "rows": rng.integers(1, 4096, n),
            "heads": rng.choice([1, 16, 128], n),
            "chunk_tokens": rng.integers(1, 70000, n),
            "reuse": rng.integers(0, 300, n),
            "payload_bytes": rng.choice([64, 1152, 1 << 20], n),
            "fetch_cost": np.where(rng.random(n) < 0.5, np.nan, rng.random(n) * 1e-3),
            "include_probe": rng.random(n) < 0.5,
            "blocks_local": rng.random(n) < 0.3,
            "segments": rng.choice([1, 4, 64], n),
            "layers": rng.choice([1, 61], n),
            "holders": rng.choice([1, 2, 5], n),
            "pipeline_layers": rng.random(n) < 0.5,
            "fabric": pd.Series(rng.choice([None, *names], n), dtype=object),
        }
    )


def test_the_native_grid_is_the_numpy_grid_to_the_bit(monkeypatch, tmp_path):
    from xbench.core.grid import decide_grid

    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))
    for seed, path in enumerate(PROFILES):
        grid = _grid(load_profile(path), 3000, seed)
        monkeypatch.setenv("XBENCH_PREDICATE", "python")
        numpy_form = decide_grid(load_profile(path), grid)
        monkeypatch.setenv("XBENCH_PREDICATE", "native")
        profile = load_profile(path)
        native = decide_grid(profile, grid)
        assert all(forms.native for forms in profile._decide.values())  # built, every group
        pd.testing.assert_frame_equal(native, numpy_form, check_exact=True)


def test_a_large_grid_builds_its_native_form_and_a_small_one_does_not(monkeypatch, tmp_path):
    from xbench.core import grid as grids

    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("XBENCH_PREDICATE", raising=False)
    monkeypatch.setattr(grids, "NATIVE_ROWS", 500)
    profile = load_profile("profiles/h100-priors.toml")
    small = _grid(profile, 100, 0).drop(columns="fabric")
    grids.decide_grid(profile, small)
    (forms,) = profile._decide.values()
    assert forms.native is None
    large = _grid(profile, 600, 0)[small.columns]
    answer = grids.decide_grid(profile, large)
    assert forms.native and len(answer) == 600
