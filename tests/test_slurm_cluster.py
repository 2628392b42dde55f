"""xbench's cluster path under a real Slurm (issue 40): a controller and two slurmd nodes
started here (tests/slurm_cluster.py), each node a host of its own behind a shaped link;
sbatch scripts written by ``xbench slurm`` run end to end, as does the shipped nightly
example. Needs root and Debian's Slurm packages (``bash .ci/run`` installs them); skipped
with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest
from conftest import BIN, ROOT, run_xbench
from shaped_fit import assert_fit_finds, stolen_while
from slurm_cluster import LINK, SlurmCluster, why_not

from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import read_run_meta, read_table

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = [pytest.mark.slurm, pytest.mark.nompi]
RATE_BITS = 200e6
GOODPUT = RATE_BITS / 8 * 1448 / 1514  # TCP payload per Ethernet frame at MTU 1500
VENV = str(BIN.parent)  # this suite's environment, activated by the scripts on the nodes
# the Open MPI wheel's own PMIx lacks the munge security component Slurm's PMIx offers
# first, and says so in a help text it cannot find; native is what it then uses anyway
QUIET_PMIX = {"PMIX_MCA_psec": "native"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    try:
        started = SlurmCluster(tmp_path_factory.mktemp("slurm"), form="hosts", rate_bits=RATE_BITS)
        started.start()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        # network namespaces refused: both nodes on this host, one hostname
        fallback = SlurmCluster(tmp_path_factory.mktemp("slurm-local"), form="local")
        fallback.reason = f"two hosts could not be made here ({str(exc).splitlines()[0]})"
        started = fallback.start()
    yield started
    started.stop()


def compared_cases(folder) -> int:
    """The cases a check compared, after making sure its two reports agree and neither is
    the one-case "not comparable" page: JUnit testcases, Markdown table rows."""
    junit = ET.parse(folder / "compare.junit.xml").getroot()
    assert not junit.findall(".//error"), ET.tostring(junit, encoding="unicode")[:2000]
    cases = len(junit.findall(".//testcase"))
    lines = (folder / "compare.md").read_text().splitlines()
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| case |")]
    assert len(rows) == cases, lines
    return cases


def slurm_env(cluster, **extra) -> dict:
    return {**cluster.env, **QUIET_PMIX, **extra}


def xbench_slurm(cluster, tmp_path, kind, *args, timeout=300):
    """``xbench slurm KIND ARGS --wait`` from ``tmp_path`` (where the job's output lands)."""
    script = tmp_path / f"{kind}.sbatch"
    r = run_xbench(
        "slurm",
        kind,
        *("--venv", VENV, "--time", "00:10:00", "--out", script, "--format", "json", "--wait"),
        *args,
        env=slurm_env(cluster),
        timeout=timeout,
        cwd=tmp_path,
    )
    answer = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    output = answer.get("output")
    said = open(output).read()[-3000:] if output and os.path.exists(output) else r.stderr
    said += hang_reports(tmp_path)
    return r, answer, said


def hang_reports(folder) -> str:
    """The reports of ranks whose case hung under ``folder`` (each rank's stacks and, over
    TCP, the connection's state), for a failure's message."""
    return "".join(f"\n{p}:\n{p.read_text()[:3000]}" for p in folder.rglob("hang-rank*.txt"))


def probe_between_nodes(cluster, folder):
    """A TCP probe between the two nodes under sbatch, in the GPU shape xbench slurm writes
    by default (8 GPUs a node, one a task, bound closest): the fake GPUs schedule it.
    Returns the probe's folder and the hypervisor's share of the CPUs during it."""
    folder.mkdir(parents=True, exist_ok=True)  # the job's script and output land there
    sweep = ["--transport", "tcp", "--tcp-interface", LINK, "--fabric", "tcp"]
    # nine samples: a median the VM's short stalls (two samples of four, seen) do not move
    sweep += ["--sizes", "128KiB:2MiB", "--pattern", "latency", "--samples", "9", "--warmups", "1"]
    job = ["probe", "--nodes", "2", "--results", folder / "job", "--", *sweep]
    (r, answer, said), stolen = stolen_while(xbench_slurm, cluster, folder, *job)
    assert r.returncode == 0 and answer["state"] == "COMPLETED", said
    return folder / "job" / "probe", stolen


@pytest.fixture(scope="module")
def shaped_sitting(cluster, tmp_path_factory):
    """The module's probe between the nodes, and the hypervisor's share during it."""
    if cluster.form != "hosts":
        pytest.skip(cluster.reason)
    return probe_between_nodes(cluster, tmp_path_factory.mktemp("shaped"))


@pytest.fixture(scope="module")
def shaped_probe(shaped_sitting):
    return shaped_sitting[0]


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_two_nodes_are_two_hosts_and_the_fit_finds_the_shaped_link(
    cluster, shaped_sitting, xbench, tmp_path
):
    from mpi4py import MPI

    from xbench.cluster.slurm import srun_mpi_for

    meta = read_run_meta(shaped_sitting[0])
    assert sorted(meta["hosts"]) == ["xbn0", "xbn1"]
    assert set(meta["pair_labels"].values()) == {"inter-node"}
    # the plugin srun gave the ranks, chosen from the MPI loaded here, is in the run
    assert meta["launcher"] == f"srun --mpi={srun_mpi_for(MPI.Get_library_version())}"
    assert meta["mpi_thread_level"] == "funneled"

    def sit(n: int):  # the module's probe, then (where its fit missed) one of this test's
        if n == 0:
            return shaped_sitting
        return probe_between_nodes(cluster, tmp_path / f"again-{n}")

    assert_fit_finds(GOODPUT, sit, xbench, tmp_path)


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_check_of_a_baseline_made_with_mpiexec_on_the_node(cluster, tmp_path):
    """The baseline: xbench probe --np 2 (the MPI's own mpiexec) on node xbn0, as a user
    logged in there runs it; the check: the same sweep as srun steps on that node. Same host,
    same thread level: comparable, with Markdown and JUnit reports."""
    base = tmp_path / "base"
    sweep = ["--sizes", "8B:4KiB", "--pattern", "latency", "--samples", "5", "--warmups", "1"]
    on_node = cluster.on_node(0) if cluster.form == "hosts" else []
    r = subprocess.run(
        [*on_node, str(BIN / "xbench"), "probe", "--np", "2", *sweep, "--out", str(base)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, **slurm_env(cluster)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert read_run_meta(base)["launcher"] == "mpiexec"
    # the check must land on the baseline's node
    drain = ["scontrol", "update", f"nodename={cluster.nodes[1]}"]
    env = {**os.environ, **cluster.env}
    subprocess.run([*drain, "state=drain", "reason=xbench-test"], check=True, env=env)
    try:
        r, answer, said = xbench_slurm(
            cluster,
            tmp_path,
            "check",
            *("--baseline", base, "--nodes", "1", "--ntasks-per-node", "2"),
            *("--results", tmp_path / "check"),
        )
    finally:
        subprocess.run([*drain, "state=resume"], check=True, env=env)
    # exit 0 (no regression) or 1 (a case slower: this machine is shared): compared either way
    assert answer.get("state") in ("COMPLETED", "FAILED") and r.returncode in (0, 1), said
    sizes = read_table(base, PROBE_SAMPLES).query("pattern == 'latency'").size_bytes.unique()
    assert compared_cases(tmp_path / "check") == len(sizes)


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_one_task_of_a_step_with_a_pmi_launches_the_ranks(cluster, tmp_path):
    """srun -n1 with the MPI's plugin (as a cluster whose MpiDefault gives every step a PMI
    runs any srun) around xbench probe --np 2 was refused, as a world of one rank; the one
    task of a step now starts its ranks, as it did under --mpi=none."""
    from xbench.capabilities import loaded_mpi_library
    from xbench.cluster.slurm import srun_mpi_for

    plugin = srun_mpi_for(loaded_mpi_library(whole=True))
    out = tmp_path / "probe"
    sweep = ["--sizes", "8B", "--pattern", "latency", "--samples", "2", "--warmups", "1"]
    r = subprocess.run(
        ["srun", "--nodes=1", "--ntasks=1", f"--mpi={plugin}", str(BIN / "xbench"), "probe"]
        + ["--np", "2", *sweep, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **slurm_env(cluster)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    meta = read_run_meta(out)
    assert meta["ranks"] == 2 and len(set(meta["hosts"])) == 1, meta
    assert len(read_table(out, PROBE_SAMPLES).query("pattern == 'latency'"))


def documented_block() -> str:
    """The sh block of docs/gpu-clusters.md that says what the suite runs on its cluster."""
    text = (ROOT / "docs" / "gpu-clusters.md").read_text()
    after = text.split("What it runs,", 1)[1]
    return after.split("```sh\n", 1)[1].split("```", 1)[0]


@pytest.mark.mpi
@pytest.mark.mpi_default  # the other two-node tests srun each MPI
def test_the_documented_sequence_runs_as_written(cluster, tmp_path):
    """docs/gpu-clusters.md's block, as written, in an empty folder: a probe between the
    nodes, a kernel sweep, a fit of both, validate between the nodes, and the shipped
    nightly check (docs/ci-examples/nightly-check.sbatch, unedited) against the probe. Under
    Open MPI its srun plugin is the one the comment above that line names."""
    from xbench.capabilities import loaded_mpi_library
    from xbench.cluster.slurm import srun_mpi_for

    if cluster.form != "hosts":
        pytest.skip(cluster.reason)
    block = documented_block()
    plugin = srun_mpi_for(loaded_mpi_library(whole=True))
    if plugin != "pmi2":  # the doc's own substitution for Open MPI
        block = block.replace(
            "XBENCH_SRUN_MPI=pmi2 MPICH_CH4_NETMOD=ofi", f"XBENCH_SRUN_MPI={plugin}"
        )
    assert f"SBATCH_PARTITION={cluster.partition} " in block
    env = {**os.environ, **slurm_env(cluster), "VENV": VENV, "REPO": str(ROOT)}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    r = subprocess.run(
        ["bash", "-ex", "-c", block],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=1200,
    )
    said = r.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in tmp_path.glob("*.out"))
    said += hang_reports(tmp_path)
    traced = [line for line in r.stderr.splitlines() if line.startswith("+ ")]
    # exit 1 from the last line only: the nightly found a case slower (this machine is shared)
    assert r.returncode == 0 or (r.returncode == 1 and "sbatch --wait" in traced[-1]), said
    assert sorted(read_run_meta(tmp_path / "job" / "probe")["hosts"]) == ["xbn0", "xbn1"]
    meta = read_run_meta(tmp_path / "k" / "kernel")
    assert meta["hostname"] in cluster.nodes and meta["config"]["ranks"] == 2
    assert (tmp_path / "cluster.toml").exists()
    assert sorted(read_run_meta(tmp_path / "v" / "validate")["hosts"]) == ["xbn0", "xbn1"]
    (run,) = (tmp_path / "nightly").iterdir()
    assert sorted(read_run_meta(run / "probe")["hosts"]) == ["xbn0", "xbn1"]
    assert set(read_table(run / "probe", PROBE_SAMPLES).process_run) == {0, 1, 2}
    probed = read_table(tmp_path / "job" / "probe", PROBE_SAMPLES).query("pattern == 'latency'")
    assert compared_cases(run) == len(probed.size_bytes.unique())


def test_an_srun_step_without_pmi_is_refused_in_one_line(cluster, tmp_path):
    r = subprocess.run(
        ["srun", "--mpi=none", "--nodes=1", "--ntasks=2", str(BIN / "xbench"), "probe"]
        + ["--out", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cluster.env},
    )
    assert r.returncode != 0
    said = [line for line in r.stderr.splitlines() if line.startswith("xbench: error")]
    assert said and all("without a PMI" in line for line in said), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


def test_sbatch_accepts_the_nightly_example(cluster):
    r = subprocess.run(
        ["sbatch", "--test-only", "--partition", cluster.partition]
        + [str(ROOT / "docs" / "ci-examples" / "nightly-check.sbatch")],
        capture_output=True,
        text=True,
        env={**os.environ, **cluster.env},
    )
    assert r.returncode == 0 and "to start at" in r.stderr, r.stderr


def _dead_pid() -> int:
    """An id no process has now (what a killed test's cluster was named by)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_a_cluster_cleans_what_a_killed_test_left_and_says_so(tmp_path):
    """A test killed before its fixture stopped its cluster left a bridge, a node's network
    namespace and a daemon carrying the cluster's SLURM_CONF; the next cluster's start
    removes them (one line each), and leaves a live test's alone."""
    import subprocess as sp
    import sys

    from slurm_cluster import remove_leftovers

    if os.geteuid() != 0 or sp.run(["ip", "netns", "list"], capture_output=True).returncode:
        pytest.skip("needs root and ip netns (bash .ci/run runs the suite so)")
    dead = _dead_pid()
    root = tmp_path / "old"
    root.mkdir()
    (root / "owner").write_text(str(dead))
    bridge, ns = f"xbr{dead}", f"xbs{dead}0"
    live = "xbr1"  # a live process's (init's): left alone
    daemon = None
    try:
        sp.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        sp.run(["ip", "netns", "add", ns], check=True)
        sp.run(["ip", "link", "add", live, "type", "bridge"], check=True)
        daemon = sp.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            env={**os.environ, "SLURM_CONF": str(root / "slurm.conf")},
        )
        said = remove_leftovers()
        assert daemon.wait(10) == -9  # killed
        assert any(bridge in line for line in said) and any(ns in line for line in said)
        assert any(f"process {daemon.pid}" in line for line in said)
        links = sp.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f" {bridge}:" not in links and f" {live}:" in links
        assert ns not in sp.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        if daemon is not None:
            daemon.kill()
        for args in (["link", "del", bridge], ["netns", "del", ns], ["link", "del", live]):
            sp.run(["ip", *args], capture_output=True)
