"""``xbench validate``: real route / fetch / local between two ranks against the model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    RoundsOption,
    RunDirOption,
    check_threads,
    choose_cpu_attention,
    coloured,
    console,
    emit_frame,
    handles_errors,
    interval_label,
    warn_conditions,
)
from xbench.errors import XbenchError, require_installed


@handles_errors
def validate(
    profile: Annotated[Path, typer.Option(help="Fitted profile to check (xbench fit output).")],
    np: Annotated[int, typer.Option("--np", "-n", help="Ranks: 2 (requester and holder).")] = 2,
    rows: Annotated[
        str, typer.Option(help="Decode tokens routed together, e.g. 1,4,16.")
    ] = "1,4,16",
    chunk: Annotated[
        str, typer.Option(help="Tokens on the holder, e.g. 256,1024,4096.")
    ] = "256,1024,4096",
    heads: Annotated[
        int, typer.Option(min=1, help="Query rows per token (heads on this device).")
    ] = 16,
    dtype: Annotated[str, typer.Option(help="bf16 or fp32.")] = "bf16",
    fabric: Annotated[
        str | None,
        typer.Option(
            help="Fabric of the profile to predict with (default: the one measured between local ranks, shm)."
        ),
    ] = None,
    fetch_layout: Annotated[
        str,
        typer.Option(
            help="How a fetch leaves the holder: pages (one message per page from its cache, "
            "model T_splice) or packed (gathered into one message, model T_move)."
        ),
    ] = "pages",
    samples: Annotated[int, typer.Option(help="Measured samples per case and round.")] = 3,
    rounds: RoundsOption = 3,
    threads: Annotated[
        int,
        typer.Option(
            min=1, help="torch threads per rank (match the xbench kernel --threads you fitted)."
        ),
    ] = 1,
    cpu_attention: Annotated[
        str,
        typer.Option(
            help="CPU path for bf16 attention, merge and splice: auto, c-bf16 or torch (match "
            "the xbench kernel --cpu-attention you fitted)."
        ),
    ] = "auto",
    runs: Annotated[
        int,
        typer.Option(
            help="Launch the ranks this many times into one run (process_run column): a "
            "launch's placement moves every case together on a shared machine."
        ),
    ] = 1,
    timeout: Annotated[
        float, typer.Option(min=1e-3, help="Seconds before a case is declared hung.")
    ] = 300.0,
    device: Annotated[
        str,
        typer.Option(
            help="cpu, or cuda: tensors and kernels on the GPU of each rank (two ranks may "
            "share one)."
        ),
    ] = "cpu",
    wire: Annotated[
        str,
        typer.Option(
            help="How messages cross: host (MPI on the tensors' memory; CPU only), staged "
            "(copied through host buffers around MPI, for GPU tensors), cuda-aware (MPI "
            "handed the GPU's memory: an MPI built with CUDA), nccl "
            "(torch.distributed on the tensors: NCCL on GPUs, one each; gloo on CPUs) or "
            "nvshmem (NVSHMEM puts between GPUs, one each, from and into the symmetric heap); "
            "default: host on cpu, staged on cuda."
        ),
    ] = "auto",
    launch: Annotated[
        str,
        typer.Option(
            help="auto, graph or eager: on GPUs, replay each compute call (attention, merge, "
            "gather, splice) from a CUDA graph, as serving engines run decode and as "
            "xbench kernel times them (default there), or launch them one by one."
        ),
    ] = "auto",
    out: RunDirOption = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Time the real primitives, check them against one-instance attention, report the model's MAPE."""
    from xbench.core.profile import load_profile
    from xbench.core.units import parse_int_list
    from xbench.resources import profile_path
    from xbench.results.metadata import new_run_id
    from xbench.results.store import claim_run_dir
    from xbench.validate import ValidateConfig

    prof = load_profile(profile_path(profile))
    fab = _fabric(prof, fabric)
    if np != 2:
        raise XbenchError(f"--np {np}: validate runs one requester and one holder", "pass --np 2")
    check_threads(threads)
    choose_cpu_attention(cpu_attention)
    from xbench.core.sweep_rules import resolve_launch

    wire = _check_device(device, wire)
    launch = resolve_launch(device, launch)
    run_id = new_run_id("validate")
    out_dir = out or Path("results") / run_id
    cfg = ValidateConfig(
        out_dir=str(out_dir),
        run_id=run_id,
        rows=tuple(parse_int_list(rows, "--rows")),
        chunks=tuple(parse_int_list(chunk, "--chunk")),
        heads=heads,
        dtype=dtype,
        fetch_layout=fetch_layout,
        samples=samples,
        rounds=rounds,
        threads=threads,
        timeout_s=timeout,
        fabric=fab,
        cpu_attention=cpu_attention,
        runs=runs,
        device=device,
        wire=wire,
        launch=launch,
    )
    from xbench.fabric.launch import inside_launcher, refuse_srun_without_pmi, require_mpiexec

    # the ranks compute with torch: said here, before a launch whose rank would die of it
    # (whether this process imported torch already depends on the CPU's attention path)
    require_installed("torch")
    refuse_srun_without_pmi()
    if inside_launcher():  # srun or mpirun started the two ranks: each runs its side here
        if runs != 1:
            raise XbenchError(
                f"--runs {runs} under a site launcher: each launch is the launcher's",
                "leave --runs out and start the launcher once per launch",
            )
        if _run_as_rank(cfg, out_dir):  # rank 0 reports
            _summarize(prof, fab, out_dir, fmt)
        return
    require_mpiexec()
    # only now: a refused command leaves no empty run directory behind
    claim_run_dir(out_dir)
    _launch(cfg, out_dir)
    _summarize(prof, fab, out_dir, fmt)


