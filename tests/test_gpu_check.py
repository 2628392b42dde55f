"""benchmarks/gpu_check.py, the one prepared GPU run, on tiny shapes under the Triton
interpreter: its steps run in their own processes, each under its limit, and it writes a
summary with each step's status and figures. (Its figures come from a GPU: docs/gpu-check.md.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

pytest.importorskip("triton", reason="triton is not installed (pip install '.[test]')")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


def test_tiles_profile_and_device_fit_on_tiny_shapes_write_a_summary(tmp_path):
    out = tmp_path / "gc"
    done = _run(str(out), "--device", "cpu", "--steps", "device-fit,tiles,profile")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    steps = json.loads((out / "steps.json").read_text())
    assert [(s["step"], s["status"]) for s in steps] == [
        ("device-fit", "ok"),
        ("tiles", "ok"),
        ("profile", "ok"),
    ]
    # the device terms fitted onto the priors' fabrics, measured, with what timed them
    from xbench.core.profile import load_profile

    fitted = load_profile(out / "device-fit.toml")
    assert not fitted.device.compute_per_token.prior and not fitted.device.merge_t0.prior
    assert fitted.fabric("ibgda").overhead.prior  # the fabrics are the priors'
    assert {"device", "backend", "torch"} <= fitted.provenance["software"].keys()
    summary = (out / "summary.md").read_text()
    assert "| tiles | ok |" in summary and "best partial_attention" in summary
    # each verdict whole in the summary, with what it wrapped onto at 80 columns
    lines = (out / "tiles.log").read_text().splitlines()
    verdicts = [
        (line, after)
        for line, after in zip(lines, lines[1:], strict=False)
        if line.startswith("best ") and after.startswith("    ")
    ]
    assert verdicts and all(f"{line}\n{after}" in summary for line, after in verdicts)
    # the profile's table per shape (on a GPU its rows are the split and combine kernels)
    assert (
        "== partial_attention rows=1 chunk=64 dense bf16: 10 calls"
        in (out / "profile.log").read_text()
    )
    timings = json.loads((out / "tiles.json").read_text())["timings"]
    assert {tuple(t["tile"]) for t in timings} == {(16, 16, 4, 1, 1)}
    # the one-row decomposition ran its calls; a CPU profile has no kernel times to fit
    profile = (out / "profile.log").read_text()
    assert "== one row, 2 splits: the split kernel's fixed cost and cost a tile" in profile
    assert "split kernel: no device times here" in profile


def test_the_gluon_step_checks_its_bits_then_times_it_beside_triton(tmp_path):
    """On a CPU the gluon backend runs triton's kernels (Gluon has no interpreter): the step's
    plumbing, its tests' verdict and the two backends' table in the summary, and each
    sample's plan saying which kernel ran."""
    out = tmp_path / "gc"
    done = _run(str(out), "--device", "cpu", "--steps", "gluon")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    section = summary.split("## gluon", 1)[1]
    # each kernel's tests (skipped without a GPU) under its own line
    for kernel in ("scorer", "overlap"):
        assert re.search(
            rf"^== gluon {kernel}: tests\n\d+ skipped, \d+ deselected in ", section, re.M
        )
    # each kernel's table beside triton's, whole
    assert len(re.findall(r"^gluon +dense +1 +64 ", section, re.M)) == 2, section
    assert len(re.findall(r"^triton +dense +1 +64 ", section, re.M)) == 2, section
    assert section.count("bound = max") == 2 and section.count("samples: ") == 2, section
    from xbench.results.store import read_table

    scorer = read_table(out / "gluon-kernels-scorer", "kernel_samples")
    plans = scorer.groupby("backend")["plan"].first()
    assert plans["gluon"].startswith("triton (Gluon has no interpreter): tile "), plans
    assert plans["gluon"].endswith(plans["triton"])
    # each kernel's one-row costs (on a CPU the interpreter's triton kernels, no device times)
    for kernel in ("scorer", "overlap"):
        assert f"== the gluon backend's {kernel} kernel" in section, section
    assert section.count("split kernel: no device times here") == 2, section
    overlap = read_table(out / "gluon-kernels-overlap", "kernel_samples")
    assert set(overlap["backend"]) == {"torch", "gluon", "triton"}  # torch's: the ceilings
    # the keep rule's verdicts: where triton's kernel ran for the gluon backend, none
    for kernel in ("scorer", "overlap"):
        verdict = f"verdict {kernel}: its kernel did not run (triton (Gluon has no interpreter)"
        assert verdict in section, section


