"""OSU's method on request: fixed iteration counts, skipped iterations, the aggregate mean."""

from __future__ import annotations

import json

import pytest

from xbench.probe.patterns import OSU_COUNTS, Case, osu_counts
from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import read_table

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi


@pytest.mark.parametrize(
    "pattern, size, counts",
    [
        ("latency", 8, (10_000, 100)),
        ("latency", 8192, (10_000, 100)),  # LARGE_MESSAGE_SIZE itself is still small
        ("latency", 8193, (1_000, 10)),
        ("bandwidth", 1024, (100, 10)),
        ("bandwidth", 1 << 20, (20, 2)),
        ("bibw", 1 << 24, (20, 2)),
    ],
)
def test_osu_counts_follow_osu_util(pattern, size, counts):
    assert osu_counts(Case(pattern, size, "m", "u", window=64)) == counts
    assert set(OSU_COUNTS) == {"latency", "bandwidth", "bibw"}


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_osu_compat_runs_osu_counts_and_reports_the_aggregate(xbench, tmp_path):
    out = tmp_path / "osu"
    r = xbench(
        "probe",
        "--np",
        "2",
        "--sizes",
        "8B,16KiB",
        "--osu-compat",
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    samples = read_table(out, PROBE_SAMPLES)
    case = samples[(samples.pattern == "latency") & (samples.size_bytes == 8)]
    assert list(zip(case.iterations, case.warmup, strict=True)) == [(100, True), (10_000, False)]
    case = samples[(samples.pattern == "bandwidth") & (samples.size_bytes == 16384)]
    assert list(zip(case.iterations, case.warmup, strict=True)) == [(2, True), (20, False)]
    rows = json.loads(r.stdout)
    for row in rows:  # one timed sample: its mean is the aggregate
        assert row["aggregate"] == pytest.approx(row["median"])
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["osu_compat"] is True


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_fixed_iterations_aggregate_over_samples(xbench, tmp_path):
    out = tmp_path / "fixed"
    r = xbench(
        "probe",
        "--np",
        "2",
        "--sizes",
        "1KiB",
        "-p",
        "latency",
        "--iterations",
        "500",
        "--skip",
        "20",
        "--samples",
        "3",
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    samples = read_table(out, PROBE_SAMPLES)
    timed = samples[~samples.warmup & (samples.pattern == "latency")]
    assert list(timed.iterations) == [500, 500, 500]
    assert list(samples[samples.warmup & (samples.pattern == "latency")].iterations) == [20]
    (row,) = json.loads(r.stdout)
    assert row["aggregate"] == pytest.approx(timed.value.mean())  # equal counts: the mean


@pytest.mark.parametrize(
    "args, words",
    [
        (["--osu-compat", "--iterations", "10"], "--osu-compat sets OSU's iteration counts"),
        (["--iterations", "0"], "need iterations >= 1"),
        (["--skip", "5"], "--skip 5 without --iterations"),
        (["--osu-compat", "-p", "rtt"], "--osu-compat covers latency, bandwidth and bibw"),
    ],
)
def test_osu_method_bad_input(xbench, tmp_path, args, words):
    r = xbench("probe", "--np", "2", "--sizes", "8B", *args, "--out", tmp_path / "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert words in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()
