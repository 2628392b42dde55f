import pytest
from hypothesis import given
from hypothesis import strategies as st

from xbench.core.units import (
    MOST_BYTES,
    SIZE_UNITS,
    format_size,
    parse_duration,
    parse_duration_list,
    parse_int_list,
    parse_rate,
    parse_size,
    parse_size_list,
)
from xbench.errors import XbenchError

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


@given(st.integers(min_value=0, max_value=2**45))
def test_format_then_parse_is_identity(n):
    assert parse_size(format_size(n)) == n


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(SIZE_UNITS)))
def test_number_and_unit(n, unit):
    if n * SIZE_UNITS[unit] > MOST_BYTES:  # past any size xbench handles: refused, one line
        with pytest.raises(XbenchError, match="beyond any size xbench handles"):
            parse_size(f"{n}{unit}")
    else:
        assert parse_size(f"{n}{unit}") == n * SIZE_UNITS[unit]


def test_decimal_and_binary_are_distinct():
    assert parse_size("1KB") == 1000
    assert parse_size("1KiB") == 1024
    assert parse_size("1.5KB") == 1500
    assert parse_size("64") == 64


@pytest.mark.parametrize(
    "bad", ["1KX", "1kb", "1k", "1K", "kb", "-1B", "1.5B", "", "1 2B", "1KiBB", "0x10B", "1e3B"]
)
def test_rejects_anything_else(bad):
    with pytest.raises(XbenchError) as err:
        parse_size(bad)
    assert "KiB" in str(err.value)  # the message says how to write it


@given(st.text(alphabet="0123456789.KMGTBikxX-_ ", max_size=8))
def test_parse_never_crashes(text):
    try:
        value = parse_size(text)
    except XbenchError:
        return
    assert isinstance(value, int) and value >= 0


@given(st.integers(min_value=0, max_value=20), st.integers(min_value=0, max_value=20))
def test_doubling_ranges(lo, hi):
    lo, hi = min(lo, hi), max(lo, hi)
    sizes = parse_size_list(f"{2**lo}B:{2**hi}B")
    assert sizes == [2**k for k in range(lo, hi + 1)]


def test_lists_ranges_and_steps():
    assert parse_size_list("8B,1KB,64KiB") == [8, 1000, 65536]
    assert parse_size_list("1KiB:16KiB:x4") == [1024, 4096, 16384]
    assert parse_size_list("8B:16MiB")[-1] == 16 * 2**20
    assert parse_size_list("1KB:4KB") == [1000, 2000, 4000]
    assert parse_size_list("0:4B", allow_zero=True) == [0, 1, 2, 4]
    for bad in ["4KB:1KB", "1KB:2KB:x1", "1KB:2KB:y2", "8B,,1KB", "0B", "1KX:2KB"]:
        with pytest.raises(XbenchError):
            parse_size_list(bad)


def test_durations_and_int_lists():
    assert parse_duration("3ms") == pytest.approx(3e-3)
    assert parse_duration("25us") == pytest.approx(25e-6)
    assert parse_duration("1.5s") == 1.5
    with pytest.raises(XbenchError):
        parse_duration("3 fortnights")
    assert parse_int_list("1,8,64", "--rows") == [1, 8, 64]
    assert parse_int_list("1:16", "--rows") == [1, 2, 4, 8, 16]
    with pytest.raises(XbenchError):
        parse_int_list("a,b", "--rows")
    with pytest.raises(XbenchError, match="1 or more"):  # zero rows or tokens: nothing to time
        parse_int_list("0,8", "--rows")
    assert parse_int_list("0,1,10", "--reuse", least=0) == [0, 1, 10]


def test_rates_are_finite_and_above_zero():
    """One parser for simulate --rate and a scenario's rate: the scenario's took nan/s
    and inf/s, which ran as given."""
    assert parse_rate("50/s") == 50.0 and parse_rate(" 2.5/s ") == 2.5 and parse_rate("7") == 7
    for bad in ("nan/s", "inf/s", "-inf/s", "0/s", "-3/s", "fast", "", "1e999/s"):
        with pytest.raises(XbenchError, match="bad rate"):
            parse_rate(bad)


def test_duration_lists_are_sorted_distinct_and_bounded():
    assert parse_duration_list("2ms, 500us,2ms", "--idle", 1e-6, 1.0, "500us,2ms") == [5e-4, 2e-3]
    for bad, words in (
        ("2ms,,4ms", "empty item"),
        ("2s", "--idle 2s is outside 1us-1s"),
        ("soon", "bad duration 'soon' in --idle"),
        ("4ms:1ms", "bad --idle range"),
        ("1ms:2s", "outside 1us-1s"),
    ):
        with pytest.raises(XbenchError, match=words):
            parse_duration_list(bad, "--idle", 1e-6, 1.0, "500us,2ms")
    # a doubling range, its ends included
    got = parse_duration_list("10us:80us,1ms", "--fetch-cost", 0.0, 1.0, "10us:1ms")
    assert got == pytest.approx([10e-6, 20e-6, 40e-6, 80e-6, 1e-3])
