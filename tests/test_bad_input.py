"""Bad input as a user meets it: one line that names the problem and the fix, a non-zero exit,
no traceback, and nothing already written lost or replaced."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import BIN, ROOT

from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import RunStore, mark_partial

PRIORS = ROOT / "profiles" / "h100-priors.toml"


def one_line(r) -> str:
    """The error a command printed: exactly one line on stderr, no traceback, no box."""
    text = r.stderr + r.stdout
    assert r.returncode not in (0, None), text
    assert "Traceback" not in text and "╭" not in text, text
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("xbench: error: "), r.stderr
    return lines[0]


def probe_run(out_dir, *, bandwidth=True, finish=True, fabric="ib"):
    """A small probe run written through the store, as the ranks write one."""
    rng = np.random.default_rng(0)
    store = RunStore(out_dir, {"run_id": f"probe-test-{out_dir.name}", "command": "probe"})
    base = dict(
        run_id=store.run_meta["run_id"],
        transport="mpi",
        device="host",
        fabric=fabric,
        fabric_inferred=False,
        loop="c",
        rank_a=0,
        rank_b=1,
        host_a="h",
        host_b="h",
        pair_class="inter-node",
        iterations=100,
        warmup=False,
        process_run=0,
    )
    for size in [2**k for k in range(3, 22)]:
        one_way = 1.5e-6 + size / 20e9
        rows = [
            dict(base, pattern="latency", size_bytes=size, sample=i, metric="latency_oneway")
            | {"value": one_way * 1e6 * rng.lognormal(0, 0.02), "unit": "us"}
            for i in range(6)
        ]
        store.append(PROBE_SAMPLES, rows)
    if bandwidth:
        rows = [
            dict(base, pattern="bandwidth", size_bytes=s, sample=i, metric="bandwidth_window")
            | {"value": s / 0.4e-6 / 1e6, "unit": "MB/s", "window": 64}
            for s in (8, 64, 256)
            for i in range(6)
        ]
        store.append(PROBE_SAMPLES, rows)
    if finish:
        store.finish()
    return out_dir


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b[: len(b) // 2], "not a readable Parquet file"),
        (lambda b: b"this is not parquet at all" * 4, "not a readable Parquet file"),
        (lambda b: b"", "not a readable Parquet file"),
    ],
    ids=["truncated", "garbage", "empty"],
)
def test_fit_on_a_damaged_parquet_file(xbench, tmp_path, damage, words):
    run = probe_run(tmp_path / "run")
    part = run / PROBE_SAMPLES / "part-00000.parquet"
    part.write_bytes(damage(part.read_bytes()))
    out = tmp_path / "p.toml"
    line = one_line(xbench("fit", run, "--out", out))
    assert words in line and "part-00000.parquet" in line and "re-run" in line
    assert not out.exists()


def test_fit_on_a_corrupt_run_json(xbench, tmp_path):
    run = probe_run(tmp_path / "run")
    (run / "run.json").write_text('{"run_id": "x", ')
    line = one_line(xbench("fit", run, "--out", tmp_path / "p.toml"))
    assert "run.json is not valid JSON" in line


def test_fit_without_bandwidth_samples_says_so_and_keeps_the_prior(xbench, tmp_path):
    run = probe_run(tmp_path / "run", bandwidth=False)
    out = tmp_path / "p.toml"
    r = xbench("fit", run, "--base", "h100-priors", "--out", out, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "fabric ib: no windowed bandwidth samples" in r.stderr
    assert "kept h100-priors's prior" in r.stderr
    rows = json.loads(r.stdout)
    (o,) = [row for row in rows if row["group"] == "fabric ib" and row["term"].startswith("o ")]
    assert o["prior"] is True and o["value"] == pytest.approx(0.3)  # the priors' ib overhead
    import tomllib

    profile = tomllib.loads(out.read_text())
    assert any("no windowed bandwidth" in w for w in profile["provenance"]["warnings"])


def test_fit_without_bandwidth_and_without_a_base_marks_o_a_placeholder(xbench, tmp_path):
    run = probe_run(tmp_path / "run", bandwidth=False, fabric="shm")
    kernel_base = tmp_path / "dev.toml"  # a base with no shm fabric: o has nowhere to come from
    kernel_base.write_text(PRIORS.read_text())
    r = xbench("fit", run, "--base", kernel_base, "--out", tmp_path / "p.toml")
    assert r.returncode == 0, r.stderr
    assert "set to 0 and marked prior" in r.stderr


@pytest.mark.parametrize("reason", [None, "interrupted"])
def test_fit_says_when_a_run_is_partial(xbench, tmp_path, reason):
    run = probe_run(tmp_path / "run", finish=False)
    if reason:
        mark_partial(run, reason)
    r = xbench("fit", run, "--base", "h100-priors", "--out", tmp_path / "p.toml")
    assert r.returncode == 0, r.stderr
    # a run still marked running was killed outright (or is still at work)
    assert ("is partial" if reason else "never finished") in r.stderr
    assert (reason or "still says running") in r.stderr


def test_finished_runs_are_complete(tmp_path):
    run = probe_run(tmp_path / "run")
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_outputs_are_never_overwritten_without_force(xbench, tmp_path):
    run = probe_run(tmp_path / "run")
    profile = tmp_path / "p.toml"
    profile.write_text("# an earlier fit\n")
    line = one_line(xbench("fit", run, "--base", "h100-priors", "--out", profile))
    assert "already exists" in line and "--force" in line
    assert profile.read_text() == "# an earlier fit\n"
    decisions = tmp_path / "d.parquet"
    decisions.write_bytes(b"earlier")
    line = one_line(xbench("decide", "--payload", "1KB", "--out", decisions))
    assert "already exists" in line and decisions.read_bytes() == b"earlier"
    r = xbench("decide", "--payload", "1KB", "--out", decisions, "--force")
    assert r.returncode == 0 and decisions.read_bytes() != b"earlier"


def test_fit_refuses_to_write_over_its_base(xbench, tmp_path):
    run = probe_run(tmp_path / "run")
    base = tmp_path / "five.toml"
    base.write_text(PRIORS.read_text())
    line = one_line(xbench("fit", run, "--base", base, "--out", base, "--force"))
    assert "is the --base profile" in line
    assert base.read_text() == PRIORS.read_text()


@pytest.mark.parametrize(
    "args, option",
    [
        (["--rows", "0"], "--rows"),
        (["--chunk", "0"], "--chunk"),
        (["--kv-bytes", "0B"], "--kv-bytes"),
        (["--heads", "0"], "--heads"),
        (["--return", "0B"], "--return"),
    ],
)
def test_decide_refuses_meaningless_shapes(xbench, tmp_path, args, option):
    line = one_line(xbench("decide", "--payload", "1KB", *args, "--out", tmp_path / "d.parquet"))
    assert f"{option} 0 is not a request shape" in line and f"give {option} of 1" in line
    assert not (tmp_path / "d.parquet").exists()


def test_decide_refuses_shapes_beyond_any_request(xbench, tmp_path):
    """99999 TiB a query row: a traceback from the table's integer column once."""
    out = tmp_path / "d.parquet"
    line = one_line(xbench("decide", "--payload", "99999TiB", "--out", out))
    assert "--payload 99999TiB is beyond any request" in line and "at or below 1TiB" in line
    line = one_line(xbench("decide", "--payload", "1KB", "--reuse", str(2**41)))
    assert f"--reuse {2**41} is beyond any request" in line
    assert not out.exists()


