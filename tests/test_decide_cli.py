"""xbench decide / fit / validate from the command line; bad profiles are one-line errors."""

import json
import re

import pandas as pd
import pytest

from xbench.core.profile import load_profile
from xbench.kernels import cpu_bf16
from xbench.results.schema import KERNEL_SAMPLES
from xbench.results.store import read_run_meta, read_table
from xbench.validate.worker import PHASES

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi


def _error_line(r):
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    return r.stderr.strip().splitlines()[-1]


def test_decide_payload_writes_parquet_and_json(xbench, tmp_path):
    out = tmp_path / "d.parquet"
    r = xbench(
        "decide",
        "--payload",
        "1KB",
        "--rows",
        "1,64",
        "--chunk",
        "256,4096",
        "--reuse",
        "0,100",
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert (
        len(rows) == 8
        and {
            "decision",
            "fabric_chosen",
            "t_route",
            "t_fetch",
            "margin",
            "uncertain",
            "ranked_by",
            "prior",
        }
        <= rows[0].keys()
    )
    assert all(row["prior"] for row in rows)  # the default profile is datasheet priors
    table = pd.read_parquet(out)
    assert len(table) == 8 and set(table.decision) <= {"route", "fetch", "local"}


def test_decide_sources_prints_each_term_and_where_it_comes_from(xbench, tmp_path):
    r = xbench("decide", "--payload", "1KB", "--sources", "--out", tmp_path / "d.parquet")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())  # the table wraps long lines
    profile = load_profile("profiles/h100-priors.toml")
    for c in (profile.device.move_t0, profile.fabric("ibgda").overhead):
        assert " ".join(c.source.split())[:60] in said
    assert "move_t0: " in said and "fabric ibgda" in said


