"""xbench report (issue 20): every figure holds its data, the HTML page needs no network."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from conftest import another_run

from xbench.report import figures
from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import read_run_meta, read_table, write_table

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi


def coloured_share(png) -> float:
    """The share of pixels in a saturated colour: the plotted data (axes, ticks, labels and
    grid are black, grey or white)."""
    image = matplotlib.image.imread(png)[..., :3]
    hsv = matplotlib.colors.rgb_to_hsv(image)
    return float(((hsv[..., 1] > 0.3) & (hsv[..., 2] > 0.2)).mean())


class _Sources(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources, self.links = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("img", "script", "iframe") and "src" in attrs:
            self.sources.append(attrs["src"])
        if tag == "link" and "href" in attrs:
            self.links.append(attrs["href"])


@pytest.mark.mpi_inputs  # MPI ranks make the runs it reads; report starts none
def test_report_draws_every_kind_of_result(xbench, tmp_path):
    quick = ["--samples", "3", "--warmups", "1"]
    probe = tmp_path / "probe"
    # eight samples a case: enough for compare's rank test on one launch to tell 2x
    r = xbench(
        "probe", "-p", "latency,bandwidth,rtt", "--sizes", "8B:64KiB", "--rows", "1,8",
        "--samples", "8", "--warmups", "1", "--out", probe,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    kernel = tmp_path / "kernel"
    r = xbench(
        "kernel",
        *("--threads", "1", "--heads", "4", "--rows", "1,4", "--chunk", "64,256"),
        *("--kernels", "partial_attention", *quick, "--min-sample-time", "3ms", "--out", kernel),
    )
    assert r.returncode == 0, r.stderr
    profile = tmp_path / "here.toml"
    r = xbench("fit", probe, kernel, "--base", "h100-priors", "--out", profile)
    assert r.returncode == 0, r.stderr
    validate = tmp_path / "validate"
    r = xbench(
        "validate",
        *("--profile", profile, "--rows", "1", "--chunk", "128", "--heads", "4"),
        *("--samples", "1", "--rounds", "1", "--out", validate),
    )
    assert r.returncode == 0, r.stderr
    slow = another_run(probe, tmp_path / "slow")
    meta = read_run_meta(slow)
    # each case (a part file) scaled past its own spread: every slowed sample beyond every
    # original, so the verdicts cannot hang on how loaded the machine was while it probed
    for part in sorted((slow / PROBE_SAMPLES).glob("part-*.parquet")):
        frame = read_table([part], PROBE_SAMPLES)
        spread = frame.value.max() / frame.value.min()
        factor = max(2.0, 1.1 * spread)
        write_table(part, PROBE_SAMPLES, frame.assign(value=frame.value * factor), meta)
    comparison = tmp_path / "cmp.parquet"
    r = xbench("compare", probe, slow, "--out", comparison)
    assert r.returncode == 1, r.stderr  # the regression's exit
    verdicts = pd.read_parquet(comparison)
    rates = verdicts.unit.str.contains("/s")  # more MB/s is faster, more us slower
    said = verdicts[["case", "verdict"]].to_string()
    # never the wrong way; nearly every case the right way
    assert not (verdicts[rates].verdict == "slower").any(), said
    assert not (verdicts[~rates].verdict == "faster").any(), said
    assert (verdicts[rates].verdict == "faster").mean() >= 0.8, said
    assert (verdicts[~rates].verdict == "slower").mean() >= 0.8, said
    simulation = tmp_path / "sim.parquet"
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "agentic-codebase.toml"
    r = xbench("simulate", scenario, "--requests", "300", "--out", simulation)
    assert r.returncode == 0, r.stderr
    prefill = tmp_path / "prefill.parquet"
    scenario = scenario.with_name("prefill-as-a-service.toml")
    r = xbench("simulate", scenario, "--requests", "500", "--out", prefill)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "report"
    r = xbench(
        "report", probe, kernel, validate, profile, comparison, simulation, prefill, "--out", out
    )
    assert r.returncode == 0, r.stderr
    pngs = sorted(out.glob("*.png"))
    kinds = {p.name.split("-")[0] for p in pngs}
    assert kinds == {
        "fabrics",
        "roundtrips",
        "roofline",
        "validate",
        "compare",
        "decisions",
        "breakeven",
        "simulate",
        "prefill",
        "saturation",  # the report simulate wrote beside the prefill table
    }, kinds
    for png in pngs:
        image = matplotlib.image.imread(png)
        assert image.shape[0] > 200 and image.shape[1] > 200
        assert np.ptp(image[..., :3]) > 0.5, png  # not one flat colour
        assert coloured_share(png) > 0.0005, png  # the data, not only axes
    page = (out / "index.html").read_text()
    parser = _Sources()
    parser.feed(page)
    assert len(parser.sources) == len(pngs) and not parser.links
    assert all(src.startswith("data:image/png;base64,") for src in parser.sources)
    assert "http://" not in page and "https://" not in page
    assert "report:" in r.stdout and str(out / "index.html") in r.stdout


def test_report_draws_the_reports_a_simulation_wrote_beside_its_table(xbench, tmp_path):
    """moska-shared-chunk's sharing report (its calls and steps in one figure, the knee,
    ridge and bounds from the run metadata) and span-fanout's hit rates, drawn with their
    simulation's table, or alone from the report's own file."""
    for name in ("moska-shared-chunk", "span-fanout"):
        r = xbench("simulate", name, "--requests", "300", "--out", tmp_path / f"{name}.parquet")
        assert r.returncode == 0, r.stderr
    out = tmp_path / "report"
    r = xbench(
        "report", tmp_path / "moska-shared-chunk.parquet", tmp_path / "span-fanout.parquet",
        "--out", out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    pngs = sorted(out.glob("*.png"))
    assert {p.name.split("-")[0] for p in pngs} == {"simulate", "sharing", "spanhits"}
    for png in pngs:
        assert coloured_share(png) > 0.0005, png
    alone = tmp_path / "alone"
    r = xbench("report", tmp_path / "moska-shared-chunk.sharing-calls.parquet", "--out", alone,
               "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [p.name.split("-")[0] for p in alone.glob("*.png")] == ["sharing"]
    # what the screen lists, as JSON: each figure, then the page
    made = json.loads(r.stdout)
    assert [Path(m["path"]).name for m in made[:-1]] == [p.name for p in alone.glob("*.png")]
    assert made[-1] == {"title": "report", "path": str(alone / "index.html")}


def test_the_blank_check_tells_axes_from_data(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_xscale("log")
    ax.grid(True)
    ax.set_title("axes only")
    fig.savefig(tmp_path / "axes.png")
    ax.plot([1, 10], [1, 2], "o-")  # two points and a line: the least a figure draws
    fig.savefig(tmp_path / "data.png")
    assert coloured_share(tmp_path / "axes.png") == 0
    assert coloured_share(tmp_path / "data.png") > 0.0005


def test_report_bad_input(xbench, tmp_path):
    r = xbench("report", tmp_path / "none", "--out", tmp_path / "r")
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    r = xbench("report", tmp_path / "x.parquet", "--out", tmp_path / "r")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "x.parquet is not a readable Parquet file" in r.stderr  # said as such, not as foreign
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run.json").write_text(json.dumps({"command": "decide"}))
    r = xbench("report", empty, "--out", tmp_path / "r")
    assert r.returncode == 2 and "not something xbench report draws" in r.stderr
    assert not (tmp_path / "r").exists()  # refused before the folder was made


def test_a_report_that_draws_nothing_says_why_and_leaves_what_was_there(xbench, tmp_path):
    """A kernel run without ceilings has samples but no roofline. The report said "pass
    runs that hold samples", left an empty --out behind, and with --force had already
    deleted the report there's figures."""
    kernel = tmp_path / "kernel"
    r = xbench(
        "kernel", "--no-ceilings", "--kernels", "merge", "--rows", "4", "--chunk", "64",
        "--heads", "4", "--samples", "1", "--min-sample-time", "1ms", "--idle", "none",
        "--merge-wait", "none", "--out", kernel,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = xbench("report", kernel, "--out", tmp_path / "new")
    assert r.returncode == 2 and "nothing to draw" in r.stderr
    assert "without --no-ceilings" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "new").exists()
    report = tmp_path / "report"
    r = xbench("report", "profiles/h100-priors.toml", "--out", report)
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in report.iterdir()}
    assert {"decisions-1.png", "breakeven-1.png", "index.html"} <= set(before)
    r = xbench("report", kernel, "--out", report, "--force")
    assert r.returncode == 2 and "nothing to draw" in r.stderr
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before  # nothing lost