def _launch(cfg, out_dir: Path) -> None:
    """The two ranks launched from here, ``cfg.runs`` times: separate process sets,
    appending to one run."""
    from xbench.cli.progress import EventProgress, make_progress
    from xbench.fabric.launch import run_ranks

    config_path = out_dir / "validate-config.json"
    runs = cfg.runs
    for process_run in range(runs):
        cfg.process_run = process_run
        config_path.write_text(cfg.to_json())
        with make_progress() as progress:
            run_ranks(
                2,
                "xbench.validate.worker",
                config_path,
                EventProgress(
                    progress,
                    "validate" + (f" (launch {process_run + 1}/{runs})" if runs > 1 else ""),
                ),
                cfg.timeout_s + 60,
                launch_label=f" of launch {process_run + 1}/{runs}",
            )


def _fabric(prof, fabric: str | None) -> str:
    """The profile's fabric that predicts these ranks: --fabric, else shm (local ranks)."""
    names = [f.name for f in prof.fabrics]
    fab = fabric or ("shm" if "shm" in names else None)
    if fab not in names:
        raise XbenchError(
            f"profile {prof.name} has no fabric {fab or 'shm'!r} to predict local ranks with",
            f"fit a profile from xbench probe between local ranks, or pass --fabric ({', '.join(names)})",
        )
    return fab


def _run_as_rank(cfg, out_dir: Path) -> bool:
    """One of the two ranks a site launcher started: rank 0 claims the run directory (and
    both ranks stop when it cannot), then both run the worker's loop in-process. True on
    rank 0."""
    from xbench.ranks import start_mpi

    MPI = start_mpi()  # at the level xbench's own launches ask for

    from xbench.cli.progress import RichSink
    from xbench.events import NullSink
    from xbench.fabric.launch import srun_task
    from xbench.results.stopping import failures_stop_the_job, stop_when_signalled
    from xbench.results.store import claim_run_dir
    from xbench.validate.worker import run_validate

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise XbenchError(
            f"validate runs one requester and one holder; the launcher started {comm.Get_size()} ranks",
            "launch exactly 2 ranks (srun --ntasks=2)",
        )
    rank0 = comm.Get_rank() == 0
    refused = None
    if rank0:
        try:
            claim_run_dir(out_dir)
        except XbenchError as exc:
            refused = exc
    if comm.bcast(refused is not None, root=0):
        raise refused or XbenchError("rank 0 could not claim the run directory", "see its line")
    cfg = type(cfg).from_json(comm.bcast(cfg.to_json(), root=0))  # rank 0's options rule
    sink = RichSink() if rank0 else NullSink()
    stop_when_signalled(comm.Get_rank(), sink, others_wait=not srun_task())
    with failures_stop_the_job(sink, out_dir):
        run_validate(cfg, sink)
    return rank0


def _summarize(prof, fab: str, out_dir: Path, fmt) -> None:
    """The summary table and file of a finished run (rank 0's job under a site launcher)."""
    from xbench.core import conditions
    from xbench.results.schema import VALIDATE_SAMPLES, VALIDATE_SUMMARY
    from xbench.results.store import read_run_meta, read_table, write_table
    from xbench.validate import summarize_validation

    meta = read_run_meta(out_dir)
    warn_conditions(prof, conditions.from_run_meta(meta))
    summary = summarize_validation(read_table(out_dir, VALIDATE_SAMPLES), prof, fab)
    write_table(out_dir / "validate_summary.parquet", VALIDATE_SUMMARY, summary, meta)
    wire = prof.provenance.get("wire_pattern", {}).get(fab)
    run = meta.get("config", {})
    emit_frame(summary, fmt, lambda f: _table(f, prof.name, fab, out_dir, wire, run))
    if not summary.correct.all():
        raise XbenchError(
            "a path's output differs from one-instance attention beyond tolerance",
            f"see {out_dir}/validate_summary.parquet",
        )