def _gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_a_gluon_kernel_is_kept_only_faster_with_samples_apart_at_each_target_shape():
    """The gluon step's verdicts (docs/gpu-check.md's keep rule): a kernel whose tests
    passed, faster than triton's kernel (timed in the same run) with samples apart at 1 row
    x 32K-64K and 64 rows x 8K-32K; a kernel whose tests failed or did not finish, or that
    ties or loses a shape, stays a candidate; samples the backend took with triton's kernel
    are not judged."""
    import pandas as pd

    gpu_check = _gpu_check()
    shapes = list(gpu_check.KEEP_SHAPES)
    assert shapes == [(1, 32768), (1, 65536), (64, 8192), (64, 32768)]

    def timed(backend, plan, us_by_shape):
        return pd.DataFrame(
            [
                {"backend": backend, "plan": plan, "rows": r, "chunk_tokens": t, "value": us}
                for (r, t), samples in us_by_shape.items()
                for us in samples
            ]
        )

    def log(scorer="12 passed, 7 deselected in 30.1s", overlap="12 passed in 9.9s"):
        """The step's log: each kernel's tests under their line, its other output after."""
        return "\n".join(
            [
                "$ echo ...",
                "== gluon scorer: tests",
                "....",
                scorer,
                "gluon  dense  1 32768  61.0",
                "== gluon overlap: tests",
                overlap,
            ]
        )

    triton = timed("triton", "tile 64,64,8,2,1", {s: [100.0, 101.0, 99.0] for s in shapes})
    scorer = timed("gluon", "gluon scorer 64x64 w4+4+1 s2, 66 splits", {
        s: [60.0, 61.0, 62.0] for s in shapes
    })  # fmt: skip
    overlap = timed("gluon", "gluon overlap 64x64 w8+1 s2, 66 splits", {
        **{s: [70.0, 71.0, 72.0] for s in shapes}, (64, 8192): [95.0, 99.5, 103.0]
    })  # fmt: skip
    dense = {"scorer": pd.concat([scorer, triton]), "overlap": pd.concat([overlap, triton])}
    shares = {"scorer": {s: 0.36 for s in shapes}}
    lines = gpu_check.gluon_verdicts(dense, shares, log())
    assert lines[0].startswith("verdict scorer: keep (docs/gpu-check.md"), lines
    assert "  1x32768: 61.0 us, triton 100.0: faster, samples apart; 36% of the bound" in lines[1]
    assert "(target 35%)" in lines[1] and "(target 40%)" in lines[3]
    assert "verdict overlap: stays a candidate: not faster with samples apart at 64x8192" in lines
    assert (
        "  64x8192: 99.5 us, triton 100.0: faster, samples overlap; no bound measured (target 40%)"
        in " ".join(lines)
    )
    assert not any(line.startswith("first: ") for line in lines)  # one kept
    # both kept: the one with the less time over the four shapes first
    dense["overlap"].loc[dense["overlap"].backend == "gluon", "value"] = 50.0
    lines = gpu_check.gluon_verdicts(dense, shares, log())
    assert [line for line in lines if line.startswith(("verdict", "first"))] == [
        "verdict scorer: keep (docs/gpu-check.md: first in gluon_backend.KERNELS, auto on 9.x)",
        "verdict overlap: keep (docs/gpu-check.md: first in gluon_backend.KERNELS, auto on 9.x)",
        "first: overlap (the less time over the shapes above)",
    ]
    # each kernel's failures are those under its own tests' line
    failed = "FAILED tests/test_gluon_kernels.py::test_its_kernels_match[scorer-4-16-p0-503] - x"
    text = log(scorer=f"{failed}\n{failed}\n2 failed, 10 passed in 30.1s")
    assert [gpu_check.failed_tests(text, k) for k in ("scorer", "overlap")] == [2, 0]
    lines = gpu_check.gluon_verdicts(dense, shares, text)
    assert "verdict scorer: stays a candidate: 2 of its tests failed" in lines
    assert any(line.startswith("verdict overlap: keep") for line in lines)
    # tests stopped at their limit (a kernel that deadlocked): no closing count under its
    # line; the other kernel's count is not taken for it
    text = log(scorer="....")
    assert [gpu_check.failed_tests(text, k) for k in ("scorer", "overlap")] == [None, 0]
    assert "verdict scorer: stays a candidate: its tests did not finish" in (
        gpu_check.gluon_verdicts(dense, shares, text)
    )
    assert gpu_check.failed_tests("", "overlap") is None  # never started
    # the backend took triton's kernel, or triton was not timed, or nothing was: no verdict
    fallback = timed("gluon", "triton (a cpu tensor): tile 64,64,8,2,1", {shapes[0]: [1.0]})
    lines = gpu_check.gluon_verdicts({"scorer": pd.concat([fallback, triton])}, {}, log())
    assert lines == [
        "verdict scorer: its kernel did not run (triton (a cpu tensor): tile 64,64,8,2,1): "
        "nothing to judge",
        "verdict overlap: not timed, stays a candidate",
    ]
    lines = gpu_check.gluon_verdicts({"scorer": scorer}, {}, log())
    assert lines[0] == "verdict scorer: triton's kernel was not timed: nothing to judge"
    # a shape not timed is not won
    lines = gpu_check.gluon_verdicts(
        {"scorer": pd.concat([scorer, triton[triton.rows == 1]])}, {}, log()
    )
    assert (
        lines[0]
        == "verdict scorer: stays a candidate: not faster with samples apart at 64x8192, 64x32768"
    )
    assert "  64x8192: not timed by triton" in lines


