"""MLA partial attention on a GPU against the device's own bound, every backend side by side.

One command on a GPU machine::

    python benchmarks/gpu_kernels.py --out results/gpu-kernels

measures, in one run: the device's copy bandwidth and bf16 matmul rate (the ceilings); a
plain-torch reference (scores = q K^T, logsumexp, exp, p V: five lines, eager and replayed
from a CUDA graph); and every kernel backend that runs here (triton, torch, cuda, flashmla,
flashinfer), at rows 1 / 8 / 64 x 1K / 8K / 32K / 64K tokens with dense pages, and per-row
sparse top-2048. It prints microseconds, GB/s, TFLOP/s and the share of the bound
(max(bytes / copy bandwidth, FLOPs / matmul rate) / time), and writes the samples as an
xbench run (``kernel_samples``, readable by ``xbench fit`` and ``read_table``).

Performance targets live here, not in the tests. ``--device cpu`` with small shapes runs the
same code on a CPU (a smoke test of the script, not a figure worth reporting).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

import torch

from xbench.core.models import get_model
from xbench.errors import XbenchError
from xbench.kernels.backend import BACKENDS, BackendUnavailable, get_backend
from xbench.kernels.bench import (
    backend_plan,
    ceiling_rows,
    measure_ceilings,
    plan_cases,
    sample_rows,
    time_case,
    timed_launch,
)
from xbench.kernels.selection import DensePages
from xbench.kernels.summary import summarize_kernels
from xbench.results.metadata import new_run_id, run_metadata
from xbench.results.schema import KERNEL_SAMPLES
from xbench.results.store import RunStore, read_table

PLAIN = ("plain-torch-eager", "plain-torch-graph")
BLOCK_SIZE = 64  # tokens a page of the cases' caches (FlashMLA's page)


def plain_torch(scale: float, v_dim: int):
    """The five-line reference: what a user would write with torch alone."""

    def run(x):
        q, cache = x["q"], x["cache"]
        if "_keys" not in x:  # token ids, gathered once per input set (outside the timing)
            sel = x["indices"]
            ids = sel.token_indices(cache.shape[1]) if isinstance(sel, DensePages) else sel
            x["_keys"] = ids.to(q.device).clamp_min(0)
        keys = cache.reshape(-1, cache.shape[-1])[x["_keys"]]  # [n, D] or [rows, k, D]
        rows, heads, dim = q.shape
        if keys.dim() == 2:  # every row attends the same tokens: one product for all rows
            s = (q.reshape(rows * heads, dim) @ keys.T).float() * scale
            lse = torch.logsumexp(s, -1)
            out = torch.exp(s - lse[:, None]).to(q.dtype) @ keys[:, :v_dim]
        else:  # per-row selections
            s = torch.bmm(q, keys.transpose(1, 2)).float() * scale
            lse = torch.logsumexp(s, -1)
            out = torch.bmm(torch.exp(s - lse[..., None]).to(q.dtype), keys[..., :v_dim])
        return out, lse

    return run


def runnable_backends(wanted: list[str], device: str) -> dict[str, str]:
    """name -> 'runs' or the reason it does not (one line each, printed)."""
    status = {}
    for name in wanted:
        if name in PLAIN:
            status[name] = (
                "runs"
                if name.endswith("eager") or device.startswith("cuda")
                else ("CUDA graphs need a GPU")
            )
            continue
        try:
            get_backend(name)
            status[name] = "runs"
        except BackendUnavailable as exc:
            status[name] = exc.problem
    return status


def add_shape_options(ap: argparse.ArgumentParser, tokens: str) -> None:
    """The device and attention shapes a GPU benchmark sweeps (here and triton_tiles.py)."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="deepseek-v3.2")
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--tokens", default=tokens, help="dense tokens per row")
    ap.add_argument("--topk", type=int, default=2048, help="sparse top-k per row (0: none)")
    ap.add_argument("--heads", type=int, default=None)


