"""The example CI jobs in docs/ci-examples (issue 20): their syntax, and that the sbatch job
is exactly what ``xbench slurm check`` writes."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from conftest import ROOT

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

EXAMPLES = ROOT / "docs" / "ci-examples"
# The site's folders, each overridable from the environment at submission (the Slurm
# tests run the script unedited on their own cluster that way)
SBATCH_ARGS = [
    *("slurm", "check", "--baseline", "${XBENCH_BASELINE:-/shared/xbench/baselines/probe-ib}"),
    *("--sweep", "probe", "--launches", "3", "--nodes", "2", "--gpus-per-node", "8"),
    *("--partition", "gpu", "--time", "01:00:00", "--venv", "${XBENCH_VENV:-/shared/xbench/.venv}"),
    *("--results", "${XBENCH_NIGHTLY:-/shared/xbench/nightly}/${SLURM_JOB_ID}-${XBENCH_STARTED}"),
    *("--srun-mpi", "pmix"),  # the cluster's Open MPI; auto would take the MPI loaded here
]


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_sbatch_example_is_what_xbench_slurm_check_writes(xbench, tmp_path):
    out = tmp_path / "nightly.sbatch"
    r = xbench(*SBATCH_ARGS, "--out", out)
    assert r.returncode == 0, r.stderr
    committed = (EXAMPLES / "nightly-check.sbatch").read_text()
    assert out.read_text() == committed, "regenerate: xbench " + " ".join(SBATCH_ARGS)
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    directives = [ln.split()[1] for ln in committed.splitlines() if ln.startswith("#SBATCH")]
    assert "--nodes=2" in directives and "--ntasks-per-node=1" in directives
    assert all(d.startswith("--") and ("=" in d or d == "--exclusive") for d in directives)
    assert 'xbench probe --config-from "$BASELINE" --process-run "$launch"' in committed
    assert "for launch in $(seq 0 2)" in committed
    assert 'xbench compare "$BASELINE"' in committed and "--format junit" in committed
    assert committed.rstrip().endswith('exit "$status"')


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_slurm_check_reads_the_baseline_when_it_can(xbench, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    meta = {"command": "kernel", "run_id": "k1", "config": {"runs": 1, "process_run": 0}}
    (base / "run.json").write_text(json.dumps(meta))
    r = xbench("slurm", "check", "--baseline", base, "--nodes", "1", "--out", tmp_path / "k.sbatch")
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "k.sbatch").read_text()
    assert "srun --nodes=1 --ntasks=1" in script and "xbench kernel --config-from" in script
    r = xbench("slurm", "check", "--baseline", base, "--sweep", "probe", "--out", tmp_path / "x")
    assert r.returncode == 2 and "is a kernel run" in r.stderr
    r = xbench("slurm", "check", "--baseline", tmp_path / "nowhere", "--out", tmp_path / "y")
    assert r.returncode == 2 and "--sweep" in r.stderr


def test_pipeline_example_parses_and_runs_check():
    workflow = yaml.safe_load((EXAMPLES / "nightly-check.yml").read_text())
    triggers = workflow.get("on") or workflow.get(True)  # YAML 1.1 reads a bare `on` as true
    assert triggers["schedule"][0]["cron"]
    job = workflow["jobs"]["check"]
    assert "self-hosted" in job["runs-on"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "$XBENCH check" in runs and "--report-dir" in runs and "GITHUB_STEP_SUMMARY" in runs
    uses = {step.get("uses", "").split("@")[0] for step in job["steps"]}
    assert {"actions/upload-artifact", "mikepenz/action-junit-report"} <= uses
    junit = next(s for s in job["steps"] if s.get("uses", "").startswith("mikepenz"))
    assert junit["with"]["report_paths"].endswith("compare.junit.xml")
