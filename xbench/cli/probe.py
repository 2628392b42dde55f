"""``xbench probe``: fabric latency and bandwidth between MPI ranks."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    OversubscribeOption,
    RunDirOption,
    check_rank_count,
    console,
    emit_frame,
    handles_errors,
    warn,
)
from xbench.core.units import (
    parse_duration,
    parse_int_list,
    parse_name_list,
    parse_size,
    parse_size_list,
)
from xbench.errors import XbenchError
from xbench.fabric.device_probe import PUT_SCOPES
from xbench.fabric.launch import STARTUP_S
from xbench.fabric.registry import INITIATORS, TRANSPORTS, check_fabric
from xbench.probe.patterns import DEFAULT_PATTERNS, PATTERNS, SweepSpec
from xbench.probe.runner import BACKENDS, BINDINGS, DEVICES, LOOPS

# The choices the configuration takes (ProbeConfig keeps the same rules for stored configs)
Loop = Enum("Loop", [(v, v) for v in LOOPS], type=str)
Binding = Enum("Binding", [(v, v) for v in BINDINGS], type=str)
Device = Enum("Device", [(v, v) for v in DEVICES], type=str)
Backend = Enum("Backend", [(v, v) for v in BACKENDS], type=str)
Initiator = Enum("Initiator", [(v, v) for v in INITIATORS], type=str)
PutScope = Enum("PutScope", [(v, v) for v in PUT_SCOPES], type=str)


def _patterns(text: str) -> tuple[str, ...]:
    if text == "all":
        return PATTERNS
    return tuple(parse_name_list(text, "--pattern", PATTERNS, "pattern"))


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)


def _timeout(text: str) -> float:
    seconds = _seconds(text)
    if not seconds > 0:  # 0, negative or nan: no case could finish
        raise XbenchError(f"--timeout {text}: no case could finish", "pass e.g. --timeout 120s")
    return seconds


def _block_bytes(text: str) -> int:
    size = parse_size(text)
    if size < 1:
        raise XbenchError(
            f"--block-size {text}: a block holds bytes", "pass e.g. --block-size 72KiB"
        )
    return size


@handles_errors
def probe(
    np: Annotated[
        int,
        typer.Option(
            "--np",
            "-n",
            help="Ranks to launch on this host (ignored by ranks srun or mpirun started; the one task of an srun step launches them).",
        ),
    ] = 2,
    pattern: Annotated[
        str, typer.Option("--pattern", "-p", help=f"Comma list of {', '.join(PATTERNS)}, or all.")
    ] = ",".join(DEFAULT_PATTERNS),
    sizes: Annotated[
        str,
        typer.Option(
            help="Message sizes: 8B:16MiB (doubling), 1KiB:1MiB:x4, or 8B,1KB,64KiB. KB=1000 B, KiB=1024 B."
        ),
    ] = "1B:4MiB",
    window: Annotated[int, typer.Option(help="Messages in flight for bandwidth and bibw.")] = 64,
    rows: Annotated[
        str, typer.Option(help="rtt: query rows per round trip, e.g. 1,8,64.")
    ] = "1,8,64",
    payload: Annotated[
        str, typer.Option(help="rtt: bytes sent per row (576 bf16 elements = 1152B).")
    ] = "1152B",
    return_: Annotated[
        str,
        typer.Option("--return", help="rtt: bytes returned per row (512 bf16 + fp32 LSE = 1028B)."),
    ] = "1028B",
    blocks: Annotated[
        str, typer.Option(help="gather, offgather: blocks per fetch, e.g. 1,4,16,64.")
    ] = "1,4,16,64",
    block_size: Annotated[
        str, typer.Option(help="gather, offgather: bytes per block (64 tokens x 1152 B = 72KiB).")
    ] = "72KiB",
    transport: Annotated[str, typer.Option(help=f"One of {', '.join(TRANSPORTS)}.")] = "mpi",
    fabric: Annotated[
        str | None,
        typer.Option(
            help="The fabric to measure: nvlink, ib, ibgda, roce, tcp, shm; it labels the "
            "samples and, for nccl, nvshmem and mpi, sets the library's variables that force "
            "it (fabric presets; inferred from the ranks' hosts when absent)."
        ),
    ] = None,
    pairs: Annotated[str, typer.Option(help="Rank pairs: 0-1, all, or 0-1,0-2.")] = "0-1",
    samples: Annotated[
        int | None,
        typer.Option(
            help="Measured samples per case (default 10; 1 with --iterations/--osu-compat)."
        ),
    ] = None,
    iterations: Annotated[
        int | None,
        typer.Option(
            help="OSU's method: every sample runs exactly N iterations (no calibration); the "
            "table reports the aggregate mean, total time over total iterations."
        ),
    ] = None,
    skip: Annotated[
        int, typer.Option(help="With --iterations: untimed iterations before the first sample.")
    ] = 0,
    osu_compat: Annotated[
        bool,
        typer.Option(
            "--osu-compat",
            help="osu_latency / osu_bw / osu_bibw's own iteration and skip counts per size "
            "(10000+100 or 1000+10 round trips; 100+10 or 20+2 windows), aggregate mean. "
            "From 1 MiB in shared memory both tools can still differ by 10-20 %: the copies "
            "run faster between buffers mapped after more memory, and a Python rank holds "
            "about 48 MiB before its buffers, OSU about 3 (benchmarks/compare_osu.py "
            "--osu-ahead 48 gives OSU the same).",
        ),
    ] = False,
    warmups: Annotated[int, typer.Option(help="Warm-up samples per case (stored, flagged).")] = 2,
    min_sample_time: Annotated[
        str, typer.Option(help="Calibrate iterations so one sample lasts at least this.")
    ] = "10ms",
    timeout: Annotated[
        str,
        typer.Option(
            help="Fail a case that runs longer than this (a hung or dead rank); the ranks' "
            f"start gets {STARTUP_S:g} s more."
        ),
    ] = "120s",
    loop: Annotated[
        Loop, typer.Option(help="Timed inner loop: auto (C if mpicc works), c, python.")
    ] = Loop.auto,
    bind: Annotated[
        Binding, typer.Option(help="Pin launched ranks (mpiexec -bind-to).")
    ] = Binding.core,
    runs: Annotated[
        int,
        typer.Option(
            help="Launch the ranks this many times into one run (process_run column), as pyperf repeats processes."
        ),
    ] = 1,
    hostfile: Annotated[
        Path | None,
        typer.Option(help="Hosts file for the launched mpiexec/mpirun (-f / --hostfile)."),
    ] = None,
    oversubscribe: OversubscribeOption = False,
    device: Annotated[
        Device, typer.Option(help="Buffers on host or cuda (mpi --device cuda: CUDA-aware MPI).")
    ] = Device.host,
    backend: Annotated[
        Backend,
        typer.Option(help="nccl transport: nccl on GPUs, or gloo for the same path on CPUs."),
    ] = Backend.nccl,
    initiator: Annotated[
        Initiator,
        typer.Option(
            help="Who posts the messages: the host, or GPU kernels (nvshmem: device-initiated "
            "puts, IBGDA on InfiniBand; built with nvcc against NVSHMEM's device library)."
        ),
    ] = Initiator.host,
    put_scope: Annotated[
        PutScope | None,
        typer.Option(
            help="--initiator device: who issues each ping-pong put: one thread (NVSHMEM "
            "perftest's latency), a warp (default; as kernels that move KV pages put) or the "
            "block. Over NVLink a put is its threads' own copy."
        ),
    ] = None,
    tcp_interface: Annotated[
        str | None, typer.Option(help="tcp: network interface to listen on, e.g. eth0.")
    ] = None,
    config_from: Annotated[
        Path | None,
        typer.Option(
            help="Re-run the sweep a stored probe run was made with (its run.json), with its "
            "ranks and launches; the options above are then ignored (xbench check uses this)."
        ),
    ] = None,
    process_run: Annotated[
        int,
        typer.Option(
            help="Under a site launcher: this launch's index, appending to the run already in "
            "--out (a Slurm job runs each launch as its own srun step; xbench slurm check)."
        ),
    ] = 0,
    out: RunDirOption = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Measure latency and bandwidth between MPI ranks; write samples as Parquet."""
    from xbench.fabric.launch import inside_launcher, launcher_name
    from xbench.fabric.presets import preset_env
    from xbench.probe.runner import (
        ProbeConfig,
        check_transport_options,
        refuse_nvlink_from_host_memory,
    )
    from xbench.results.metadata import new_run_id

    spec = SweepSpec(
        patterns=_patterns(pattern),
        sizes=tuple(parse_size_list(sizes)),
        window=window,
        rows=tuple(parse_int_list(rows, "--rows")),
        payload=parse_size(payload),
        return_bytes=parse_size(return_),
        blocks=tuple(parse_int_list(blocks, "--blocks")),
        block_bytes=_block_bytes(block_size),
    )
    fixed = osu_compat or iterations is not None
    min_sample_s, timeout_s = parse_duration(min_sample_time), _timeout(timeout)
    run_id = new_run_id("probe")
    out_dir = out or Path("results") / run_id
    launched = inside_launcher()
    cfg = ProbeConfig(
        out_dir=str(out_dir),
        run_id=run_id,
        sweep=spec,
        transport=transport,
        fabric=check_fabric(fabric),
        pairs=pairs,
        samples=samples if samples is not None else (1 if fixed else 10),
        warmups=warmups,
        min_sample_s=min_sample_s,
        timeout_s=timeout_s,
        loop=loop.value,
        tcp_interface=tcp_interface,
        bind=bind.value if not launched else "by launcher",
        device=device.value,
        backend=backend.value,
        initiator=initiator.value,
        put_scope=put_scope.value if put_scope else None,
        preset_env=preset_env(transport, fabric, backend.value),
        iterations=iterations,
        skip=skip,
        osu_compat=osu_compat,
    )

    if config_from is None:
        check_transport_options(transport, tcp_interface, backend.value)
        refuse_nvlink_from_host_memory(cfg)
    else:
        cfg, np, stored_runs = ProbeConfig.from_stored_run(
            config_from,
            out_dir=cfg.out_dir,
            run_id=cfg.run_id,
            tcp_interface=cfg.tcp_interface,
            bind=cfg.bind,
        )
        # under a site launcher each step is one launch (--process-run says which)
        runs = 1 if launched else stored_runs
    if process_run:
        cfg = _continued(cfg, out_dir, process_run, launched)
    if launched and runs > 1:
        raise XbenchError(
            "--runs needs xbench to launch the ranks itself",
            "under srun/mpirun, run the job step several times with separate --out",
        )
    if launched:
        _run_as_rank(cfg, launcher_name(), fmt)
    else:
        _launch_here(cfg, np, runs, hostfile, oversubscribe, fmt)