def attention_cases(args):
    """(model, cases): attention at every rows x dense tokens, then rows x sparse top-k."""
    model = get_model(args.model)
    rows = [int(r) for r in args.rows.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    cases = plan_cases(
        model, ["partial_attention"], rows, tokens, "bf16", False, args.heads, BLOCK_SIZE
    )
    if args.topk:
        cases += plan_cases(
            model, ["partial_attention"], rows, [args.topk], "bf16", True, args.heads, BLOCK_SIZE
        )
    return model, cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_shape_options(ap, "1024,8192,32768,65536")
    ap.add_argument(
        "--backends",
        default=",".join(("triton", "torch", "cuda-ref", "flashmla", "flashinfer", *PLAIN)),
    )
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--min-sample-time", type=float, default=0.02, help="seconds")
    ap.add_argument("--launch", choices=("graph", "eager"), default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    # which of the triton backend's tiles won at each shape, in the log beside the figures
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "1")
    device = args.device
    launch = args.launch or ("graph" if device.startswith("cuda") else "eager")
    model, cases = attention_cases(args)
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in wanted if b not in BACKENDS and b not in PLAIN]
    if unknown:
        ap.error(f"unknown backend {', '.join(unknown)}; pick from {', '.join(BACKENDS + PLAIN)}")
    status = runnable_backends(wanted, device)
    for name, why in status.items():
        print(f"{name:18} {why}")
    backends = [b for b, why in status.items() if why == "runs"]
    if not backends:  # before a folder is made: nothing would be in it
        print("gpu_kernels: none of --backends runs here (why: above)", file=sys.stderr)
        return 1
    run_id = new_run_id("gpu-kernels")
    out_dir = args.out or Path("results") / run_id
    meta = run_metadata(
        run_id,
        "benchmarks/gpu_kernels.py",
        device=device,
        device_name=torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        launch=launch,
        backends=status,
    )
    store = RunStore(out_dir, meta)
    store.append(
        KERNEL_SAMPLES, ceiling_rows(measure_ceilings(device, "bf16"), run_id, "-", device, "bf16")
    )
    for case in cases:
        for backend in backends:
            plain = backend in PLAIN
            try:
                timings = time_case(
                    case,
                    "torch" if plain else backend,
                    device,
                    model.softmax_scale,
                    samples=args.samples,
                    warmups=1,
                    min_sample_s=args.min_sample_time,
                    launch="graph"
                    if backend == "plain-torch-graph"
                    else ("eager" if plain else launch),
                    runner=plain_torch(model.softmax_scale, model.v_dim) if plain else None,
                )
            except (BackendUnavailable, XbenchError) as exc:  # e.g. a dense-only adapter
                print(f"{backend:18} {case.label}: {exc}")
                continue
            except torch.cuda.OutOfMemoryError:
                print(f"{backend:18} out of GPU memory at rows={case.rows} tokens={case.chunk}")
                torch.cuda.empty_cache()
                continue
            rows = sample_rows(
                case, timings, run_id, backend, device, model.name, 0,
                launch=timed_launch(device, "graph" if backend == "plain-torch-graph" else ("eager" if plain else launch)),
                plan="" if plain else backend_plan(backend),
            )  # fmt: skip
            store.append(KERNEL_SAMPLES, rows)
    store.finish()
    summary = summarize_kernels(read_table(out_dir, KERNEL_SAMPLES))
    if summary.empty:  # every case refused (why: above), the ceilings stored alone
        print(f"gpu_kernels: no case ran (why: above); the ceilings in {out_dir}", file=sys.stderr)
        return 1
    # the table's first line starts with "bound = max" (gpu_check finds the tables by it)
    header = (
        "bound = max(bytes / copy, FLOPs / matmul), both measured above; "
        f"{meta.get('device_name') or device}, {launch} launches"
    )
    print("\n" + textwrap.fill(header, 80, subsequent_indent="    "))
    print(
        f"{'backend':18} {'sel':6} {'rows':>4} {'tokens':>6} {'us':>10} {'GB/s':>8} {'TFLOP/s':>8} {'bound':>6}"
    )
    for r in summary.sort_values(["sparse", "rows", "chunk_tokens", "backend"]).itertuples():
        print(
            f"{r.backend:18} {'sparse' if r.sparse else 'dense':6} {r.rows:>4} {r.chunk_tokens:>6} "
            f"{r.median_us:>10,.1f} {r.gb_per_s:>8,.0f} {r.gflop_per_s / 1e3:>8,.1f} "
            f"{100 * r.bound_share:>5.0f}%"
        )
    print(f"\nsamples: {out_dir}/{KERNEL_SAMPLES}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
