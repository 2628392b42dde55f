"""decide() compiled for a profile (xbench.core.tracing) against the formula run on floats."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_costmodel import c, coefs, one_segment_profile, shapes

from xbench.core.costmodel import (
    SCALAR,
    Fabric,
    Profile,
    Request,
    Segment,
    _shape_of,
    decide,
    decision_formula,
)
from xbench.core.profile import load_profile
from xbench.core.tracing import Tracer, TracingOps

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def _on_floats(profile, request):
    """decide()'s formula run on Python floats, uncompiled: the reference."""
    shape = _shape_of(request)
    return decision_formula(SCALAR, profile, shape, lambda name: getattr(request, name))


def _same(a, b) -> bool:
    """Equal to the bit and of the same types (NaN equal to NaN)."""
    return all(
        type(x) is type(y) and (x == y or (x != x and y != y)) for x, y in zip(a, b, strict=True)
    )


requests = st.tuples(
    st.integers(1, 512),
    st.sampled_from([0, 1, 10, 1000]),
    st.sampled_from([None, 0.0, 1e-4, 3e-3]),
    st.booleans(),
    st.booleans(),
    st.tuples(st.sampled_from([1, 2, 61]), st.sampled_from([1, 3]), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(coefs, shapes, st.floats(0.0, 0.6), st.lists(requests, min_size=1, max_size=8))
def test_compiled_decide_is_the_formula_on_floats_to_the_bit(k, shape, spread, draws):
    profile = one_segment_profile(**k, spread=spread)
    second = Fabric(
        "nvlink", (Segment(0.0, c(k["alpha"] / 2), c(k["beta"] * 2, unit="B/s")),), c(k["o"])
    )
    two = Profile("two", (*profile.fabrics, second), profile.device)
    for rows, reuse, fetch_cost, blocks_local, probe, (layers, holders, piped) in draws:
        for p, fabric in ((profile, None), (two, None), (two, "ib"), (two, "nvlink")):
            req = Request(
                rows=rows, reuse=reuse, fetch_cost=fetch_cost, blocks_local=blocks_local,
                include_probe=probe, fabric=fabric, layers=layers, holders=holders,
                pipeline_layers=piped, **shape,
            )  # fmt: skip
            assert _same(decide(p, req), _on_floats(p, req))


def test_compiled_decide_on_the_shipped_and_fitted_profiles():
    """Piecewise terms (bisect), the merge-wait's exponential, the saving: every term the
    shipped priors and a CPU fit have, against the formula on floats."""
    for path in ("profiles/h100-priors.toml", "tests/data/vm-cpu-profile.toml"):
        profile = load_profile(path)
        for fabric in (None, *(f.name for f in profile.fabrics)):
            for rows in (1, 8, 64, 512):
                for chunk in (64, 1000, 4096, 65536):
                    for reuse, segments in ((0, 1), (10, 1), (1, 16)):
                        req = Request(
                            rows=rows, chunk_tokens=chunk, reuse=reuse, segments=segments,
                            fabric=fabric,
                        )  # fmt: skip
                        assert _same(decide(profile, req), _on_floats(profile, req))


def test_a_profile_compiles_once_per_request_shape():
    profile = load_profile("profiles/h100-priors.toml")
    for chunk in (64, 128, 4096):
        decide(profile, Request(chunk_tokens=chunk))
        decide(profile, Request(chunk_tokens=chunk, fabric="ib"))
    decide(profile, Request(fetch_cost=1e-3))
    assert len(profile._decide) == 3


def test_tracing_folds_constants_shares_expressions_and_drops_what_is_unused():
    t = Tracer()
    ops = TracingOps(t)
    x, y = t.input("x"), t.input("y")
    assert (x * 1.0 + 0.0) is x and 0.0 * x == 0.0 and 2.0 * 3.0 == 6.0
    twice = x * 2.0
    assert (x * 2.0) is twice  # the same expression is one line
    unused = y * 7.0  # noqa: F841 (traced, never returned: dropped)
    out = ops.where(twice > 1.0, twice, math.inf)
    f = t.compile("f", ("x", "y"), (out, True))
    assert "7.0" not in f.source and f.source.count("x * 2.0") == 1
    assert f((1.0, 5.0)) == (2.0, True) and f((0.25, 5.0)) == (math.inf, True)


def test_a_traced_value_has_no_truth_value():
    t = Tracer()
    with pytest.raises(TypeError, match="ops.where"):
        if t.input("x") > 1.0:
            pass


def test_the_array_form_reuses_buffers_only_once_their_values_are_dead():
    """A formula whose values live across many operations, compiled for numpy blocks into
    reused buffers, against numpy on fresh arrays; on two threads at once."""
    import threading

    import numpy as np

    def formula(ops, x, y):
        a, b = x * 2.0, y * 3.0
        c = ops.where(a > b, a - b, b - a)  # a and b read again below
        d = ops.minimum(c, a) + ops.maximum(b, 1.0)
        flag = (x > 0.5) & (y < 0.5)
        code = ops.where(flag, 1, ops.where(d > 2.0, 2, 0))
        return d * a + ops.expm1(-c) - b, code, flag, ops.pick(code, (0.5, 1.5, 2.5)), 7.0

    class Numpy:
        where, minimum, maximum, expm1 = np.where, np.minimum, np.maximum, np.expm1

        @staticmethod
        def pick(index, table):
            return np.asarray(table)[index]

    t = Tracer(array=True)
    compiled = t.compile("f", ("x", "y"), formula(TracingOps(t), t.input("x"), t.input("y")))
    assert "out=F[" in compiled.source and "copyto" in compiled.source
    rng = np.random.default_rng(1)
    blocks = [(rng.random(n), rng.random(n)) for n in (1000, 3000, 1000)]
    expected = [formula(Numpy, x, y) for x, y in blocks]
    failures = []

    def check():
        for (x, y), want in zip(blocks * 20, expected * 20, strict=True):
            out = tuple(np.empty(len(x), np.asarray(w).dtype) for w in want)
            got = [o if g is None else g for g, o in zip(compiled((x, y), out), out, strict=True)]
            for g, w in zip(got, want, strict=True):
                if not np.array_equal(np.broadcast_to(g, np.shape(w)), w):
                    failures.append((g, w))

    threads = [threading.Thread(target=check) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