def _launch_here(cfg, np: int, runs: int, hostfile, oversubscribe: bool, fmt) -> None:
    """Launch the ranks from here: everything that can be refused is, before --out exists."""
    from xbench.fabric.launch import refuse_srun_without_pmi, require_mpiexec
    from xbench.launches import prepare_loop
    from xbench.probe.runner import parse_pairs
    from xbench.results.store import announce_run, claim_run_dir

    if np < 2:
        raise XbenchError(f"--np {np}: the probe needs at least 2 ranks", "pass --np 2 or more")
    if runs < 1:
        raise XbenchError(f"--runs {runs}: at least one launch", "pass --runs 1 or more")
    if hostfile is not None and not hostfile.exists():
        raise XbenchError(
            f"hosts file {hostfile} does not exist",
            "pass --hostfile with one host[:slots] per line",
        )
    parse_pairs(cfg.pairs, np)  # as the ranks will, but before any starts
    check_rank_count(np, hostfile is not None, oversubscribe)
    refuse_srun_without_pmi()
    require_mpiexec()
    _require_imports(cfg)
    _require_host_memory(cfg, np if hostfile is None else 1)
    prepare_loop(cfg, warn)  # a loop that cannot be built is refused before --out exists
    # only now: a refused command leaves no empty run directory behind (under a launcher,
    # rank 0 alone creates it)
    out_dir = Path(cfg.out_dir)
    claim_run_dir(out_dir)
    announce_run(out_dir, _announced(cfg, np))
    launch(cfg, np, fmt, hostfile, runs)


