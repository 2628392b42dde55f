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
# The results folder is written inside double quotes so $SLURM_JOB_ID expands; a quote, a
# backslash, a line break or a command substitution would end that string or run something.
RESULTS_UNSAFE = re.compile(r'["\\`\n\r]|\$\(')
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
        if not self.results or RESULTS_UNSAFE.search(self.results):
            raise XbenchError(
                f"--results {self.results!r} cannot be written into the script",
                "pass a folder path without quotes, backslashes, backquotes or $( (variables are fine)",
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
    ]
    if job.venv:
        lines.append(f"source {shlex.quote(str(Path(job.venv) / 'bin' / 'activate'))}")
    for key, value in sorted(job.env.items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += [
        'echo "xbench on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"',
        'xbench env > "$RESULTS/env.txt" || true',
    ]
    gpu_bind = " --gpus-per-task=1 --gpu-bind=closest" if job.gpus_per_node else ""
    extra = " ".join(shlex.quote(a) for a in job.xbench_args)
    ranks = f"srun --mpi={job.srun_mpi} --nodes={job.nodes} --ntasks={tasks} --ntasks-per-node={job.ntasks_per_node}{gpu_bind}"
    one = f"srun --nodes=1 --ntasks=1{gpu_bind}"
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
    lines = [f"BASELINE={shlex.quote(job.baseline)}"]
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
    """sbatch the script; returns sbatch's answer (the job id line)."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise XbenchError(
            "sbatch is not on PATH", f"run this on a Slurm login node, or submit {script} there"
        )
    result = subprocess.run([sbatch, str(script)], capture_output=True, text=True)
    if result.returncode != 0:
        raise XbenchError(
            f"sbatch refused {script}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.returncode}",
            "fix the partition, account or shape",
        )
    return result.stdout.strip()
