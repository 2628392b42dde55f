"""Slurm batch scripts for xbench sweeps: srun launches the ranks, results stay in one folder.

The script is plain bash with ``#SBATCH`` lines; ``xbench slurm ... --submit`` hands it to
``sbatch``. srun starts the MPI ranks through the PMI their library speaks (``--srun-mpi``,
by default chosen from the MPI library loaded where the script is written: Open MPI takes
PMIx, MPICH and its derivatives PMI-2, as the PyPI mpich wheel has no PMIx and fails under
``--mpi=pmix``), one GPU each, bound to the closest GPU. Each job writes into a folder of
its own (the job id and the start time: job ids restart with a fresh cluster).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from xbench.errors import XbenchError

KINDS = ("probe", "kernel", "validate", "check")
# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (sbatch(1)), or no limit
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE)
# Partition and account names (a partition may be a comma list) and srun's --mpi plugin
# (pmix, pmix_v4, pmi2, none...): anything else would be misread by sbatch in a #SBATCH line
# or, for the plugin, run by the shell as part of the srun command line.
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
# srun's MPI plugins (srun --mpi=list; pmix_vN by PMIx version): anything else fails the job
SRUN_MPI = ("pmix", "pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta", "none")
# Folders (results, baseline, virtual environment) are written inside double quotes so that
# variables expand on the node ($SLURM_JOB_ID, ${XBENCH_BASELINE:-/shared/...}); a quote, a
# backslash, a line break or a command substitution would end that string or run something.
PATH_UNSAFE = re.compile(r'["\\`\n\r]|\$\(')
# The default results folder: the job id and the job's start (XBENCH_STARTED, set by the
# script), so a new cluster's job 1 does not meet an old job 1's run
DEFAULT_RESULTS = "results/slurm-${SLURM_JOB_ID}-${XBENCH_STARTED}"


def srun_mpi_for(library: str | None) -> str:
    """srun's --mpi plugin for an MPI library's version line: PMIx for Open MPI, PMI-2 for
    MPICH and its derivatives (Intel MPI, MVAPICH; the PyPI mpich wheel is built without
    PMIx), PMIx where the library is unknown (Slurm's usual default on GPU clusters)."""
    text = (library or "").lower()
    if "open mpi" in text:
        return "pmix"
    if any(name in text for name in ("mpich", "intel(r) mpi", "intel mpi", "mvapich")):
        return "pmi2"
    return "pmix"


def mpich_netmod_for(library: str | None, srun_mpi: str) -> str | None:
    """``ofi`` for an MPICH built with both the UCX and OFI netmods (the PyPI mpich wheel)
    under srun's PMI-2 plugin, else None. UCX's address spans several PMI-1 puts, which the
    plugin's server reads one read() at a time and misparses when two arrive together
    (slurmstepd: "invalid client request"; MPI_Init then fails or hangs, about one launch in
    eight on the test cluster); OFI's address fits one put. ``library``: the whole version
    text, whose "MPICH Device:" line names the netmods built."""
    if srun_mpi != "pmi2" or not library:
        return None
    device = next(
        (line for line in library.splitlines() if line.strip().lower().startswith("mpich device")),
        "",
    ).lower()
    return "ofi" if "ucx" in device and "ofi" in device else None


@dataclass
class SlurmJob:
    kind: str
    nodes: int = 2
    gpus_per_node: int = 8
    ntasks_per_node: int = 1
    time: str = "00:30:00"
    partition: str | None = None
    account: str | None = None
    srun_mpi: str = "pmix"
    venv: str | None = None
    results: str = DEFAULT_RESULTS
    xbench_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None  # check: the baseline run directory (shared file system)
    sweep: str | None = None  # check: the baseline's command (probe or kernel)
    launches: int = 1  # check: the baseline's launches, each its own srun step
    mpich_netmod: str | None = None  # MPICH_CH4_NETMOD unless set at submission

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise XbenchError(f"unknown sweep {self.kind!r}", f"pick one of {', '.join(KINDS)}")
        if self.kind == "check" and (not self.baseline or self.sweep not in ("probe", "kernel")):
            raise XbenchError(
                "xbench slurm check needs the baseline run",
                "pass --baseline DIR (a probe or kernel run on the shared file system)",
            )
        if not SLURM_TIME.fullmatch(self.time):
            raise XbenchError(
                f"--time {self.time!r} is not a Slurm time limit",
                "write minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], e.g. --time 00:30:00",
            )
        for option, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not SLURM_NAME.fullmatch(value):
                raise XbenchError(
                    f"{option} {value!r} is not a Slurm name",
                    f"write {option} with letters, digits, _ . + - (a comma list for partitions)",
                )
        if self.srun_mpi not in SRUN_MPI:
            raise XbenchError(
                f"--srun-mpi {self.srun_mpi!r} is not an srun MPI plugin",
                f"pass one of {', '.join(SRUN_MPI)} (`srun --mpi=list` shows the cluster's)",
            )
        for option, folder in (
            ("--results", self.results),
            ("--baseline", self.baseline),
            ("--venv", self.venv),
        ):
            if folder is not None and (not folder or PATH_UNSAFE.search(folder)):
                raise XbenchError(
                    f"{option} {folder!r} cannot be written into the script",
                    "pass a folder path without quotes, backslashes, backquotes or $( "
                    "(variables are fine)",
                )
        if self.nodes < 1 or self.ntasks_per_node < 1 or self.gpus_per_node < 0:
            raise XbenchError(
                "--nodes and --ntasks-per-node must be at least 1, --gpus-per-node at least 0",
                "give the job's shape",
            )
        if self.kind == "check" and self.launches < 1:  # seq 0 -1 would run none
            raise XbenchError(
                f"--launches {self.launches}: a probe baseline has at least one launch",
                "pass --launches 1 or more, or leave it to the baseline's run.json",
            )
        ranked = self.kind in ("probe", "validate") or self.sweep == "probe"
        if ranked and self.nodes * self.ntasks_per_node < 2:
            raise XbenchError(
                f"xbench {self.kind} needs at least 2 ranks",
                "use --nodes 2, or --ntasks-per-node 2 on one node",
            )
        one_node = self.kind == "kernel" or (self.kind == "check" and self.sweep == "kernel")
        if one_node and self.nodes != 1:
            # its sweep runs in one task on one node: the others would be held idle
            raise XbenchError(
                f"--nodes {self.nodes}: a kernel sweep runs on one node (one task with its "
                "CPUs and GPUs), so sbatch would hold the others idle",
                "pass --nodes 1 (a job a node for several nodes' kernels)",
            )
        if self.kind == "validate" and self.nodes * self.ntasks_per_node != 2:
            raise XbenchError(
                "xbench validate runs exactly 2 ranks",
                "use --nodes 2 --ntasks-per-node 1 (or 1 node x 2)",
            )


def render(job: SlurmJob) -> str:
    """The sbatch script for ``job``."""
    job.validate()
    tasks = job.nodes * job.ntasks_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=xbench-{job.kind}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.ntasks_per_node}",
    ]
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    lines += [
        f"#SBATCH --time={job.time}",
        "#SBATCH --exclusive",
        f"#SBATCH --output=xbench-{job.kind}-%j.out",
    ]
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    if job.account:
        lines.append(f"#SBATCH --account={job.account}")
    lines += [
        "",
        "set -euo pipefail",
        'XBENCH_STARTED="$(date -u +%Y%m%dT%H%M%SZ)"  # with the job id: a folder of its own',
        f'RESULTS="{job.results}"',
        'mkdir -p "$RESULTS"',
        # the plugin chosen when the script was written, or the one named at submission
        f'SRUN_MPI="${{XBENCH_SRUN_MPI:-{job.srun_mpi}}}"  # or: XBENCH_SRUN_MPI=pmi2 sbatch ...',
    ]
    if job.venv:
        lines.append(f'source "{job.venv.rstrip("/")}/bin/activate"')
    if job.mpich_netmod:
        lines.append(
            f'export MPICH_CH4_NETMOD="${{MPICH_CH4_NETMOD:-{job.mpich_netmod}}}"'
            "  # srun's PMI-2 misreads UCX's long address"
        )
    for key, value in sorted(job.env.items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += [
        'echo "xbench on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST, srun --mpi=$SRUN_MPI"',
        'xbench env > "$RESULTS/env.txt" || true',
    ]
    gpu_bind = " --gpus-per-task=1 --gpu-bind=closest" if job.gpus_per_node else ""
    extra = " ".join(shlex.quote(a) for a in job.xbench_args)
    # one rank failing (in MPI_Init, say) ends the step instead of leaving the others waiting
    # for it until the time limit
    ranks = f'srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1 --nodes={job.nodes} --ntasks={tasks} --ntasks-per-node={job.ntasks_per_node}{gpu_bind}'
    # one task with the node's CPUs (a step's task gets one by default): a CPU sweep's
    # --threads, and the ranks it starts itself (--np 2, --runs N: xbench's own mpiexec,
    # which leaves Slurm to this step)
    one = f'srun --nodes=1 --ntasks=1 --cpus-per-task="$SLURM_CPUS_ON_NODE"{gpu_bind}'
    if job.kind == "check":
        return "\n".join(lines + _check_lines(job, ranks, one, extra))
    if job.kind == "kernel":
        command = f'{one} xbench kernel {extra} --out "$RESULTS/kernel"'
    else:
        command = f'{ranks} xbench {job.kind} {extra} --out "$RESULTS/{job.kind}"'
    lines += [" ".join(command.split()), 'echo "results in $RESULTS"', ""]
    return "\n".join(lines)


def _check_lines(job: SlurmJob, ranks: str, one: str, extra: str) -> list[str]:
    """The baseline's sweep again (a probe's launches as separate srun steps into one run),
    then xbench compare into Markdown and JUnit; the job's exit status is compare's (0 no
    regression, 1 a case is slower, 4 nothing comparable, 5 cases of the baseline missing)."""
    run = f'"$RESULTS/{job.sweep}"'
    lines = [f'BASELINE="{job.baseline}"']
    if job.sweep == "probe":
        lines += [
            f"for launch in $(seq 0 {job.launches - 1}); do",
            "  "
            + " ".join(
                f'{ranks} xbench probe --config-from "$BASELINE" --process-run "$launch" {extra} --out {run}'.split()
            ),
            "done",
        ]
    else:
        lines.append(
            " ".join(f'{one} xbench kernel --config-from "$BASELINE" {extra} --out {run}'.split())
        )
    lines += [
        "set +e",
        f'xbench compare "$BASELINE" {run} --out "$RESULTS/comparison.parquet" --format junit > "$RESULTS/compare.junit.xml"',
        "status=$?",
        f'xbench compare "$BASELINE" {run} --format markdown > "$RESULTS/compare.md"',
        'echo "compare exit $status; reports in $RESULTS/compare.md and $RESULTS/compare.junit.xml"',
        'exit "$status"',
        "",
    ]
    return lines


def submit(script: Path) -> str:
    """sbatch the script; returns the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise XbenchError(
            "sbatch is not on PATH", f"run this on a Slurm login node, or submit {script} there"
        )
    result = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True)
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()
        raise XbenchError(
            f"sbatch refused {script}: {said[-1] if said else result.returncode}",
            "fix what sbatch names: the partition, account or shape, or where SLURM_CONF points",
        )
    return result.stdout.strip().split(";")[0]  # --parsable: JOBID[;CLUSTER]


# Job states after which nothing more happens (squeue(1), JOB STATE CODES)
ENDED = frozenset(
    "BOOT_FAIL CANCELLED COMPLETED DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PREEMPTED "
    "TIMEOUT".split()
)


@dataclass(frozen=True)
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED...
    exit_status: int | None  # the batch script's, once ended
    output: str | None  # the job's output file (StdOut)

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def job_state(job_id: str) -> JobState:
    """The job as the controller knows it (``scontrol show job``: one line, KEY=VALUE)."""
    result = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise XbenchError(
            f"the controller no longer knows job {job_id}: {result.stderr.strip()}",
            "look for its output file beside the script (MinJobAge may have purged it)",
        )
    fields = dict(
        item.split("=", 1)
        for item in result.stdout.split()
        if "=" in item and not item.startswith("=")
    )
    state = fields.get("JobState", "UNKNOWN")
    exit_status = None
    if state in ENDED:
        status, _, signal = fields.get("ExitCode", "0:0").partition(":")
        exit_status = int(status) or (128 + int(signal) if signal.isdigit() and int(signal) else 0)
        if state != "COMPLETED" and exit_status == 0:
            exit_status = 1  # cancelled, timed out, node failure: no script status to give
    return JobState(state, exit_status, fields.get("StdOut"))


def wait_for(job_id: str, poll_s: float = 1.0, on_state=None) -> JobState:
    """Poll until the job ends; ``on_state(JobState)`` sees every poll (a progress line)."""
    while True:
        state = job_state(job_id)
        if on_state is not None:
            on_state(state)
        if state.ended:
            return state
        time.sleep(poll_s)