def _require_imports(cfg) -> None:
    """What the ranks and the summary will import, found before they start: without torch
    a nccl probe launched its ranks, which died at their first case (a partial run left)."""
    from xbench.errors import require_installed
    from xbench.fabric.registry import needs_torch

    if needs_torch(cfg.transport, cfg.device):
        require_installed("torch")
    require_installed("scipy")  # the summary's intervals, once the ranks are done


def _require_host_memory(cfg, ranks_here: int) -> None:
    """The host buffers the sweep's largest case maps in every rank (its messages, a
    gather's blocks and their packed copy), against what this host has available for the
    ranks it starts here (all of them without a hosts file; one with, as other hosts may
    hold the rest): a rank that cannot map them dies before its first case."""
    from xbench.fabric.transport import host_buffer_sizes
    from xbench.host import available_memory
    from xbench.probe.patterns import buffer_plan

    available = available_memory()
    need = sum(host_buffer_sizes(buffer_plan(cfg.sweep))) * ranks_here
    if available is not None and need > available:
        raise XbenchError(
            f"the sweep's buffers need {need / 2**30:,.1f} GiB on this host ({ranks_here} "
            f"rank(s) of its largest message and gather), and it has {available / 2**30:,.1f} "
            "GiB available",
            "pass smaller --sizes, --blocks, --block-size or --rows",
        )


