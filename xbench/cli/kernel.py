"""``xbench kernel``: time MLA partial attention, merge, gather and splice on this device."""

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
    console,
    emit_frame,
    handles_errors,
    interval_label,
)
from xbench.cli.render import add_columns, notes, num, result_table
from xbench.core.units import (
    format_duration,
    parse_duration,
    parse_duration_list,
    parse_int_list,
    parse_name_list,
)
from xbench.errors import XbenchError


@handles_errors
def kernel(
    model: Annotated[str, typer.Option(help="Model preset (xbench models).")] = "deepseek-v3.2",
    backend: Annotated[
        str,
        typer.Option(
            help="auto (triton on CUDA, torch on CPU), torch, triton, cuda-ref (a correctness "
            "reference that fits skip), flashmla or flashinfer."
        ),
    ] = "auto",
    launch: Annotated[
        str,
        typer.Option(
            help="auto, graph or eager: on GPUs, replay each sample's calls from a CUDA graph "
            "(as serving engines run decode; default there) or launch them one by one."
        ),
    ] = "auto",
    kernels: Annotated[
        str,
        typer.Option(
            help="Comma list of partial_attention, merge, gather, splice, prefill (causal "
            "attention over each --chunk length at the model's prefill shapes; fits T_recompute)."
        ),
    ] = "partial_attention,merge,gather,splice",
    rows: Annotated[
        str, typer.Option(help="Query rows (decode tokens) routed together, e.g. 1,8,64.")
    ] = "1,8,64",
    chunk: Annotated[
        str, typer.Option(help="Tokens attended or moved: 64:16384 doubles, or a list.")
    ] = "64:16384",
    dtype: Annotated[str, typer.Option(help="bf16 or fp32 (query and cache).")] = "bf16",
    sparse: Annotated[
        bool,
        typer.Option(
            "--sparse/--dense",
            help="Random top-k token selections (per row) instead of dense pages.",
        ),
    ] = False,
    heads: Annotated[
        int | None,
        typer.Option(
            min=1, help="Heads per device (after tensor parallelism); default: the model's."
        ),
    ] = None,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 64,
    samples: Annotated[int, typer.Option(help="Measured samples per case and round.")] = 5,
    warmups: Annotated[
        int, typer.Option(min=0, help="Warm-up samples per case and round (stored, flagged).")
    ] = 1,
    rounds: RoundsOption = 1,
    min_sample_time: Annotated[
        str, typer.Option(help="Calibrate calls so one sample lasts at least this.")
    ] = "20ms",
    ceilings: Annotated[
        bool,
        typer.Option(
            "--ceilings/--no-ceilings",
            help="Measure this device's copy bandwidth and matmul rate first.",
        ),
    ] = True,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda when torch sees a GPU).")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            min=1, help="torch CPU threads (match what the serving or validate ranks get)."
        ),
    ] = None,
    cpu_attention: Annotated[
        str,
        typer.Option(
            help="CPU path for bf16 attention, merge and splice: auto, c-bf16 (the AVX512-BF16 "
            "kernel) or torch (its fp32 products)."
        ),
    ] = "auto",
    in_context: Annotated[
        bool | None,
        typer.Option(
            "--in-context/--back-to-back",
            help="Time merge, gather and splice right after an attention over the chunk, and "
            "the attention at the fewest rows also right after a splice of its chunk, as a "
            "route or fetch runs them (default on CPUs), or back to back (default on GPUs).",
        ),
    ] = None,
    idle: Annotated[
        str,
        typer.Option(
            help="Also time the attention at the fewest rows after the device idled this "
            "long before each call, e.g. 1ms,4ms,16ms (fits the cost a call pays after "
            "idle, which the simulator charges); auto: those three on CPUs, none on GPUs; "
            "none.",
        ),
    ] = "auto",
    merge_wait: Annotated[
        str,
        typer.Option(
            help="Also time the merge at every rows after the timing thread spun this long "
            "before each call, e.g. 500us,2ms,8ms,32ms,128ms (a route's requester merges after "
            "polling MPI for the answer; fits how much longer that merge takes); auto: those "
            "five on CPUs, none on GPUs; none.",
        ),
    ] = "auto",
    np: Annotated[
        int,
        typer.Option(
            "--np",
            "-n",
            help="1: the sweep alone in this process; 2: in two pinned ranks, the one not "
            "timing waiting in MPI (the layout xbench validate runs its paths in).",
        ),
    ] = 1,
    runs: Annotated[
        int,
        typer.Option(
            help="Launch the sweep this many times into one run (process_run column), as "
            "pyperf repeats processes; more than 1 launches it through MPI."
        ),
    ] = 1,
    config_from: Annotated[
        Path | None,
        typer.Option(
            help="Re-run the sweep a stored kernel run was made with (its run.json); the "
            "options above are then ignored (xbench check uses this)."
        ),
    ] = None,
    out: RunDirOption = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Time the compute side of cross-instance attention; write samples as Parquet."""
    from xbench.core.models import mla_model

    # What can be checked without torch is checked first: a mistyped option is refused in
    # under a second, not after the seconds torch takes to import.
    from xbench.core.sweep_rules import LAUNCHES, check_sweep
    from xbench.fabric.launch import refuse_launched_ranks, require_mpiexec

    preset = mla_model(model, "--model")
    check_sweep(dtype, rounds, samples, np, runs)
    refuse_launched_ranks(
        "kernel", "xbench kernel --np 2 (under Slurm, srun -n1, as xbench slurm kernel writes)"
    )
    # 2^26 tokens is 77 GB of one layer's KV: more than any GPU's memory holds for one chunk
    chunks = parse_int_list(chunk, "--chunk", most=2**26, what="a chunk one device holds")
    row_list = parse_int_list(rows, "--rows", most=2**16, what="rows in one decode call")
    check_threads(threads)
    if launch not in ("auto", *LAUNCHES):
        raise XbenchError(f"unknown --launch {launch!r}", "pick auto, graph or eager")
    for option, text, auto_cpu in (
        ("--idle", idle, DEFAULT_IDLE_CPU),
        ("--merge-wait", merge_wait, DEFAULT_MERGE_WAIT_CPU),
    ):
        duration_list(text, "cpu", option, auto_cpu)  # (the device only sets what auto is)
    min_sample_s = parse_duration(min_sample_time)

    from xbench.kernels.bench import KERNELS, default_device
    from xbench.kernels.summary import summarize_kernels
    from xbench.kernels.worker import SweepConfig
    from xbench.results.metadata import new_run_id
    from xbench.results.schema import KERNEL_SAMPLES
    from xbench.results.store import claim_run_dir, read_table

    names = parse_name_list(kernels, "--kernels", KERNELS, "kernel")
    dev = device or default_device()
    backend, launch = _where_it_runs(dev, backend, launch, cpu_attention)
    check_extra_timings(names, idle, merge_wait)
    idle_us = duration_list(idle, dev, "--idle", DEFAULT_IDLE_CPU)
    merge_wait_us = duration_list(merge_wait, dev, "--merge-wait", DEFAULT_MERGE_WAIT_CPU)
    if "partial_attention" not in names:
        idle_us = []
    if "merge" not in names:
        merge_wait_us = []
    run_id = new_run_id("kernel")
    out_dir = out or Path("results") / run_id
    cfg = SweepConfig(
        out_dir=str(out_dir),
        run_id=run_id,
        model=preset.name,
        backend=backend,
        device=dev,
        launch=launch,
        kernels=names,
        rows=row_list,
        chunks=chunks,
        dtype=dtype,
        sparse=sparse,
        heads=heads,
        block_size=block_size,
        samples=samples,
        warmups=warmups,
        rounds=rounds,
        min_sample_s=min_sample_s,
        ceilings=ceilings,
        threads=threads,
        cpu_attention=cpu_attention,
        in_context=in_context,
        ranks=np,
        runs=runs,
        idle_us=idle_us,
        merge_wait_us=merge_wait_us,
    )
    if config_from is not None:
        cfg = SweepConfig.from_stored_run(config_from, out_dir=cfg.out_dir, run_id=cfg.run_id)
    if cfg.launches_ranks:
        require_mpiexec()
    # only now: a refused command leaves no empty run directory behind
    claim_run_dir(out_dir)
    run_configured(cfg)
    summary = summarize_kernels(read_table(out_dir, KERNEL_SAMPLES))
    emit_frame(summary, fmt, lambda f: _table(f, out_dir))


def _where_it_runs(dev: str, backend: str, launch: str, cpu_attention: str) -> tuple[str, str]:
    """(backend, launch) for the device: the backend resolved and able to run here, the
    launch (graph on CUDA, eager on CPU, unless asked), and the CPU attention's path chosen;
    each refused in one line where it cannot be."""
    from xbench.core.sweep_rules import resolve_launch
    from xbench.kernels.backend import get_backend, resolve

    if dev not in ("cpu", "cuda") and not dev.startswith("cuda:"):
        raise XbenchError(f"unknown device {dev!r}", "pick cpu or cuda")
    if dev != "cpu":
        _require_cuda_device(dev)
    choose_cpu_attention(cpu_attention)
    backend = resolve(backend, dev)
    get_backend(backend)  # a backend that cannot run here says why before anything is measured
    return backend, resolve_launch(dev, launch)


def _require_cuda_device(dev: str) -> None:
    """A CUDA device torch can use, before any backend or folder is touched: a CPU build of
    torch, a machine without a GPU or driver, or an index past the GPUs seen."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = dev.partition(":")[2]
    if not index.isdigit() and index:
        raise XbenchError(f"unknown device {dev!r}", "pick cpu, cuda or cuda:N")
    if count == 0:
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise XbenchError(
            f"--device {dev}: torch {torch.__version__} ({build}) sees no CUDA device here",
            "run on a GPU machine with a CUDA build of torch (xbench env says what it sees), "
            "or pass --device cpu",
        )
    if index and int(index) >= count:
        raise XbenchError(
            f"--device {dev}: torch sees {count} CUDA device(s), 0 to {count - 1}",
            f"pass --device cuda:0 to cuda:{count - 1}",
        )