def test_decide_refuses_a_zero_payload(xbench):
    assert "--payload 0 is not a request shape" in one_line(xbench("decide", "--payload", "0B"))


@pytest.mark.parametrize("number", ["inf", "nan", "-inf"])
def test_profiles_with_non_finite_numbers_name_the_field(xbench, tmp_path, number):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        PRIORS.read_text().replace("value = 50, low = 40", f"value = {number}, low = 40", 1)
    )
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
    assert "fabric ib segment 1 beta value" in line and "not a finite number" in line


@pytest.mark.parametrize(
    "args, words",
    [
        (["probe", "--np", "abc"], "Invalid value for '--np'"),
        (["decide", "--payload", "1KB", "--format", "yaml"], "Invalid value for '--format'"),
        (["decide", "--no-such-option"], "No such option"),
    ],
)
def test_usage_errors_are_one_line_too(xbench, args, words):
    line = one_line(xbench(*args))
    assert words in line and "--help" in line


def _interruptible():
    """Ctrl-C's default in the child: a test run started in the background (``cmd &`` in a
    shell without job control, as some runners start jobs) inherits SIGINT ignored, and a
    Python started so keeps ignoring it, as a Unix program should."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_probe_says_where_its_results_are(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [str(BIN / "xbench"), "probe", "--np", "2", "--sizes", "8B:16MiB", "--samples", "40"]
        + ["--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=_interruptible,
    )
    deadline = time.monotonic() + 120
    while not list((out / PROBE_SAMPLES).glob("part-*.parquet")):  # a case finished
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert f"the cases finished so far are in {out}" in stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial" and meta["stopped_because"] == "interrupted"


def test_a_directory_is_neither_a_profile_nor_an_output_file(xbench, tmp_path):
    """A directory passed where a file goes: one line, and --force does not replace it."""
    held = tmp_path / "held"
    held.mkdir()
    (held / "keep.txt").write_text("mine")
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", held))
    assert f"cannot read profile {held}" in line and "pass a profile file" in line
    # an unknown name lists the shipped profiles, as for scenarios
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", "h100-prior"))
    assert "profile h100-prior is neither a file nor one xbench ships" in line
    assert "h100-priors" in line
    # the same words under fit's --base, where "--profile" would name the wrong option
    line = one_line(xbench("fit", held, "--base", held / "none.toml", "--out", held / "p.toml"))
    assert f"profile {held / 'none.toml'} does not exist" in line and "--profile" not in line
    line = one_line(xbench("decide", "--payload", "1KB", "--out", held, "--force"))
    assert f"{held} is a directory" in line and "--out with a file path" in line
    assert [p.name for p in held.iterdir()] == ["keep.txt"]


def test_slurm_refuses_a_time_limit_sbatch_would_refuse(xbench, tmp_path):
    script = tmp_path / "job.sbatch"
    line = one_line(xbench("slurm", "probe", "--time", "99h", "--out", script))
    assert "--time '99h' is not a Slurm time limit" in line and "HH:MM:SS" in line
    assert not script.exists()
    for limit in ("45", "1-12", "2-00:00:00", "UNLIMITED"):
        r = xbench("slurm", "probe", "--time", limit, "--out", script, "--force")
        assert r.returncode == 0, r.stderr
        assert f"#SBATCH --time={limit}" in script.read_text()


@pytest.mark.parametrize(
    "args, words",
    [
        (["kernel", "--heads", "0"], "'--heads'"),
        (["kernel", "--block-size", "0"], "'--block-size'"),
        (["kernel", "--threads", "0"], "'--threads'"),
        (["validate", "--profile", PRIORS, "--heads", "0"], "'--heads'"),  # it hung
        (["validate", "--profile", PRIORS, "--threads", "0"], "'--threads'"),  # a rank died
        (["validate", "--profile", PRIORS, "--timeout", "0"], "'--timeout'"),
        (["probe", "--np", "2", "--timeout", "0"], "--timeout 0: no case could finish"),
        (["probe", "--np", "2", "-p", "gather", "--block-size", "0"], "--block-size 0"),
        (["kernel", "--warmups", "-1"], "'--warmups'"),  # it ran
        (["probe", "--np", "2", "--pairs", "5"], "bad rank pair '5'"),  # refused by the ranks
        (["probe", "--np", "2", "--pairs", "0-2"], "rank pair '0-2' does not fit 2 ranks"),
        (["probe", "--np", "0"], "--np 0"),  # these three left an empty --out behind
        (["probe", "--config-from", ROOT], "no stored probe configuration"),
        (["probe", "--process-run", "1"], "--process-run is for launches"),
        (["kernel", "--config-from", ROOT], "no stored kernel sweep configuration"),
        (["validate", "--profile", PRIORS, "--fabric", "ib", "--rows", "0"], "bad --rows '0'"),
    ],
)
def test_counts_that_mean_nothing_are_refused_before_any_rank_starts(xbench, tmp_path, args, words):
    out = tmp_path / "run"
    assert words in one_line(xbench(*args, "--out", out))
    assert not out.exists()


def test_out_of_memory_is_one_line(xbench):
    """A replay of 10^11 requests needs 745 GiB for its arrival times alone."""
    scenario = ROOT / "scenarios" / "agentic-codebase.toml"
    r = xbench("simulate", scenario, "--requests", "100000000000")
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    # the progress bar, started before the first workload, stays above the error
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("xbench: error: out of memory") and "fewer --requests" in line


def test_a_scenario_that_is_no_file_is_one_line(xbench, tmp_path):
    """A directory, a binary file or an unknown name as the scenario (a directory and a
    binary file were tracebacks); the shipped names are listed as the fix."""
    binary = tmp_path / "noise.toml"
    binary.write_bytes(bytes(range(128, 256)))
    for command in (["simulate"], ["decide", "--scenario"]):
        line = one_line(xbench(*command, tmp_path))
        assert f"cannot read scenario {tmp_path}" in line and "shipped scenario" in line
        line = one_line(xbench(*command, binary))
        assert f"cannot read scenario {binary}" in line
        line = one_line(xbench(*command, "agentic-codebook"))
        assert "agentic-codebook is neither a file nor one xbench ships" in line
        assert "agentic-codebase" in line and "span-fanout" in line
