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
    check_repeats,
    console,
    emit_frame,
    handles_errors,
    interval_label,
    note_run_dir,
)
from xbench.cli.render import num, result_table
from xbench.core.units import parse_duration, parse_int_list
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
        str, typer.Option(help="Comma list of partial_attention, merge, gather, splice.")
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
        typer.Option(help="Heads per device (after tensor parallelism); default: the model's."),
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 64,
    samples: Annotated[int, typer.Option(help="Measured samples per case and round.")] = 5,
    warmups: Annotated[
        int, typer.Option(help="Warm-up samples per case and round (stored, flagged).")
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
        typer.Option(help="torch CPU threads (match what the serving or validate ranks get)."),
    ] = None,
    out: RunDirOption = None,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Time the compute side of cross-instance attention; write samples as Parquet."""
    from xbench.cli.progress import make_progress
    from xbench.core.models import get_model
    from xbench.kernels.backend import get_backend, resolve
    from xbench.kernels.bench import (
        KERNELS,
        ceiling_rows,
        default_device,
        measure_ceilings,
        plan_cases,
        sample_rows,
        time_case,
    )
    from xbench.kernels.summary import summarize_kernels
    from xbench.results.metadata import new_run_id, run_metadata
    from xbench.results.schema import KERNEL_SAMPLES
    from xbench.results.store import RunStore, ensure_writable_dir, read_table, refuse_existing_run

    preset = get_model(model)
    names = [k.strip() for k in kernels.split(",") if k.strip()]
    bad = [k for k in names if k not in KERNELS]
    if bad or not names:
        raise XbenchError(
            f"unknown kernel {', '.join(bad) or repr(kernels)}", f"pick from {', '.join(KERNELS)}"
        )
    if dtype not in ("bf16", "fp32"):
        raise XbenchError(f"unknown dtype {dtype!r}", "pick bf16 or fp32")
    check_repeats(rounds, samples)
    chunks = parse_int_list(chunk, "--chunk")
    row_list = parse_int_list(rows, "--rows")
    dev = device or default_device()
    if dev not in ("cpu", "cuda") and not dev.startswith("cuda:"):
        raise XbenchError(f"unknown device {dev!r}", "pick cpu or cuda")
    backend = resolve(backend, dev)
    get_backend(backend)  # a backend that cannot run here says why before anything is measured
    if launch not in ("auto", "graph", "eager"):
        raise XbenchError(f"unknown --launch {launch!r}", "pick auto, graph or eager")
    if launch == "graph" and not dev.startswith("cuda"):
        raise XbenchError("--launch graph needs a CUDA device", "use --launch eager on CPU")
    launch = ("graph" if dev.startswith("cuda") else "eager") if launch == "auto" else launch
    run_id = new_run_id("kernel")
    out_dir = ensure_writable_dir(out or Path("results") / run_id)
    refuse_existing_run(out_dir)
    min_s = parse_duration(min_sample_time)
    cases = plan_cases(preset, names, row_list, chunks, dtype, sparse, heads, block_size)

    import torch

    if threads:
        torch.set_num_threads(threads)
    meta = run_metadata(
        run_id,
        "kernel",
        device=dev,
        device_name=torch.cuda.get_device_name(0) if dev.startswith("cuda") else None,
        backend=backend,
        launch=launch,
        model=preset.name,
        torch_threads=torch.get_num_threads(),
    )
    store = RunStore(out_dir, meta)
    note_run_dir(out_dir)
    with make_progress() as progress:
        task = progress.add_task("kernel", total=len(cases) * rounds + int(ceilings))
        if ceilings:
            progress.update(task, description="kernel: ceilings", refresh=True)
            store.append(
                KERNEL_SAMPLES,
                ceiling_rows(measure_ceilings(dev, dtype), run_id, backend, dev, dtype),
            )
            progress.update(task, advance=1, refresh=True)
        for round_, case in ((r, c) for r in range(rounds) for c in cases):
            label = case.label if rounds == 1 else f"{case.label}, round {round_ + 1}/{rounds}"
            progress.update(task, description=f"kernel: {label}", refresh=True)
            timings = time_case(
                case,
                backend,
                dev,
                preset.softmax_scale,
                samples=samples,
                warmups=warmups,
                min_sample_s=min_s,
                seed=1000 * round_,
                launch=launch,
            )
            rows = sample_rows(case, timings, run_id, backend, dev, preset.name, round_)
            store.append(KERNEL_SAMPLES, rows)
            progress.update(task, advance=1, refresh=True)
    store.finish()
    summary = summarize_kernels(read_table(out_dir, KERNEL_SAMPLES))
    emit_frame(summary, fmt, lambda f: _table(f, out_dir))


SHORT = {"partial_attention": "attention", "merge": "merge", "gather": "gather", "splice": "splice"}


def _bound(r) -> str:
    """The share of the bound, and which ceiling sets it (copy or matmul)."""
    if r.bound_share != r.bound_share:
        return "-"
    which = (
        "mm"
        if r.flops and r.matmul_share >= (r.copy_share if r.copy_share == r.copy_share else 0)
        else "copy"
    )
    return f"{100 * r.bound_share:.0f} {which}"


def _table(summary, out_dir) -> None:
    title = "xbench kernel"
    if len(summary):
        first = summary.iloc[0]
        selection = "sparse" if first["sparse"] else "dense"
        title += f": {first['backend']} on {first['device']}, {first['model']}, {first['heads']} heads, {first['dtype']}, {selection}"
    table = result_table(
        title,
        f"{out_dir}  |  %bound = max(bytes / copy bandwidth, FLOPs / matmul rate) / time, "
        "both ceilings measured in this run, and the one that sets it",
    )
    for col in (
        "kernel",
        "rows",
        "chunk",
        "median us",
        interval_label(summary.ci_coverage),
        "GB/s",
        "GFLOP/s",
        "%bound",
    ):
        table.add_column(
            col, justify="left" if col == "kernel" else "right", no_wrap=True, min_width=len(col)
        )
    for r in summary.itertuples():
        table.add_row(
            SHORT[r.kernel],
            str(r.rows),
            str(r.chunk_tokens),
            num(r.median_us),
            f"{num(r.ci_low_us)}-{num(r.ci_high_us)}",
            num(r.gb_per_s),
            num(r.gflop_per_s) if r.flops else "-",
            _bound(r),
        )
    console.print(table)