# A server's idle times at moderate load span these.
DEFAULT_IDLE_CPU = "1ms,4ms,16ms"
# A route's wait for its answer (the holder's attention) spans these on a CPU.
DEFAULT_MERGE_WAIT_CPU = "500us,2ms,8ms,32ms,128ms"


def check_extra_timings(kernels, idle: str, merge_wait: str) -> None:
    """Refuse --idle or --merge-wait times given for a kernel --kernels leaves out: those
    cases were silently not timed. Auto and none ask for no time in particular: what
    ``duration_list`` gives where auto means none (a GPU)."""
    for option, text, timed in (
        ("--idle", idle, "partial_attention"),
        ("--merge-wait", merge_wait, "merge"),
    ):
        if timed not in kernels and duration_list(text, "cuda", option, ""):
            raise XbenchError(
                f"{option} {text} times {timed}, and --kernels {','.join(kernels)} leaves it out",
                f"add {timed} to --kernels, or leave {option} out",
            )


def duration_list(text: str, device: str, option: str, auto_cpu: str) -> list[int]:
    """--idle or --merge-wait as whole microseconds: auto is ``auto_cpu`` on CPUs and none
    on GPUs, where neither has been measured."""
    text = text.strip()
    if text == "auto":
        text = auto_cpu if device == "cpu" else "none"
    if text in ("none", "0", ""):
        return []
    seconds = parse_duration_list(text, option, 1e-6, 1.0, auto_cpu)
    return sorted({round(s * 1e6) for s in seconds})