def check_wire(device: str, wire: str) -> None:
    """The --device and --wire pair, wherever the ranks will run (``xbench slurm`` checks
    it on the login node, before it writes a script)."""
    from xbench.validate.wire import WIRES

    if device not in ("cpu", "cuda"):
        raise XbenchError(f"unknown --device {device!r}", "pick cpu or cuda")
    if wire not in (*WIRES, "auto"):
        raise XbenchError(f"unknown --wire {wire!r}", f"pick auto, {', '.join(WIRES)}")
    if wire == "nvshmem" and device != "cuda":
        raise XbenchError(
            "--wire nvshmem puts one GPU's memory into another's",
            "pass --device cuda, or --wire host or nccl on CPUs",
        )
    if wire == "host" and device == "cuda":
        raise XbenchError(
            "--wire host hands MPI the tensors' memory, which is on the GPU with --device cuda",
            "pass --wire staged (copies through host buffers), or leave --wire auto",
        )


def _check_device(device: str, wire: str) -> str:
    """The wire to use, or a one-line refusal (before anything is launched or written)."""
    check_wire(device, wire)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise XbenchError(
                "--device cuda needs a CUDA GPU, and torch sees none here",
                "run on a GPU machine, or use --device cpu",
            )
        if wire == "nvshmem":
            from xbench.fabric.nvshmem import NvshmemTransport

            NvshmemTransport.require_library()  # the wheel to install, before any rank starts
        return "staged" if wire == "auto" else wire
    return "host" if wire == "auto" else wire


def _table(
    summary, profile: str, fabric: str, out_dir, wire: str | None = None, run: dict | None = None
) -> None:
    from xbench.cli.render import add_columns, notes, result_table

    table = result_table(f"xbench validate: measured against profile {profile} on {fabric}")
    label = interval_label(summary.ci_coverage)
    add_columns(
        table,
        ("option", "rows", "chunk", "measured us", label, "model us", "error", "output"),
        left=("option", "output"),
    )
    for r in summary.itertuples():
        table.add_row(
            r.option,
            str(r.rows),
            str(r.chunk_tokens),
            f"{r.measured_us:,.1f}",
            f"{r.ci_low_us:,.1f}-{r.ci_high_us:,.1f}",
            f"{r.predicted_us:,.1f}",
            f"{100 * r.error:+.1f}%",
            coloured("matches", "green") if r.correct else coloured("differs", "red"),
        )
    console.print(table)
    notes(f"error = (model - measured) / measured; samples: {out_dir}/")
    from xbench.validate import validation_errors

    errors = validation_errors(summary)
    console.print(
        f"MAPE {100 * errors['mape']:.1f}%, bias {100 * errors['bias']:+.1f}% (worst "
        f"{100 * errors['worst']:.1f}%, {len(summary)} cases on {fabric}); by option: "
        + ", ".join(
            f"{k} {100 * v:.1f}% (bias {100 * errors['bias_by_option'][k]:+.1f}%)"
            for k, v in sorted(errors["by_option"].items())
        )
    )
    _phase_table(summary)
    moved = summary[summary.option != "local"]
    comp = moved.composition_error.abs()
    console.print(
        f"diagnostic, not held out: with this run's measured T_c in place of the fitted one, "
        f"route/fetch error {100 * comp.mean():.1f}% (worst {100 * comp.max():.1f}%): what is "
        "left is the composition of the phases, not the compute fit",
        style="dim",
    )
    if wire == "latency":
        console.print(
            "the profile's wire segments come from hot ping-pong (latency); a probe with "
            "-p offcache gives the cold-cache regime that routed and fetched messages meet",
            style="dim",
        )
    if run and run.get("device") == "cuda":
        _gpu_note(run, fabric)


def _gpu_note(run: dict, fabric: str) -> None:
    """On GPUs, what the messages went through and how the compute was launched: the wire
    phases are that path's, whatever fabric's terms predict them."""
    from xbench.validate.wire import transport_label

    wire = run.get("wire", "staged")
    launched = "replayed from CUDA graphs" if run.get("launch") == "graph" else "launched eagerly"
    console.print(
        f"on the GPUs: messages through {transport_label(wire, 'cuda')} (--wire {wire}), "
        f"predicted with {fabric}'s wire terms; compute calls {launched}",
        style="dim",
    )


def _phase_table(summary) -> None:
    """Which term is off: each phase summed over the cases, measured against the model."""
    from xbench.validate import phase_errors

    phases = phase_errors(summary)
    if phases.empty or phases.measured_us.isna().all():
        return
    from xbench.cli.render import add_columns, result_table

    table = result_table("by phase, summed over the cases")
    add_columns(
        table,
        ("option", "phase", "measured us", "model us", "error of total"),
        left=("option", "phase"),
    )
    for r in phases.itertuples():
        table.add_row(
            r.option,
            r.phase,
            f"{r.measured_us:,.1f}",
            f"{r.predicted_us:,.1f}",
            f"{100 * r.error_of_total:+.1f}%" if r.error_of_total == r.error_of_total else "-",
        )
    console.print(table)
    from xbench.cli.render import notes

    notes("error of total: the mean over cases of (model - measured phase) / measured time")
