"""``xbench slurm``: write (and optionally submit) an sbatch script for a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import FormatOption, OutputFormat, console, handles_errors, strict_json


@handles_errors
def slurm(
    kind: Annotated[str, typer.Argument(help="probe, kernel or validate.")],
    xbench_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Options for the sweep itself, after --, e.g. -- --transport nccl --fabric ib."
        ),
    ] = None,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 2,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (0 for CPU-only runs).")] = 8,
    ntasks_per_node: Annotated[int, typer.Option(help="Ranks per node (one GPU each).")] = 1,
    time: Annotated[str, typer.Option(help="Wall-clock limit, HH:MM:SS.")] = "00:30:00",
    partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    account: Annotated[str | None, typer.Option(help="Slurm account.")] = None,
    srun_mpi: Annotated[str, typer.Option(help="srun --mpi plugin: pmix or pmi2.")] = "pmix",
    venv: Annotated[
        str | None, typer.Option(help="Virtual environment to activate on the nodes.")
    ] = None,
    results: Annotated[
        str, typer.Option(help="Results folder on the shared file system.")
    ] = "results/slurm-${SLURM_JOB_ID}",
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the script.")] = Path(
        "xbench.sbatch"
    ),
    submit: Annotated[bool, typer.Option("--submit", help="Hand the script to sbatch.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Write an sbatch script that runs the sweep with srun and collects its results."""
    from xbench.cluster.slurm import SlurmJob, render
    from xbench.cluster.slurm import submit as do_submit

    job = SlurmJob(
        kind,
        nodes,
        gpus_per_node,
        ntasks_per_node,
        time,
        partition,
        account,
        srun_mpi,
        venv,
        results,
        list(xbench_args or []),
    )
    from xbench.results.store import refuse_overwrite

    refuse_overwrite(out, force)
    out.write_text(render(job))
    out.chmod(0o755)
    submitted = do_submit(out) if submit else None
    if fmt == OutputFormat.table:
        console.print(f"wrote {out}", highlight=False)
        if submitted:
            console.print(submitted, highlight=False)
    elif fmt == OutputFormat.json:
        print(strict_json({"script": str(out), "submitted": submitted}))
    else:
        print(f"script,submitted\n{out},{submitted or ''}")