def test_round_trip_figure_draws_the_warm_refit_beside_the_profiles_segments():
    """Where a fabric's segments came from cold caches, the round trips are drawn against
    both models: the profile's and the refit from warm latency."""
    columns = ["fabric", "rows", "out_bytes", "back_bytes", "measured_us", "low_us"]
    columns += ["high_us", "predicted_us", "error"]
    measured = [(1, 3.0), (8, 9.0), (64, 19.0)]
    cold = pd.DataFrame(
        [("shm", b, 1152.0 * b, 1028.0 * b, t, t * 0.9, t * 1.1, 5 * t, 4.0) for b, t in measured],
        columns=columns,
    )
    warm = cold.assign(predicted_us=cold.measured_us * 1.02, error=0.02)
    fig = figures.round_trip_figure(cold, 0.07, warm)
    time_ax, error_ax = fig.axes[0], fig.axes[1]
    labels = [line.get_label() for line in time_ax.get_lines()]
    assert "model (fitted segments)" in labels
    assert "model (refitted from warm latency)" in labels
    assert len(error_ax.get_lines()) == 3  # the profile's error, the refit's, the zero line
    assert len(figures.round_trip_figure(cold, 0.07).axes[1].get_lines()) == 2


def test_report_draws_topk_routing_against_a_copy_each(xbench, tmp_path):
    out = tmp_path / "topk.parquet"
    assert xbench("simulate", "moska-topk", "--requests", "300", "--out", out).returncode == 0
    r = xbench("report", tmp_path / "topk.copies.parquet", "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "rep").glob("*.png")] == ["copies-1-topk.copies.png"]