def test_a_step_past_the_budget_is_reported_not_run(tmp_path):
    out = tmp_path / "gc"
    done = _run(str(out), "--device", "cpu", "--steps", "refusals", "--budget", "1")
    steps = json.loads((out / "steps.json").read_text())
    assert steps == [{"step": "refusals", "status": "not run (budget spent)", "seconds": 0}]
    assert done.returncode == 1


def test_a_used_folder_and_an_unknown_step_are_refused(tmp_path):
    (tmp_path / "old.log").write_text("kept")
    done = _run(str(tmp_path), "--device", "cpu")
    assert done.returncode == 2 and "not empty" in done.stderr
    assert (tmp_path / "old.log").read_text() == "kept"
    done = _run(str(tmp_path / "new"), "--steps", "sweep,warp")
    assert done.returncode == 2 and "unknown step warp" in done.stderr


def test_validate_predicts_with_the_profile_shipped_for_the_gpu_when_the_run_fits_none():
    """A run without ``device-fit`` (an H200's, docs/gpu-check.md) checks validate's compute
    phases against the terms shipped for that kind of GPU, not against the priors."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    profiles = SCRIPT.parents[1] / "profiles"
    assert gpu_check.shipped_profile_for("NVIDIA H200") == profiles / "h200.toml"
    assert gpu_check.shipped_profile_for("NVIDIA H200 NVL") == profiles / "h200.toml"
    # an H100's once an H100 run has shipped profiles/h100.toml (issue 42), the priors until
    h100 = profiles / "h100.toml"
    expected = h100 if h100.exists() else gpu_check.PRIORS
    assert gpu_check.shipped_profile_for("NVIDIA H100 80GB HBM3") == expected
    # a name that only contains one, another GPU, none: the priors
    for name in ("NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", ""):
        assert gpu_check.shipped_profile_for(name) == gpu_check.PRIORS, name
    command = dict((n, c) for n, _, c in gpu_check.steps(Path("/tmp/gc"), cpu=True))["validate"]
    assert "h100-priors.toml" in command and "device-fit.toml" in command


def test_the_split_kernels_fixed_cost_and_cost_a_tile_come_from_a_line_fit():
    """The profile step's one-row decomposition: kernel times a launch read from a torch
    profile by name (none from a CPU-only profile), and the least-squares line in us a call
    and us a 64-token tile; an H200's sweep (2, 8, 16 tiles a program: 29.5, 50.4, 80.3
    us a whole call) gives about 22 us + 3.6 us a tile."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64) @ torch.ones(64)
    assert gpu_check.kernel_device_us(prof) == {}
    # the column the step sorts its tables by is one this torch's profile has
    prof.key_averages().table(sort_by=gpu_check.self_device_total(), row_limit=1)
    # an operator the profile holds, but with no device time: not a kernel's
    assert any("matmul" in e.key for e in prof.key_averages())
    assert gpu_check.kernel_device_us(prof, names=("matmul",)) == {}
    fixed, per_tile = gpu_check.fixed_and_per_tile([64, 256, 1024], [12.0, 18.0, 42.0])
    assert (round(fixed, 6), round(per_tile, 6)) == (10.0, 2.0)
    fixed, per_tile = gpu_check.fixed_and_per_tile([128, 512, 1024], [29.5, 50.4, 80.3])
    assert 21 < fixed < 23 and 3.5 < per_tile < 3.7
    # a 64 x 64 tile: 64 x 64 x 2 x (576 + 512) = 8,912,896 FLOP; 3.62 us a tile over an
    # H200's 132 SMs is 325 TFLOP/s, 41 % of the 794 TFLOP/s matmul rate it measured
    assert gpu_check.tile_rate(1.0, 64) == pytest.approx(8.912896)
    line = gpu_check.tile_rate_line(3.62, 64, 132)
    assert line == "the tile: 2.46 TFLOP/s a program, 325 over 132 SMs (FlashMLA: 660 on an H800)"
    # whole at 80 columns, and in the gluon step's summary beside the line it follows
    assert len(line) <= 80
    costs = "split kernel: 19.6 us a call + 3.62 us a 64-token tile\n" + line
    assert gpu_check._gluon_costs(f"noise\n{costs}\nmore noise") == costs.splitlines()
