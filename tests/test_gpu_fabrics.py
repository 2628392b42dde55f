"""Issue 5 on a machine without a GPU: gloo path of the nccl transport, presets, topology
labels, the sbatch writer, hosts files; GPU runs are marked gpu."""

import json
import re
import shutil
import subprocess

import pytest

from xbench.cluster.slurm import SlurmJob, render
from xbench.errors import XbenchError
from xbench.fabric.gpu import ranks_sharing_a_gpu
from xbench.fabric.presets import check_nccl_log, preset_env
from xbench.fabric.topology import label_pair
from xbench.results.schema import KERNEL_SAMPLES, PROBE_SAMPLES
from xbench.results.store import read_run_meta, read_table

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi

QUICK = ["--samples", "3", "--warmups", "1", "--min-sample-time", "2ms"]


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_nccl_transport_gloo_backend_runs_between_two_ranks(xbench, tmp_path):
    out = tmp_path / "gloo"
    r = xbench(
        "probe",
        "--np",
        "2",
        "--transport",
        "nccl",
        "--backend",
        "gloo",
        "-p",
        "latency,bandwidth,rtt,gather",
        "--sizes",
        "8B,4KiB",
        "--rows",
        "1,4",
        "--blocks",
        "2",
        "--block-size",
        "2KiB",
        *QUICK,
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["transport"] for row in rows} == {"nccl"} and {row["loop"] for row in rows} == {
        "python"
    }
    samples = read_table(out, PROBE_SAMPLES)
    assert set(samples.pattern) >= {"latency", "bandwidth", "rtt", "gather"} and set(
        samples.device
    ) == {"host"}
    meta = read_run_meta(out)
    assert meta["config"]["backend"] == "gloo" and meta["pair_labels"] == {"0-1": "intra-node"}


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_nccl_backend_without_gpu_says_what_to_do(xbench, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = xbench(
        "probe",
        "--np",
        "2",
        "--transport",
        "nccl",
        "--sizes",
        "8B",
        *QUICK,
        "--out",
        tmp_path / "n",
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--backend gloo" in r.stderr.strip().splitlines()[-1]


def test_fabric_presets_force_each_path():
    assert (
        preset_env("nccl", "ib")["NCCL_NET"] == "IB"
        and preset_env("nccl", "ib")["NCCL_P2P_DISABLE"] == "1"
    )
    assert (
        preset_env("nccl", "tcp")["NCCL_NET"] == "Socket"
        and preset_env("nccl", "tcp")["NCCL_IB_DISABLE"] == "1"
    )
    assert preset_env("nccl", "roce")["NCCL_IB_GID_INDEX"] == "3"
    assert preset_env("nvshmem", "ibgda")["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
    assert preset_env("nvshmem", "nvlink")["NVSHMEM_REMOTE_TRANSPORT"] == "none"
    assert preset_env("mpi", "ib")["UCX_TLS"].startswith("rc")
    assert (
        preset_env("nccl", "ib", backend="gloo") == {}
        and preset_env("tcp", "tcp") == {}
        and preset_env("mpi", "shm") == {}
    )
    with pytest.raises(XbenchError, match="no preset"):
        preset_env("nccl", "ibgda")


NCCL_LOG = """
node1:123:140 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
node1:123:140 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1/GDRDMA
"""


def test_nccl_log_check():
    assert check_nccl_log(NCCL_LOG, "ib") == (True, {"NET/IB"})
    ok, seen = check_nccl_log(NCCL_LOG, "tcp")
    assert not ok and seen == {"NET/IB"}
    assert check_nccl_log("NCCL INFO Channel 00 : 0[0] -> 1[1] via P2P/CUMEM/read", "nvlink")[0]
    # a log in which NCCL names no transport is no evidence: it fails (it used to pass)
    assert check_nccl_log("NCCL INFO Bootstrap : Using eth0\n", "ib") == (False, set())
    assert check_nccl_log("", "nvlink") == (False, set())


# GPU topology in the documented format, as captured on an 8-GPU H100 node.
GPU0 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-aaaa",
    "pci_bus_id": "00000000:18:00.0",
    "numa_node": 0,
    "nvlink_peers": ["00000000:2A:00.0", "00000000:3A:00.0"],
    "nearest_nic": "mlx5_0",
}
GPU1 = {
    "index": 1,
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-bbbb",
    "pci_bus_id": "00000000:2A:00.0",
    "numa_node": 0,
    "nvlink_peers": ["00000000:18:00.0"],
    "nearest_nic": "mlx5_1",
}
GPU7 = {
    "index": 7,
    "name": "NVIDIA H100 PCIe",
    "uuid": "GPU-cccc",
    "pci_bus_id": "00000000:DB:00.0",
    "numa_node": 1,
    "nvlink_peers": [],
    "nearest_nic": None,
}


@pytest.mark.parametrize(
    "a, b, label",
    [
        ({"host": "n1", "gpu": GPU0}, {"host": "n1", "gpu": GPU0}, "same-GPU"),
        ({"host": "n1", "gpu": GPU0}, {"host": "n1", "gpu": GPU1}, "nvlink"),
        ({"host": "n1", "gpu": GPU0}, {"host": "n1", "gpu": GPU7}, "same-node-pcie"),
        ({"host": "n1", "gpu": GPU0}, {"host": "n2", "gpu": GPU0}, "inter-node"),
        ({"host": "n1", "gpu": None}, {"host": "n1", "gpu": None}, "intra-node"),
    ],
)
def test_pair_labels(a, b, label):
    assert label_pair(a, b) == label


def test_sbatch_script_is_valid_bash_with_the_srun_line(tmp_path):
    script = render(
        SlurmJob(
            "probe",
            nodes=2,
            gpus_per_node=8,
            ntasks_per_node=1,
            partition="gpu",
            account="lab",
            venv="/shared/venv",
            xbench_args=["--transport", "nccl", "--fabric", "ib"],
        )
    )
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert (
        "#SBATCH --nodes=2" in script
        and "#SBATCH --gpus-per-node=8" in script
        and "#SBATCH --partition=gpu" in script
    )
    srun = [line for line in script.splitlines() if line.startswith("srun")]
    assert srun == [
        'srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 --gpus-per-task=1 --gpu-bind=closest xbench probe --transport nccl --fabric ib --out "$RESULTS/probe"'
    ]
    # the plugin chosen, overridable at submission without an edit
    assert 'SRUN_MPI="${XBENCH_SRUN_MPI:-pmix}"' in script
    kernel = render(SlurmJob("kernel", nodes=1, gpus_per_node=1))
    # the one task gets the node's CPUs: a step's task has one by default
    one = 'srun --nodes=1 --ntasks=1 --cpus-per-task="$SLURM_CPUS_ON_NODE"'
    assert f"{one} --gpus-per-task=1 --gpu-bind=closest xbench kernel" in kernel
    with pytest.raises(XbenchError, match="exactly 2 ranks"):
        render(SlurmJob("validate", nodes=2, ntasks_per_node=4))


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("partition", "a b", "--partition 'a b' is not a Slurm name"),
        ("account", "lab;rm -rf ~", "--account 'lab;rm -rf ~' is not a Slurm name"),
        ("srun_mpi", "pmix; rm -rf ~", "is not an srun MPI plugin"),  # ran in the srun line
        ("results", 'out" ; rm -rf ~ ; "', "cannot be written into the script"),
        ("results", "out/$(whoami)", "cannot be written into the script"),
        ("gpus_per_node", -1, "--gpus-per-node at least 0"),
    ],
)
def test_sbatch_refuses_values_the_script_would_misread_or_run(field, value, words):
    with pytest.raises(XbenchError, match=re.escape(words)):
        render(SlurmJob("probe", **{field: value}))


