"""``xbench slurm``: write (and optionally submit) an sbatch script for a sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import FormatOption, OutputFormat, console, handles_errors, strict_json
from xbench.files import write_text_atomically


@handles_errors
def slurm(
    kind: Annotated[str, typer.Argument(help="probe, kernel, validate or check.")],
    xbench_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Options for the sweep itself, after --, e.g. -- --transport nccl --fabric ib."
        ),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(help="Nodes (default: 2; a kernel sweep runs on 1).")
    ] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (0 for CPU-only runs).")] = 8,
    ntasks_per_node: Annotated[int, typer.Option(help="Ranks per node (one GPU each).")] = 1,
    time: Annotated[str, typer.Option(help="Wall-clock limit, HH:MM:SS.")] = "00:30:00",
    partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    account: Annotated[str | None, typer.Option(help="Slurm account.")] = None,
    srun_mpi: Annotated[
        str,
        typer.Option(
            help="srun --mpi plugin (pmix, pmi2, ...), or auto: the one the MPI loaded here "
            "speaks (Open MPI: pmix; MPICH, Intel MPI: pmi2)."
        ),
    ] = "auto",
    venv: Annotated[
        str | None, typer.Option(help="Virtual environment to activate on the nodes.")
    ] = None,
    results: Annotated[
        str, typer.Option(help="Results folder on the shared file system.")
    ] = "results/slurm-${SLURM_JOB_ID}-${XBENCH_STARTED}",
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the script.")] = Path(
        "xbench.sbatch"
    ),
    baseline: Annotated[
        str | None,
        typer.Option(help="check: the baseline run directory, as the nodes see it."),
    ] = None,
    sweep: Annotated[
        str | None,
        typer.Option(help="check: probe or kernel (read from the baseline when it is here)."),
    ] = None,
    launches: Annotated[
        int | None,
        typer.Option(help="check: launches of a probe baseline (read from it when it is here)."),
    ] = None,
    submit: Annotated[bool, typer.Option("--submit", help="Hand the script to sbatch.")] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Submit, wait for the job to end and exit with its status (a check job: "
            "compare's).",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Write an sbatch script that runs the sweep with srun and collects its results."""
    from xbench.capabilities import loaded_mpi_library
    from xbench.cluster.slurm import SlurmJob, mpich_netmod_for, render, srun_mpi_for
    from xbench.cluster.slurm import submit as do_submit

    why = "--srun-mpi"
    library = loaded_mpi_library(whole=True)
    if srun_mpi == "auto":
        srun_mpi = srun_mpi_for(library)
        why = (
            f"for the MPI loaded here: {' '.join(library.splitlines()[0].split())}"
            if library
            else "no MPI loads here"
        )

    job = SlurmJob(
        kind,
        nodes if nodes is not None else 2,
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
    job.mpich_netmod = mpich_netmod_for(library, srun_mpi)
    if kind == "check":
        job.baseline, job.sweep, job.launches = _baseline(baseline, sweep, launches)
    if nodes is None and (job.sweep if kind == "check" else kind) == "kernel":
        job.nodes = 1  # a kernel sweep's one task
    if (
        kind != "check"
    ):  # a check's options, given to another sweep, would be ignored without a word
        given = [
            option
            for option, value in (
                ("--baseline", baseline), ("--sweep", sweep), ("--launches", launches)
            )
            if value is not None
        ]  # fmt: skip
        if given:
            from xbench.errors import XbenchError

            raise XbenchError(
                f"{' and '.join(given)}: xbench slurm {kind} does not take "
                f"{'them (a check' if len(given) > 1 else 'it (a check'}'s)",
                f"drop them, or write xbench slurm check {' '.join(given[:1])} ...",
            )
    from xbench.results.store import refuse_overwrite

    job.validate()
    _check_forwarded(job.sweep if kind == "check" else kind, job.xbench_args, kind)
    refuse_overwrite(out, force)
    write_text_atomically(out, render(job))
    out.chmod(0o755)
    if fmt == OutputFormat.table:
        console.print(f"wrote {out}", highlight=False)
        console.print(f"srun --mpi={job.srun_mpi} ({why})", highlight=False)
        if job.mpich_netmod:
            console.print(  # the script keeps a value set at submission
                f"MPICH_CH4_NETMOD={job.mpich_netmod} (srun's PMI-2 misreads UCX's long address)",
                highlight=False,
            )
    job_id = do_submit(out) if submit or wait else None
    if job_id and fmt == OutputFormat.table:
        console.print(f"submitted job {job_id}", highlight=False)
    ended = _wait(job_id, fmt) if wait else None
    if fmt == OutputFormat.json:
        print(
            strict_json(
                {
                    "script": str(out),
                    "submitted": job_id,
                    "state": ended and ended.state,
                    "exit_status": ended and ended.exit_status,
                    "output": ended and ended.output,
                }
            )
        )
    elif fmt == OutputFormat.csv:
        import csv

        rows = csv.writer(sys.stdout, lineterminator="\n")  # a path with a comma stays one field
        rows.writerow(["script", "submitted", "state", "exit_status"])
        rows.writerow(
            [out, job_id or "", ended.state if ended else "", ended.exit_status if ended else ""]
        )
    if ended is not None and ended.exit_status:
        raise typer.Exit(ended.exit_status)


def _wait(job_id: str, fmt: OutputFormat):
    """Wait for the job, its state on one live line; the state it ended in, printed."""
    from xbench.cluster.slurm import wait_for

    if fmt != OutputFormat.table:
        return wait_for(job_id)
    with console.status(f"job {job_id}: submitted") as status:
        ended = wait_for(job_id, on_state=lambda s: status.update(f"job {job_id}: {s.state}"))
    console.print(
        f"job {job_id} {ended.state} (exit {ended.exit_status}); output in {ended.output}",
        highlight=False,
    )
    return ended


# Options the script or srun decides, refused after -- (given there, the script's own --out
# would win unsaid; a probe or validate under srun refuses --runs on the nodes, and takes
# its ranks from srun): (option, the sweeps or kind it is decided for, what decides it,
# what to pass instead)
_DECIDED_HERE = (
    ("out", ("probe", "kernel", "validate"), "the script writes the run into --results",
     "pass --results to xbench slurm"),
    ("np", ("probe", "validate"), "srun starts the ranks",
     "pass --nodes and --ntasks-per-node to xbench slurm"),
    ("hostfile", ("probe", "validate"), "srun places the ranks",
     "pass --nodes and --partition to xbench slurm"),
    ("oversubscribe", ("probe", "validate"), "srun places the ranks",
     "pass --ntasks-per-node to xbench slurm"),
    ("runs", ("probe", "validate"), "each srun step is one launch",
     "submit the job again for another launch"),
    ("config_from", ("check",), "the check reruns --baseline's sweep", "pass --baseline"),
    ("process_run", ("check",), "the check numbers its launches itself", ""),
)  # fmt: skip


def _check_forwarded(command: str | None, args: list[str], kind: str) -> None:
    """Parse the options forwarded to the sweep as the nodes' xbench will, before the script
    is written: a typo fails here in a second, not on the cluster after the queue. Options
    the script or srun decides (``_DECIDED_HERE``) are refused."""
    import typer.main

    from xbench.cli.kernel import kernel
    from xbench.cli.probe import probe
    from xbench.cli.validate import validate
    from xbench.errors import XbenchError

    if command is None or not args:
        return
    one = typer.Typer()  # the sweep's own command line, as the app defines it
    one.command()({"probe": probe, "kernel": kernel, "validate": validate}[command])
    sweep = typer.main.get_command(one)
    try:
        ctx = sweep.make_context(f"xbench {command}", list(args))
    except Exception as exc:  # click's usage errors (click may be vendored: matched by shape)
        if not hasattr(exc, "format_message"):
            raise
        raise XbenchError(
            f"the options for {command} after -- are refused: {exc.format_message()}",
            f"fix them (xbench {command} --help lists them)",
        ) from None
    for name, kinds, decider, instead in _DECIDED_HERE:
        source = ctx.get_parameter_source(name)  # None: not an option of this sweep
        if (command in kinds or kind in kinds) and source and source.name == "COMMANDLINE":
            option = next(p.opts[0] for p in ctx.command.params if p.name == name)
            raise XbenchError(
                f"{option} after --: {decider} (xbench slurm {kind})",
                f"drop it; {instead}" if instead else "drop it",
            )
    _check_values(ctx.params)


def _check_values(params: dict) -> None:
    """Parse the text options of a probe, kernel or validate command line as the command
    will (sizes, lists, durations, patterns)."""
    from xbench.cli.probe import _patterns
    from xbench.core.units import (
        parse_duration,
        parse_int_list,
        parse_name_list,
        parse_size,
        parse_size_list,
    )

    parsers = {
        "sizes": parse_size_list,
        "payload": parse_size,
        "return_": parse_size,
        "block_size": parse_size,
        "kv_bytes": parse_size,
        "pattern": _patterns,
        "min_sample_time": parse_duration,
        "rows": lambda text: parse_int_list(text, "--rows"),
        "chunk": lambda text: parse_int_list(text, "--chunk"),
        "blocks": lambda text: parse_int_list(text, "--blocks"),
    }
    for name, parse in parsers.items():
        value = params.get(name)
        if isinstance(value, str):
            parse(value)
    if isinstance(params.get("fabric"), str):  # a probe's label: one of the known fabrics
        from xbench.fabric.registry import check_fabric

        check_fabric(params["fabric"])
    if "wire" in params:  # a validate: how its messages may cross
        from xbench.cli.validate import check_wire
        from xbench.core.sweep_rules import resolve_launch

        check_wire(params["device"], params["wire"])
        resolve_launch(params["device"], params["launch"])
    if "merge_wait" in params:  # a kernel sweep: extra timings of kernels it times
        from xbench.cli.kernel import check_extra_timings
        from xbench.kernels.bench import KERNELS

        names = parse_name_list(params["kernels"], "--kernels", KERNELS, "kernel")
        check_extra_timings(names, params["idle"], params["merge_wait"])
    if "initiator" in params:  # a probe: what the GPU can post
        from xbench.probe.runner import check_initiator, check_transport_options

        scope = params.get("put_scope")
        check_initiator(
            _choice(params["initiator"]),
            params["transport"],
            _patterns(params["pattern"]),
            _choice(scope) if scope else None,
        )
        check_transport_options(
            params["transport"], params["tcp_interface"], _choice(params["backend"])
        )


def _choice(value) -> str:
    """A choice option's value as the command sees it: typer before 0.29 leaves click's
    string in the context's params and makes the enum only when it calls the command."""
    return getattr(value, "value", value)


def _baseline(baseline: str | None, sweep: str | None, launches: int | None):
    """(path, sweep, launches) of a check's baseline: read from its run.json where this
    machine sees it, else as given (a login node without the shared file system)."""
    from xbench.errors import XbenchError
    from xbench.results.store import read_run_meta

    if not baseline:
        raise XbenchError("xbench slurm check needs --baseline", "pass the baseline run directory")
    meta = read_run_meta(Path(baseline)) if Path(baseline).is_dir() else {}
    if meta:
        found = meta.get("command")
        if found not in ("probe", "kernel"):
            raise XbenchError(f"{baseline} is not a probe or kernel run", "pass one as --baseline")
        if sweep and sweep != found:
            raise XbenchError(
                f"--sweep {sweep}: {baseline} is a {found} run", f"drop --sweep or pass {found}"
            )
        config = meta.get("config") or {}
        stored = int(config.get("process_run", 0)) + 1 if found == "probe" else 1
        return baseline, found, stored if launches is None else launches
    if sweep not in ("probe", "kernel"):
        raise XbenchError(
            f"{baseline} is not readable here to tell its sweep",
            "pass --sweep probe or kernel (and --launches for a probe)",
        )
    return baseline, sweep, 1 if launches is None else launches
