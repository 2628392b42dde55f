"""benchmarks/compare_osu.py: the statistics the OSU agreement is judged on, and (where OSU's
source is beside the checkout) a real side-by-side run of one small size of each pattern."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_osu.py"
spec = importlib.util.spec_from_file_location("compare_osu", SCRIPT)
compare_osu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_osu)


@pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)
def test_the_target_is_five_percent_everywhere():
    for size in (8, 1000, 1024, 65536, 16 * 2**20):
        for pattern in ("latency", "bandwidth"):
            assert compare_osu.tolerance(size, pattern) == 0.05


@pytest.mark.nompi
def test_equal_tools_agree():
    rng = np.random.default_rng(1)
    osu = rng.lognormal(0, 0.1, 20)
    row = compare_osu.compare(osu, osu)
    assert row["ratio"] == pytest.approx(1.0)
    assert row["ci_low"] == pytest.approx(1.0) and row["ci_high"] == pytest.approx(1.0)
    assert compare_osu.verdict(65536, row) == "agrees"


@pytest.mark.nompi
def test_a_constant_factor_is_recovered_and_judged():
    rng = np.random.default_rng(2)
    osu = rng.lognormal(0, 0.2, 25)
    row = compare_osu.compare(osu, 1.08 * osu)
    assert row["ratio"] == pytest.approx(1.08)
    assert row["paired_min"] == pytest.approx(1.08) == row["paired_max"]
    assert compare_osu.verdict(8, row) == compare_osu.verdict(1 << 20, row) == "outside"
    assert compare_osu.verdict(4096, row, "bandwidth") == "outside"


@pytest.mark.nompi
def test_noisy_launches_widen_the_interval():
    """Launches spread +-20 % around the same median: the point agrees, the interval crosses
    the tolerance, so the verdict is inconclusive (it said "agrees (CI wider)")."""
    osu = np.ones(9)
    xb = np.array([0.8, 1.2, 0.85, 1.15, 1.0, 0.9, 1.1, 0.95, 1.05])
    row = compare_osu.compare(osu, xb)
    assert row["ratio"] == pytest.approx(1.0)
    assert row["ci_low"] < 0.95 and row["ci_high"] > 1.05
    assert compare_osu.verdict(1 << 20, row) == "inconclusive"


@pytest.mark.nompi
def test_a_point_outside_with_an_interval_crossing_the_tolerance_is_inconclusive():
    """1.07 at 1 MiB (5 % allowed) with launches spread around it: the interval reaches back
    inside the tolerance, so neither outside nor agrees can be said."""
    osu = np.ones(9)
    xb = 1.07 * np.array([0.9, 1.1, 0.92, 1.08, 1.0, 0.95, 1.05, 0.97, 1.03])
    row = compare_osu.compare(osu, xb)
    assert row["ratio"] == pytest.approx(1.07)
    assert row["ci_low"] < 1.05 < row["ci_high"]
    assert compare_osu.verdict(1 << 20, row) == "inconclusive"


@pytest.mark.nompi
def test_a_floor_wider_than_the_tolerance_is_named_in_the_verdict():
    """OSU against itself spread past 5 %: the verdict keeps its word and says the floor is
    too wide to tell a smaller difference; a tight floor adds nothing."""
    osu = np.ones(9)
    wide = compare_osu.compare(osu, np.array([0.8, 1.2, 0.85, 1.15, 1.0, 0.9, 1.1, 0.95, 1.05]))
    tight = compare_osu.compare(osu, osu)
    row = compare_osu.compare(osu, 1.01 * osu)
    assert compare_osu.verdict(1 << 20, row, floor=tight) == "agrees"
    said = compare_osu.verdict(1 << 20, row, floor=wide)
    assert said.startswith("agrees (floor ") and "wider than 5%" in said


@pytest.mark.nompi
def test_aggregate_is_osus_whole_loop_statistic():
    """Two samples of one size: OSU's figure is total time (or bytes) over the whole loop."""
    import pandas as pd

    size = 1 << 20
    # latency samples: 10 iterations at 2 us, 30 at 4 us -> 140 us over 40 iterations
    lat = pd.DataFrame(
        {"size_bytes": [size] * 3, "iterations": [10, 30, 5], "value": [2.0, 4.0, 99.0]}
    ).assign(warmup=[False, False, True])
    assert compare_osu.aggregate(lat, "latency") == {size: pytest.approx(3.5)}
    # bandwidth: 1 window at 1000 MB/s and 1 at 3000 MB/s -> 2 windows in 4/3000 s: 1500 MB/s
    bw = pd.DataFrame(
        {"size_bytes": [size] * 2, "iterations": [1, 1], "value": [1000.0, 3000.0]}
    ).assign(warmup=False)
    assert compare_osu.aggregate(bw, "bandwidth") == {size: pytest.approx(1500.0)}


@pytest.mark.nompi
def test_variant_names_an_environment_for_one_more_xbench_launch():
    assert compare_osu.parse_variant("multiple:MPI4PY_RC_THREAD_LEVEL=multiple") == (
        "multiple",
        {"MPI4PY_RC_THREAD_LEVEL": "multiple"},
    )
    assert compare_osu.parse_variant("x:A=1,B=c=d") == ("x", {"A": "1", "B": "c=d"})
    for bad in ("noenv", "x:", ":A=1", "osu:A=1", "osu_again:A=1", "xbench:A=1"):
        with pytest.raises(ValueError):
            compare_osu.parse_variant(bad)


@pytest.mark.nompi
def test_fewer_than_three_rounds_give_no_interval():
    row = compare_osu.compare([1.0, 1.1], [1.0, 1.2])
    assert np.isnan(row["ci_low"]) and np.isnan(row["ci_high"])
    assert compare_osu.verdict(65536, row) == "inconclusive (no interval)"


@pytest.mark.mpi
@pytest.mark.mpi_default  # both MPIs' figures: benchmarks/compare_osu.py
def test_osu_is_built_from_the_reference_and_compared_side_by_side():
    """One small size of each pattern, three rounds, OSU built from ../shared/reference into
    this environment when missing: the tables come out for xbench and for the floor, with a
    ratio and a verdict at that size, so the comparison cannot rot."""
    if not (compare_osu.REFERENCE / "build-osu.sh").exists():
        pytest.skip(f"OSU's source is not beside the checkout ({compare_osu.REFERENCE})")
    if not (compare_osu.BIN / "mpicc").exists():
        pytest.skip(f"no mpicc in {compare_osu.BIN} to build OSU with")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "3", "--sizes", "1KiB"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    tables = [block.splitlines() for block in r.stdout.strip().split("\n\n")]
    for pattern in ("latency", "bandwidth"):
        titles = [t[0] for t in tables if t[0].startswith(pattern)]
        assert any("median of samples" in t for t in titles), r.stdout
        assert any("OSU's second launch" in t for t in titles), r.stdout
    for table in tables:
        (row,) = [ln.split() for ln in table if ln.split()[:1] == ["1024"]]
        osu, other, ratio = map(float, row[1:4])
        # the medians are printed to OSU's two decimals, the ratio from them unrounded:
        # it lies where the printed pair, each off by up to half a last digit, puts it
        half = 0.005
        assert osu > half and other > half, row
        low, high = (other - half) / (osu + half), (other + half) / (osu - half)
        assert low - 1e-3 <= ratio <= high + 1e-3, row
        assert row[7] in ("agrees", "outside", "inconclusive"), row