def test_a_check_job_runs_at_least_one_launch():
    """--launches 0 or below wrote `seq 0 -1`: no launch, then a compare of nothing."""
    for launches in (0, -2):
        with pytest.raises(XbenchError, match=f"--launches {launches}: a probe baseline"):
            render(SlurmJob("check", baseline="/b", sweep="probe", launches=launches))
    assert "$(seq 0 2)" in render(SlurmJob("check", baseline="/b", sweep="probe", launches=3))


def test_sbatch_takes_the_names_slurm_takes(tmp_path):
    script = render(
        SlurmJob(
            "probe",
            partition="gpu-h100,gpu_a100",
            account="lab.x-1",
            srun_mpi="pmix_v4",
            results="/shared/${USER}/nightly/$SLURM_JOB_ID",
        )
    )
    assert "#SBATCH --partition=gpu-h100,gpu_a100" in script
    assert 'SRUN_MPI="${XBENCH_SRUN_MPI:-pmix_v4}"' in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_slurm_cli_writes_and_refuses_submit_without_sbatch(xbench, tmp_path):
    out = tmp_path / "v.sbatch"
    r = xbench(
        "slurm", "validate", "--nodes", "2", "--out", out, "--", "--profile", "profiles/x.toml"
    )
    assert r.returncode == 0, r.stderr
    assert "xbench validate --profile profiles/x.toml" in out.read_text()
    if shutil.which("sbatch") is None:
        r = xbench("slurm", "probe", "--out", tmp_path / "p.sbatch", "--submit")
        assert r.returncode != 0 and "sbatch is not on PATH" in r.stderr


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_hostfile_launch(xbench, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    r = xbench(
        "probe", "--np", "2", "--hostfile", hosts, "--sizes", "8B", *QUICK, "--out", tmp_path / "h"
    )
    assert r.returncode == 0, r.stderr
    # the user's file rewritten in the launcher's own dialect beside the run's log
    log, written = (tmp_path / "h" / "launcher.log").read_text(), tmp_path / "h" / "hosts"
    hydra = f"-f {written}" in log and written.read_text() == "localhost:2\n"
    open_mpi = f"--hostfile {written}" in log and written.read_text() == "localhost slots=2\n"
    assert hydra or open_mpi, log
    r = xbench("probe", "--np", "2", "--hostfile", tmp_path / "nope", "--sizes", "8B")
    assert r.returncode != 0 and "hosts file" in r.stderr


def test_ranks_sharing_a_gpu_are_found_by_host_and_uuid():
    one_node = [("n1", "GPU-a"), ("n1", "GPU-b"), ("n2", "GPU-a")]
    assert ranks_sharing_a_gpu(one_node) == []  # same UUID string on two hosts is two GPUs
    assert ranks_sharing_a_gpu([("n1", "GPU-a"), ("n1", "GPU-a"), ("n1", "GPU-b")]) == [0, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("transport", [["nccl"], ["nvshmem"], ["nvshmem", "--initiator", "device"]])
def test_two_ranks_on_one_gpu_is_a_one_line_error(xbench, tmp_path, transport):
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one GPU")
    if transport[0] == "nvshmem":
        pytest.importorskip("nvshmem.core")
    out = tmp_path / "one"
    r = xbench(
        "probe", "--np", "2", "--transport", *transport, "--sizes", "8B", *QUICK, "--out", out
    )
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "one GPU per rank" in lines[0], r.stderr


@pytest.mark.gpu
def test_nccl_on_two_gpus(xbench, tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    r = xbench(
        "probe",
        "--np",
        "2",
        "--transport",
        "nccl",
        "--fabric",
        "nvlink",
        "--sizes",
        "8B,1MiB",
        *QUICK,
        "--out",
        tmp_path / "g",
    )
    assert r.returncode == 0, r.stderr
    assert set(read_table(tmp_path / "g", PROBE_SAMPLES).device) == {"cuda"}


def test_srun_takes_the_pmi_the_loaded_mpi_speaks():
    """The PyPI mpich wheel has no PMIx: under srun --mpi=pmix its job died ("Runtime
    environment uses unsupported PMI version PMIx", exit 16); Open MPI takes PMIx."""
    from xbench.cluster.slurm import srun_mpi_for

    assert srun_mpi_for("MPICH Version:      5.0.2") == "pmi2"
    assert srun_mpi_for("Open MPI v5.0.8, package: Open MPI ...") == "pmix"
    assert srun_mpi_for("Intel(R) MPI Library 2021.13 for Linux* OS") == "pmi2"
    assert srun_mpi_for("MVAPICH2 Version 2.3.7") == "pmi2"
    assert srun_mpi_for(None) == "pmix"  # nothing loads: Slurm's usual default


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_slurm_writes_the_plugin_it_chose_and_a_folder_of_the_jobs_own(xbench, tmp_path):
    from xbench.capabilities import loaded_mpi_library
    from xbench.cluster.slurm import srun_mpi_for

    out = tmp_path / "p.sbatch"
    r = xbench("slurm", "probe", "--out", out)
    assert r.returncode == 0, r.stderr
    library = loaded_mpi_library(whole=True)
    expected = srun_mpi_for(library)
    script = out.read_text()
    assert f'SRUN_MPI="${{XBENCH_SRUN_MPI:-{expected}}}"' in script
    assert f"srun --mpi={expected} (for the MPI" in r.stdout
    # the mpich wheel (UCX and OFI built) under pmi2: OFI, whose address fits one PMI-1 put
    netmod = 'export MPICH_CH4_NETMOD="${MPICH_CH4_NETMOD:-ofi}"'
    # the wheel's "MPICH Device:" line: "ch4:ucx ofi" from 5.0, "ch4:ofi ucx" in 4.2
    wheel = bool(re.search(r"MPICH Device:\s+ch4:(ucx ofi|ofi ucx)", library))
    assert (netmod in script) == (expected == "pmi2" and wheel), script
    assert ("MPICH_CH4_NETMOD=ofi (" in r.stdout) == (netmod in script)
    # job ids restart with a fresh cluster: the folder also holds the job's start
    assert 'RESULTS="results/slurm-${SLURM_JOB_ID}-${XBENCH_STARTED}"' in script
    started = script.index("XBENCH_STARTED=")
    assert started < script.index('RESULTS="')
    r = xbench("slurm", "probe", "--srun-mpi", "pmix_v4", "--out", tmp_path / "q.sbatch")
    assert "srun --mpi=pmix_v4 (--srun-mpi)" in r.stdout
    q = (tmp_path / "q.sbatch").read_text()
    assert 'SRUN_MPI="${XBENCH_SRUN_MPI:-pmix_v4}"' in q and "MPICH_CH4_NETMOD" not in q


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_ranks_started_from_an_srun_task_start_here_as_outside_slurm(xbench, tmp_path):
    """xbench slurm's kernel step (srun -n1 xbench kernel --np 2, or --runs 2) hung to the time
    limit under MPICH (Hydra asked srun for a step inside the busy one) and failed under
    Open MPI (the step's one slot). The mpiexec xbench starts from an srun task gets the
    environment without Slurm's variables and srun's PMI; a user's PMIx setting stays."""
    from xbench.fabric.launch import outside_slurm

    task = {
        **{"SLURM_JOB_ID": "7", "SLURM_JOBID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"},
        **{"SLURM_LOCALID": "0", "SLURM_NODELIST": "xbn0", "SLURM_TASKS_PER_NODE": "1"},
        **{"SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_CPUS_ON_NODE": "2"},
        **{"PMI_FD": "5", "PMI_RANK": "0", "PMI_SIZE": "1", "PMIX_RANK": "0"},
        **{"PMIX_NAMESPACE": "slurm.pmix.7.0", "PMIX_MCA_psec": "native", "PATH": "/bin"},
    }
    assert outside_slurm(task) == {"PMIX_MCA_psec": "native", "PATH": "/bin"}
    batch = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "xbn0"}  # a batch script: srun works
    assert outside_slurm(batch) == batch
    import os

    out = tmp_path / "kernel"
    args = ("--threads", "1", "--heads", "4", "--rows", "1", "--chunk", "64", "--samples", "2")
    r = xbench(
        "kernel", *args, "--np", "2", "--out", out, env={**task, "PATH": os.environ["PATH"]},
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert read_run_meta(out)["config"]["ranks"] == 2 and len(read_table(out, KERNEL_SAMPLES))


def test_a_task_of_an_srun_step_without_pmi_is_refused_before_it_launches(xbench, tmp_path):
    """srun --mpi=none around xbench probe hung: each task started its own mpiexec, whose
    step waited for the busy nodes forever. A task that srun gave no PMI, one of several,
    is refused in one line before anything is written; one task, or a PMI, is not."""
    from xbench.fabric.launch import srun_tasks_without_pmi

    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"}
    assert srun_tasks_without_pmi(step) == 2
    assert srun_tasks_without_pmi({**step, "SLURM_STEP_NUM_TASKS": "1"}) == 0
    assert srun_tasks_without_pmi({**step, "PMI_RANK": "1"}) == 0  # srun --mpi=pmi2
    assert srun_tasks_without_pmi({}) == 0
    # the one task of a step is where ranks start from, with or without a PMI (a cluster's
    # MpiDefault gives every step one); a task of several, given one, is a rank
    from xbench.fabric.launch import inside_launcher

    one = {**step, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "PMI_RANK": "0"}
    assert not inside_launcher(one) and not inside_launcher({**one, "PMIX_RANK": "0"})
    assert inside_launcher({**step, "PMI_RANK": "1"}) and inside_launcher({"PMI_RANK": "0"})
    for args in (
        ("probe", "--np", "2", "--sizes", "8B"),
        ("validate", "--profile", "profiles/h100-priors.toml", "--fabric", "ib"),
    ):
        out = tmp_path / args[0]
        r = xbench(*args, "--out", out, env=step)
        assert r.returncode == 2 and "srun --mpi=pmi2" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_a_command_that_starts_ranks_refuses_to_be_one_before_it_writes(xbench, tmp_path):
    """mpiexec -n 2 xbench kernel ran two sweeps into one --out: one rank's, and the other
    refused there ("in use by another xbench") once the first had begun; check and
    simulate --validate, which also start their own ranks, did the same. Each rank now
    refuses in one line, before anything is written; one rank (PMI_SIZE 1) runs as it did."""
    from conftest import BIN

    from xbench.fabric.launch import launched_ranks

    assert launched_ranks({"PMI_SIZE": "2"}) == 2 and launched_ranks({}) == 1
    assert launched_ranks({"PMI_SIZE": "1", "PMI_RANK": "0"}) == 1  # mpiexec -n 1: runs
    assert launched_ranks({"OMPI_COMM_WORLD_SIZE": "4", "PMI_RANK": "0"}) == 4
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    assert launched_ranks(step) == 2 and launched_ranks({**step, "SLURM_STEP_NUM_TASKS": "1"}) == 1
    assert launched_ranks({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}) == 1
    baseline = tmp_path / "baseline"  # what check reads before it starts anything
    baseline.mkdir()
    (baseline / "run.json").write_text(json.dumps({"command": "kernel"}))
    out = tmp_path / "out"
    for args, once in (
        (("kernel", "--out", out), "xbench kernel --np 2"),
        (("check", "--baseline", baseline, "--out", out), "xbench check, from a shell"),
        (
            ("simulate", "decode-route-vs-fetch", "--validate", "--out", out / "v.parquet"),
            "xbench simulate --validate",
        ),
    ):
        r = xbench(*args, launcher=[str(BIN / "mpiexec"), "-n", "2"])
        assert r.returncode != 0 and not out.exists(), r.stderr
        refusals = [ln for ln in r.stderr.splitlines() if ln.startswith("xbench: error:")]
        # each rank's line (Open MPI may end the other first, once one has exited)
        assert refusals and len(refusals) <= 2 and "one of 2 ranks" in refusals[0], r.stderr
        assert f"run it once: {once}" in refusals[0] and "Traceback" not in r.stderr


def test_the_mpich_netmod_follows_the_device_line_and_the_plugin():
    from xbench.cluster.slurm import mpich_netmod_for

    wheel = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx ofi\n"
    assert mpich_netmod_for(wheel, "pmi2") == "ofi"
    assert mpich_netmod_for(wheel, "pmix") is None  # only srun's PMI-2 misreads long puts
    assert mpich_netmod_for("MPICH Version: 4.2\nMPICH Device: ch4:ucx\n", "pmi2") is None
    assert mpich_netmod_for("Open MPI v5.0.11", "pmi2") is None
    assert mpich_netmod_for(None, "pmi2") is None


@pytest.mark.gpu
def test_validate_hands_gpu_memory_only_to_an_mpi_that_says_it_takes_it(xbench, tmp_path):
    """validate's cuda-aware wire asks the MPI first: the PyPI wheels say no, in one line;
    an MPI built with CUDA runs route, fetch and local with two ranks (on one GPU or two)."""
    from xbench.results.schema import VALIDATE_SAMPLES

    out = tmp_path / "v"
    r = xbench(
        "validate", "--profile", "profiles/h100-priors.toml", "--fabric", "nvlink",
        "--device", "cuda", "--wire", "cuda-aware", "--rows", "1", "--chunk", "1024",
        "--heads", "16", "--samples", "2", "--rounds", "1", "--out", out,
    )  # fmt: skip
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert "CUDA-aware" in lines[-1], r.stderr
        return
    samples = read_table(out, VALIDATE_SAMPLES)
    assert set(samples.transport) == {"mpi-cuda"} and samples.correct.all()


@pytest.mark.gpu
@pytest.mark.parametrize("wire", ["nccl", "nvshmem"])
def test_validate_over_nccl_or_nvshmem_between_gpus(xbench, tmp_path, wire):
    """validate's nccl and nvshmem wires on GPU tensors: two GPUs, or one line on a machine
    with one."""
    import torch

    if wire == "nvshmem":
        pytest.importorskip("nvshmem.core")
    out = tmp_path / "v"
    r = xbench(
        "validate", "--profile", "profiles/h100-priors.toml", "--fabric", "nvlink",
        "--device", "cuda", "--wire", wire, "--rows", "1", "--chunk", "1024",
        "--heads", "16", "--samples", "2", "--rounds", "1", "--out", out,
    )  # fmt: skip
    if torch.cuda.device_count() < 2:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0 and "one GPU per rank" in lines[-1], r.stderr
        return
    assert r.returncode == 0, r.stderr
    from xbench.results.schema import VALIDATE_SAMPLES

    samples = read_table(out, VALIDATE_SAMPLES)
    assert set(samples.transport) == {wire} and samples.correct.all()


@pytest.mark.gpu
@pytest.mark.parametrize("launch", ["graph", "eager"])
def test_validate_on_one_gpu_replays_its_compute_from_graphs_or_launches_it(
    xbench, tmp_path, launch
):
    """Two ranks sharing the GPU, messages staged through host buffers: every path matches
    one-instance attention whether the compute calls replay from CUDA graphs (the default
    there) or run eagerly, and the run says which."""
    from xbench.results.schema import VALIDATE_SAMPLES

    out = tmp_path / "v"
    r = xbench(
        "validate", "--profile", "profiles/h200.toml", "--fabric", "nvlink", "--device", "cuda",
        "--launch", launch, "--rows", "1,4", "--chunk", "1024", "--heads", "16",
        "--fetch-layout", "packed", "--samples", "2", "--rounds", "1", "--out", out,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    samples = read_table(out, VALIDATE_SAMPLES)
    assert samples.correct.all() and set(samples.option) == {"route", "fetch", "local"}
    assert read_run_meta(out)["config"]["launch"] == launch
