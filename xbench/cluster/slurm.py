"""Slurm batch scripts for xbench sweeps: srun launches the ranks, results stay in one folder.

The script is plain bash with ``#SBATCH`` lines; ``xbench slurm ... --submit`` hands it to
``sbatch``. MPI ranks get PMIx from srun (``--mpi=pmix``; pass ``--srun-mpi pmi2`` for
clusters without PMIx), one GPU each, bound to the closest GPU.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from xbench.errors import XbenchError

KINDS = ("probe", "kernel", "validate")


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
    results: str = "results/slurm-${SLURM_JOB_ID}"
    xbench_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise XbenchError(f"unknown sweep {self.kind!r}", f"pick one of {', '.join(KINDS)}")
        if self.nodes < 1 or self.ntasks_per_node < 1 or self.gpus_per_node < 0:
            raise XbenchError(
                "--nodes and --ntasks-per-node must be at least 1", "give the job's shape"
            )
        if self.kind in ("probe", "validate") and self.nodes * self.ntasks_per_node < 2:
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
    lines += ["", "set -euo pipefail", f'RESULTS="{job.results}"', 'mkdir -p "$RESULTS"']
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
    if job.kind == "kernel":
        command = (
            f'srun --nodes=1 --ntasks=1{gpu_bind} xbench kernel {extra} --out "$RESULTS/kernel"'
        )
    else:
        command = f'srun --mpi={job.srun_mpi} --nodes={job.nodes} --ntasks={tasks} --ntasks-per-node={job.ntasks_per_node}{gpu_bind} xbench {job.kind} {extra} --out "$RESULTS/{job.kind}"'
    lines += [" ".join(command.split()), 'echo "results in $RESULTS"', ""]
    return "\n".join(lines)


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
