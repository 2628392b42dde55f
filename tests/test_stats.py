import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xbench.core.stats import median_ci, summarize

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def test_known_interval():
    x = np.arange(1, 21, dtype=float)  # n = 20: the 95 % order statistics are x(6), x(15)
    lo, hi, cov = median_ci(x)
    assert (lo, hi) == (6.0, 15.0)
    assert cov >= 0.95


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2, max_size=200)
)
def test_interval_contains_median(values):
    lo, hi, _ = median_ci(values)
    assert lo <= np.median(values) <= hi


@settings(deadline=None, max_examples=5)
@given(st.integers(min_value=10, max_value=60))
def test_coverage_is_honest(n):
    """Across many lognormal samples the interval holds the true median >= ~95 % of the time."""
    rng = np.random.default_rng(n)
    hits = 0
    trials = 2000
    for _ in range(trials):
        lo, hi, _ = median_ci(rng.lognormal(0.0, 0.5, n))
        hits += lo <= 1.0 <= hi  # median of lognormal(0, s) is exp(0) = 1
    assert hits / trials >= 0.93


def test_summary_fields():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.minimum == 1.0 and s.maximum == 100.0 and s.n == 5
    assert s.p99 > s.median
    assert s.confidence < 0.95  # five samples cannot reach 95 %; the summary says so
    with pytest.raises(ValueError):
        median_ci([])