def run_configured(cfg) -> None:
    """The sweep as configured: in this process, or in launched ranks (--np 2, --runs N)."""
    from xbench.cli.progress import bars
    from xbench.launches import run_kernel_sweep

    run_kernel_sweep(cfg, progress=bars)


SHORT = {
    "partial_attention": "attention",
    "merge": "merge",
    "gather": "gather",
    "splice": "splice",
    "prefill": "prefill",
}


def _bound(r) -> str:
    """The share of the bound, and which ceiling sets it: m the matmul rate, c the copy."""
    if r.bound_share != r.bound_share:
        return "-"
    matmul = r.flops and r.matmul_share >= (r.copy_share if r.copy_share == r.copy_share else 0)
    return f"{100 * r.bound_share:.0f} {'m' if matmul else 'c'}"


def _chunk(r) -> str:
    if getattr(r, "idle_us", 0):
        return f"{r.chunk_tokens} idle {format_duration(r.idle_us * 1e-6)}"
    if getattr(r, "wait_us", 0):
        return f"wait {format_duration(r.wait_us * 1e-6)}"
    if getattr(r, "after_splice_tokens", 0):
        return f"{r.chunk_tokens} spliced"
    if not r.after_tokens:
        return str(r.chunk_tokens)
    return f"after {r.after_tokens}" if not r.chunk_tokens else f"{r.chunk_tokens} after"


def _table(summary, out_dir) -> None:
    title = "xbench kernel"
    if len(summary):
        first = summary.iloc[0]
        selection = "sparse" if first["sparse"] else "dense"
        title += (
            f": {first['backend']} on {first['device']}, {first['model']}, "
            f"{first['heads']} heads, {first['dtype']}, {selection}"
        )
    table = result_table(title)
    label = interval_label(summary.ci_coverage)
    add_columns(
        table,
        ("kernel", "rows", "chunk", "us", label, "GB/s", "GFLOP/s", "%bound"),
        left=("kernel",),
        # a slow machine's 6-digit times and intervals need the room; a case's label may
        # take two lines ("4096 idle" over "16ms"), a number may not lose its digits
        wraps=("chunk",),
    )
    for r in summary.itertuples():
        table.add_row(
            SHORT[r.kernel],
            str(r.rows),
            _chunk(r),
            num(r.median_us),
            f"{num(r.ci_low_us)}-{num(r.ci_high_us)}",
            num(r.gb_per_s),
            num(r.gflop_per_s) if r.flops else "-",
            _bound(r),
        )
    console.print(table)
    notes(
        f"us: the median time a call, {label}: its interval. %bound: max(bytes / copy "
        "bandwidth, FLOPs / matmul rate) / time, with the rates torch's copy and GEMM reached "
        "in this run (m: the matmul rate sets it, c: the copy bandwidth): a share of what the "
        "library reached here, not of the hardware's peak; above 100, the kernel passed it.",
        "after: timed right after an attention over the chunk, as in a route or a fetch; "
        "idle T: each call after the device idled T; wait T: each call after spinning T, as "
        "a route's merge follows its wait; spliced: an attention right after a splice of its "
        "chunk into its pages, as a fetch's first use.",
        f"samples: {out_dir}/",
    )