def test_the_shipped_h200_profile_cites_the_run_its_device_terms_were_measured_in(xbench, tmp_path):
    """profiles/h200.toml: device terms fitted from a GPU run (not marked prior, each citing
    the device, backend, software and driver of that run), the prefill still a prior."""
    from xbench.cli.terms import coefficient_frame
    from xbench.resources import profile_path

    terms = coefficient_frame(load_profile(profile_path("h200")))
    device = terms[terms.group == "device NVIDIA H200"].set_index("term")
    measured = device[~device.prior]
    assert len(measured) >= 9 and device.loc["recompute_per_token", "prior"]
    assert measured.source.str.contains("NVIDIA H200").all()
    assert measured.source.str.contains("2026-11-28").all()
    r = xbench("decide", "--profile", "h200", "--payload", "1KB", "--sources",
               "--out", tmp_path / "d.parquet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())  # the table wraps long lines
    assert (
        "compute_per_row_token: fitted from kernel runs on NVIDIA H200 (backend triton, "
        "torch 2.11.0, triton 3.6.0, driver 580.159.04), 2026-11-28" in said
    )
    assert "recompute_per_token* " in said  # still a prior, and marked


def test_decide_model_table_shows_thresholds(xbench, tmp_path):
    r = xbench(
        "decide",
        "--model",
        "deepseek-v3.2",
        "--rows",
        "1",
        "--chunk",
        "2048",
        "--fabric",
        "ib,tcp",
        "--out",
        tmp_path / "d.parquet",
    )
    assert r.returncode == 0, r.stderr
    assert "b* (route if b <)" in r.stdout and "n1/2" in r.stdout and "priors" in r.stdout
    assert r.stdout.count("route") >= 2


@pytest.mark.parametrize(
    "mutation, words",
    [
        (lambda t: t.replace('unit = "GB/s", prior = true,', "prior = true,", 1), "has no unit"),
        (
            lambda t: t.replace("beta = { value = 450", "beta = { value = -450", 1),
            "must be positive",
        ),
        (
            lambda t: t.replace('name = "nvlink"', 'name = "warp-drive"'),
            "unknown name 'warp-drive'",
        ),
        (
            lambda t: t.replace(
                'unit = "us", prior = true,', 'unit = "fortnights", prior = true,', 1
            ),
            "unknown unit 'fortnights'",
        ),
        (lambda t: t + "\n[[[broken", "not valid TOML"),
    ],
)
def test_bad_profiles_are_rejected_in_one_line(xbench, tmp_path, mutation, words):
    text = open("profiles/h100-priors.toml").read()
    bad = tmp_path / "bad.toml"
    bad.write_text(mutation(text))
    assert words in _error_line(xbench("decide", "--payload", "1KB", "--profile", bad))


def test_decide_bad_input(xbench):
    assert "--payload" in _error_line(xbench("decide"))
    assert "bad size '1KX'" in _error_line(xbench("decide", "--payload", "1KX"))
    assert "no fabric warp" in _error_line(xbench("decide", "--payload", "1KB", "--fabric", "warp"))
    assert "does not exist" in _error_line(
        xbench("decide", "--payload", "1KB", "--profile", "/nope.toml")
    )


def test_decide_prints_a_decode_step_of_the_models_layers(xbench, tmp_path):
    """By default a step over DeepSeek-V3.2's 61 layers (or the --model's); --layers 1 is
    one layer's times; the Parquet says which; --holders and --pipeline-layers change the
    step; nonsense is refused in one line."""
    base = ("decide", "--payload", "1KB", "--rows", "8", "--chunk", "2048", "--fabric", "ib")
    step = xbench(*base, "--out", tmp_path / "step.parquet")
    assert step.returncode == 0, step.stderr
    assert "decode step of 61 layers" in " ".join(step.stdout.split())
    layer = xbench(*base, "--layers", "1", "--out", tmp_path / "layer.parquet", "--format", "json")
    assert layer.returncode == 0, layer.stderr
    one, whole = json.loads(layer.stdout)[0], pd.read_parquet(tmp_path / "step.parquet").iloc[0]
    assert (whole.layers, whole.holders, bool(whole.pipeline_layers)) == (61, 1, False)
    # route pays everything every layer; fetch's single transfer is paid once
    assert whole.t_route == pytest.approx(61 * one["t_route"], rel=1e-9)
    assert whole.t_fetch < 61 * one["t_fetch"]
    piped = xbench(*base, "--pipeline-layers", "--holders", "2", "--format", "json")
    assert piped.returncode == 0, piped.stderr
    row = json.loads(piped.stdout)[0]
    assert (row["holders"], row["pipeline_layers"]) == (2, True)
    assert "--layers 0 is not a request shape" in _error_line(xbench(*base, "--layers", "0"))
    assert "--holders 0 is not a request shape" in _error_line(xbench(*base, "--holders", "0"))
    said = _error_line(xbench("decide", "--scenario", "span-fanout", "--layers", "4"))
    assert "--layers would be ignored" in said


def test_decide_sweeps_the_porting_coefficients_and_prints_their_break_even_points(
    xbench, tmp_path
):
    """--payload and --fetch-cost take lists and ranges (a grid axis each, the return
    following each payload); the thresholds table and the Parquet give where route and fetch
    trade places along them, and the rows on either side of a break-even point agree."""
    out = tmp_path / "d.parquet"
    r = xbench(
        "decide", "--payload", "256B:64KiB", "--fetch-cost", "1us,30us,1ms", "--rows", "8",
        "--chunk", "2048", "--fabric", "ib", "--layers", "1", "--heads", "128", "--out", out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert "P* (route if B/row <)" in said and "F* (fetch if move <, us)" in said
    assert "as much back a row" in said
    table = pd.read_parquet(out)
    assert len(table) == 9 * 3 and set(table.payload_bytes) == {256 * 2**i for i in range(9)}
    assert (table.return_bytes == table.payload_bytes).all()
    assert sorted(table.fetch_cost.unique()) == pytest.approx([1e-6, 30e-6, 1e-3])
    for row in table.itertuples():
        if row.decision == "local":
            continue
        routed = row.payload_bytes + row.return_bytes
        assert (row.decision == "route") == (routed < row.payload_star)
        assert (row.decision == "fetch") == (row.fetch_cost < row.fetch_cost_star)
    assert set(table.decision) == {"route", "fetch"}  # the sweep crosses F*
    # at 80 columns the swept axes take the place of the single-valued ones, which the
    # caption names, and nothing is cut
    from conftest import assert_fits_80

    sweep = (
        "decide", "--payload", "256B:16KiB", "--fetch-cost", "10us,100us,1ms", "--rows", "8",
        "--chunk", "2048", "--fabric", "ib",
    )  # fmt: skip
    shown = [
        xbench(*sweep, "--out", tmp_path / f"w{w}.parquet", env={"COLUMNS": str(w)}).stdout
        for w in (80, 250)
    ]
    shown = [re.sub(r"written\s+to\s+\S+", "", text) for text in shown]  # two paths
    assert_fits_80(*shown)
    assert "margin" in shown[0] and "rows 8, chunk 2048, reuse 0" in " ".join(shown[0].split())
    assert "--fetch-cost" in _error_line(
        xbench("decide", "--payload", "1KB", "--fetch-cost", "fast")
    )
    assert "--fetch-cost" in _error_line(xbench("decide", "--payload", "1KB", "--fetch-cost", "2h"))


def test_validate_bad_input(xbench):
    priors = ["--profile", "profiles/h100-priors.toml"]
    for args, words in (
        ([], "no fabric 'shm'"),
        (["--fabric", "ib", "--rounds", "0"], "nothing would be measured"),
        (["--fabric", "ib", "--np", "3"], "pass --np 2"),
        (["--fabric", "ib", "--fetch-layout", "scattered"], "pick pages or packed"),
    ):
        line = _error_line(xbench("validate", *priors, *args))
        assert words in line and line.startswith("xbench: error:"), line


@pytest.mark.mpi
@pytest.mark.mpi_default  # each step runs under every MPI in its own tests
def test_probe_kernel_fit_validate_end_to_end(xbench, tmp_path):
    quick = ["--samples", "3", "--warmups", "1"]
    assert xbench("probe", "--sizes", "8B:256KiB", *quick, "--out", tmp_path / "p").returncode == 0
    r = xbench(
        "kernel",
        "--threads",
        "1",
        "--heads",
        "4",
        "--rows",
        "1,4",
        "--chunk",
        "64,256,1024",
        *quick,
        "--min-sample-time",
        "3ms",
        # validate's layout, in two launches, on torch's path
        *("--np", "2", "--runs", "2", "--cpu-attention", "torch"),
        "--out",
        tmp_path / "k",
    )
    assert r.returncode == 0, r.stderr
    kernel_samples = read_table(tmp_path / "k", KERNEL_SAMPLES)
    assert set(kernel_samples.process_run) == {0, 1} and set(kernel_samples.timed_by) == {0, 1}
    assert read_run_meta(tmp_path / "k")["status"] == "complete"  # once the last launch ends
    r = xbench(
        "fit",
        tmp_path / "p",
        tmp_path / "k",
        "--base",
        "profiles/h100-priors.toml",
        "--out",
        tmp_path / "here.toml",
    )
    assert r.returncode == 0, r.stderr
    assert (
        "shm" in r.stdout and "held-out error" in r.stdout and "compute_per_row_token" in r.stdout
    )
    assert "splice_per_token" in r.stdout  # T_splice, for fetches sent page by page
    assert "merge_per_token" in r.stdout  # merges timed after attentions over each chunk
    merges = kernel_samples[kernel_samples.kernel == "merge"]
    assert set(merges[merges.wait_us == 0].after_tokens) == {64, 256, 1024}
    assert set(merges[merges.wait_us > 0].after_tokens) == {0}  # after a wait, nothing else
    assert "merge_wait_t0" in r.stdout  # what a merge adds after its wait for an answer
    fitted = load_profile(tmp_path / "here.toml").provenance["conditions"]
    assert fitted["cpu_attention"] == "torch" and fitted["kernel_layout"] == "peer waiting in MPI"
    assert fitted["mpi_library"] and fitted["cpu_model"]
    r = xbench(
        "validate",
        "--profile",
        tmp_path / "here.toml",
        "--rows",
        "1,2",
        "--chunk",
        "128",
        "--heads",
        "4",
        "--samples",
        "2",
        "--rounds",
        "1",
        "--runs",
        "2",
        "--cpu-attention",
        "torch",
        "--out",
        tmp_path / "v",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr  # fitted and validated under the same conditions
    summary = json.loads(r.stdout)
    for row in summary:  # the model's phases add up to its prediction
        phases = [row[f"predicted_{name}_us"] for name in PHASES[row["option"]]]
        assert sum(phases) == pytest.approx(row["predicted_us"], rel=1e-9)
        assert row[f"measured_{PHASES[row['option']][0]}_us"] > 0
    assert {row["option"] for row in summary} == {"route", "fetch", "local"} and all(
        row["correct"] for row in summary
    )
    assert all(row["predicted_us"] > 0 and row["measured_us"] > 0 for row in summary)
    assert (tmp_path / "v" / "validate_summary.parquet").exists()
    assert read_run_meta(tmp_path / "v")["status"] == "complete"
    # the table a person reads: 80 columns, nothing cut
    from conftest import assert_fits_80, render_at

    from xbench.cli.validate import _table
    from xbench.results.schema import VALIDATE_SUMMARY

    frame = read_table([tmp_path / "v" / "validate_summary.parquet"], VALIDATE_SUMMARY)
    shown = [render_at(w, lambda: _table(frame, "here", "shm", tmp_path / "v")) for w in (80, 250)]
    assert_fits_80(*shown)
    assert "measured us" in shown[0] and "matches" in shown[0]
    samples = pd.read_parquet(tmp_path / "v" / "validate_samples")
    assert set(samples.requester) == {0, 1}  # the ranks took turns asking
    assert set(samples.process_run) == {0, 1}
    # each sample's phases are timed and add up to about its time (the rest: loop overhead)
    for option, names in PHASES.items():
        rows = samples[samples.option == option]
        timed = rows[[f"{n}_us" for n in names]]
        assert timed.notna().all().all() and (timed >= 0).all().all()
        total = timed.sum(axis=1)
        assert ((total <= rows.value * 1.02) & (total >= rows.value * 0.6)).all(), option
    # by default a fetch sends each of the chunk's 2 pages (64 tokens) as its own message
    assert set(samples[samples.option == "fetch"].segments) == {2}
    r = xbench(
        "validate",
        "--profile",
        tmp_path / "here.toml",
        *("--rows", "1", "--chunk", "128", "--heads", "4", "--samples", "1", "--rounds", "1"),
        *("--fetch-layout", "packed", "--out", tmp_path / "v-packed", "--format", "json"),
    )
    assert r.returncode == 0, r.stderr
    packed = {row["option"]: row for row in json.loads(r.stdout)}
    assert packed["fetch"]["segments"] == 1 and all(row["correct"] for row in packed.values())
    measured = samples[~samples.warmup]
    assert measured.groupby(["option", "rows", "process_run"]).size().eq(2).all()
    # validated on the other CPU path than the one fitted: one warning line says so
    if cpu_bf16.unavailable_because() is None:
        r = xbench(
            "validate",
            "--profile",
            tmp_path / "here.toml",
            *("--rows", "1", "--chunk", "128", "--heads", "4", "--samples", "1", "--rounds", "1"),
            *("--cpu-attention", "c-bf16", "--out", tmp_path / "v-c", "--format", "json"),
        )
        assert r.returncode == 0, r.stderr
        warned = [ln for ln in r.stderr.splitlines() if "warning" in ln]
        assert len(warned) == 1 and "cpu_attention torch there, c-bf16 here" in warned[0]
    r = xbench(
        "decide",
        "--profile",
        tmp_path / "here.toml",
        "--payload",
        "1152B",
        "--heads",
        "4",
        "--fabric",
        "shm",
        "--chunk",
        "256",
        "--out",
        tmp_path / "d.parquet",
        "--format",
        "json",
    )
    assert r.returncode == 0 and {row["fabric_chosen"] for row in json.loads(r.stdout)} == {"shm"}


def test_validation_errors_are_what_validate_reports():
    from xbench.validate import validation_errors

    summary = pd.DataFrame(
        {"option": ["route", "fetch", "local", "route"], "error": [-0.1, 0.05, 0.02, 0.3]}
    )
    errors = validation_errors(summary)
    assert errors["mape"] == pytest.approx(0.1175) and errors["worst"] == pytest.approx(0.3)
    assert errors["by_option"] == pytest.approx({"route": 0.2, "fetch": 0.05, "local": 0.02})