def _announced(cfg, np: int) -> dict:
    """What run.json says before the ranks start (rank 0 writes the full metadata)."""
    import datetime
    import json

    return {
        "run_id": cfg.run_id,
        "command": "probe",
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "ranks": np,
        "config": json.loads(cfg.to_json()),
    }


def _continued(cfg, out_dir: Path, process_run: int, launched: bool):
    """Launch ``process_run`` of the run already in ``out_dir`` (its run id, appended to)."""
    from xbench.results.store import read_run_meta

    if not launched:
        raise XbenchError(
            "--process-run is for launches a site launcher starts one by one",
            "started from a shell, pass --runs N instead",
        )
    run_id = read_run_meta(out_dir).get("run_id")
    if not run_id:
        raise XbenchError(
            f"--process-run {process_run}: no run in {out_dir} to append to",
            "run launch 0 into --out first",
        )
    cfg.run_id, cfg.process_run = run_id, process_run
    return cfg


def _run_as_rank(cfg, launcher: str, fmt: OutputFormat) -> None:
    from xbench.probe.worker import apply_preset

    apply_preset(cfg.preset_env)  # this rank's own options: MPI is not initialised yet
    from xbench.ranks import start_mpi

    # the level xbench's own launches ask for, so a run under srun or mpirun compares with
    # one that xbench launched (a baseline from --np 2 was refused as funneled vs multiple)
    MPI = start_mpi()

    from xbench.cli.progress import RichSink
    from xbench.events import NullSink
    from xbench.fabric.launch import srun_task
    from xbench.probe.runner import ProbeConfig, run_probe
    from xbench.results.stopping import failures_stop_the_job, stop_when_signalled

    rank = MPI.COMM_WORLD.Get_rank()
    # Rank 0's configuration rules (an MPMD line may give ranks different options);
    # only the listening interface is each rank's own.
    own_interface = cfg.tcp_interface
    cfg = ProbeConfig.from_json(MPI.COMM_WORLD.bcast(cfg.to_json(), root=0))
    cfg.tcp_interface, cfg.launcher = own_interface, launcher
    sink = RichSink() if rank == 0 else NullSink()
    stop_when_signalled(rank, sink, others_wait=not srun_task())
    try:
        with failures_stop_the_job(sink, cfg.out_dir):
            _require_imports(cfg)  # (each rank's Python: one that lacks it stops the job)
            run_probe(cfg, sink)
    except SystemExit as exc:
        raise typer.Exit(exc.code or 0) from None
    if rank == 0:
        _report(Path(cfg.out_dir), fmt)


def launch(
    cfg,
    np: int,
    fmt: OutputFormat,
    hostfile: Path | None = None,
    runs: int = 1,
    report: bool = True,
) -> None:
    from xbench.cli.progress import bars
    from xbench.launches import launch_probe

    launch_probe(cfg, np, hostfile=hostfile, runs=runs, progress=bars)
    if report:
        _report(Path(cfg.out_dir), fmt)


def _report(out_dir: Path, fmt: OutputFormat) -> None:
    from xbench.cli.render import probe_table
    from xbench.probe.summary import overhead, summarize_samples
    from xbench.results.schema import PROBE_SAMPLES
    from xbench.results.store import read_run_meta, read_table

    samples = read_table(out_dir, PROBE_SAMPLES)
    summary = summarize_samples(samples)
    config = read_run_meta(out_dir).get("config", {})
    fixed = bool(config.get("osu_compat") or config.get("iterations"))
    loops = ", ".join(f"{k} loop {v * 1e3:.2f} ns/iter" for k, v in overhead(samples).items())
    caption = (
        f"one-way latency = half round trip; MB = 10^6 B; timing loop overhead: {loops or 'n/a'}"
    )
    if fixed:
        caption += "; fixed iterations (OSU's method): mean = total time / total iterations"
    emit_frame(
        summary,
        fmt,
        lambda f: probe_table(f, caption=caption, statistic="aggregate" if fixed else "median"),
    )
    if fmt == OutputFormat.table:
        console.print(f"samples: {out_dir}/{PROBE_SAMPLES}/", highlight=False)
