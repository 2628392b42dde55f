"""Which tile and split count the triton backend should take, each timed on this GPU.

    python benchmarks/triton_tiles.py [--tiles 64,64,8,2,1,1 16,64,4,2,1 ...] [--out FILE.json]

For every shape (rows x tokens dense, and rows of a per-row top-k), every tile (query rows,
tokens, warps, pipeline stages, output parts and, optionally, page lookahead 0 or 1; default
``triton_mla.GPU_TILES``) and a few split counts (one, the backend's own choice for that
tile, one and two waves of programs), times the attention as ``xbench kernel`` does (inputs
rotated past the last cache level, warm-ups, graph replay on GPUs) and prints the samples'
median in us, their range (largest less smallest) as a share of the median, TFLOP/s and the
share of the bound measured in the same run, with the best per shape: what ``GPU_TILES`` and
the split estimate are chosen from; run it again on another GPU before changing either.
``--pdl off on`` times each count of several splits twice, the combine launched after the
split kernel and launched dependent on it (``triton_mla.COMBINE_PDL``), where the device
can. Where the best timing's tile was also timed with the other page lookahead, or the other
combine launch, the best line gives both medians and whether the two timings' samples lie
apart or overlap (a candidate is kept where they lie apart, docs/gpu-check.md). A tile that
does not fit the device (shared memory) prints why and is skipped. ``--device cpu`` under
``TRITON_INTERPRET=1`` with small shapes runs the same code (a smoke test of the script).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import statistics
import sys
import textwrap
from pathlib import Path

import torch
from gpu_kernels import (  # this folder's: run as a script
    BLOCK_SIZE,
    add_shape_options,
    attention_cases,
)

from xbench.kernels.backend import get_backend
from xbench.kernels.bench import measure_ceilings, time_case
from xbench.kernels.selection import DensePages
from xbench.kernels.triton_backend import (
    choose_splits,
    lookahead_acts,
    pdl_unavailable,
    tile_fields,
)


def split_counts(case, tile, sm_count: int, extra: tuple = ()) -> list[int]:
    """One split, the backend's estimate for this tile, one and two waves of programs, and
    the ``extra`` counts asked for (each at most one per tile of tokens)."""
    rows, tokens, parts = case.rows, case.chunk, tile[4]
    groups, per_group = (rows, case.heads) if case.sparse else (1, rows * case.heads)
    programs = groups * math.ceil(per_group / tile[0]) * parts
    tiles = max(1, math.ceil(tokens / tile[1]))
    own = choose_splits(tokens, programs, rows * case.heads, sm_count, tile[1])
    waves = [math.ceil(k * sm_count / programs) for k in (1, 2)]
    return sorted({min(tiles, max(1, s)) for s in (1, own, *waves, *extra)})


def time_tile(backend, model, case, device, launch, args, tile, splits, form, pdl) -> list:
    """The samples' times of one tile at one split count, in us, as ``xbench kernel`` times
    them (each a mean over a sample's calls); ``form`` "tokens" hands a dense selection over
    as token indices built in the call; ``pdl``: the combine launched dependent on the split
    kernel."""

    def runner(x, v_dim=case.v_dim):
        indices = x["indices"]
        if form == "tokens" and isinstance(indices, DensePages):
            indices = indices.token_indices(x["cache"].shape[1])
        return backend.partial_attention(
            x["q"], x["cache"], indices, model.softmax_scale, v_dim, splits=splits, tile=tile,
            pdl=pdl,
        )  # fmt: skip

    timed = time_case(
        case, "triton", device, model.softmax_scale, samples=args.samples, warmups=1,
        min_sample_s=args.min_sample_time, launch=launch, runner=runner,
    )  # fmt: skip
    return [s * 1e6 for _, warm, s in timed if not warm]


def say(text: str) -> None:
    """A line of prose, wrapped at words to the terminal (80 columns into a log)."""
    width = shutil.get_terminal_size().columns
    print(textwrap.fill(text, width=width, subsequent_indent="    "), flush=True)


def where(case, tile, splits: int, form: str, pdl: bool) -> str:
    """A row's first columns: the case (rows x tokens dense, or rows x top-k sparse), the
    tile, the split count, how the selection arrived and the combine's launch."""
    shape = f"{case.rows}x{case.chunk} {'sparse' if case.sparse else 'dense'}"
    tile = ",".join(map(str, tile))
    return f"{shape:15} {tile:13} {splits:>6} {form:>7} {'on' if pdl else 'off':>3}"


# what makes two timings the same way but for one of the two switches compared
TIMED_WAY = ("case", "tile", "splits", "indices", "lookahead", "pdl")


def both_ways(found: list[dict], best: dict, switch: str) -> str:
    """Where the best timing was also timed with ``switch`` ("lookahead" or "pdl") the
    other way, all else the same: both medians, and whether their samples' ranges lie
    apart or overlap; else the switch where it is on."""
    same = {r[switch]: r for r in found if all(r[k] == best[k] for k in TIMED_WAY if k != switch)}
    if len(same) < 2:
        return f", {switch}" * best[switch]
    off, on = same[False]["samples_us"], same[True]["samples_us"]
    apart = max(on) < min(off) or max(off) < min(on)
    return (
        f", {switch} {'on' if best[switch] else 'off'} ({same[False]['us']:,.1f} us off, "
        f"{same[True]['us']:,.1f} on: samples {'apart' if apart else 'overlap'})"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_shape_options(ap, "8192,32768")
    ap.add_argument(
        "--tiles", nargs="*", default=None, help="rows,tokens,warps,stages,parts[,lookahead]"
    )
    ap.add_argument(
        "--dense-indices",
        nargs="+",
        choices=("pages", "tokens"),
        default=["pages"],
        help="how a dense selection reaches the kernel: its page table (the backend's way) "
        "or a list of token indices built in the call (the way before it); both: each timed",
    )
    ap.add_argument(
        "--pdl",
        nargs="+",
        choices=("off", "on"),
        default=["off"],
        help="the combine launched after the split kernel (off) or dependent on it (on: "
        "programmatic dependent launch, Hopper and later); both: each count of several splits timed",
    )
    ap.add_argument(
        "--splits",
        default="",
        help="split counts to time besides the usual ones, e.g. 16,33,44,88 (a comma list)",
    )
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--min-sample-time", type=float, default=0.01, help="seconds")
    ap.add_argument("--out", type=Path, default=None, help="every timing, as JSON")
    args = ap.parse_args(argv)
    from xbench.kernels import triton_mla

    try:
        given = [t.split(",") for t in args.tiles or ()] or triton_mla.GPU_TILES
        tiles = [tile_fields(t) for t in given]
    except ValueError as exc:
        ap.error(f"--tiles: {exc}, e.g. 64,64,8,2,1,1")
    try:
        extra = tuple(int(v) for v in args.splits.split(",") if v.strip())
    except ValueError:
        ap.error("--splits takes whole numbers, e.g. 16,33,44")
    device, cuda = args.device, args.device.startswith("cuda")
    model, cases = attention_cases(args)
    ceilings = measure_ceilings(device, "bf16")
    backend = get_backend("triton")
    sm_count = backend._sm_count(torch.device(device))
    launch = "graph" if cuda else "eager"
    pdls = [p == "on" for p in args.pdl]
    why_not = pdl_unavailable(torch, torch.device(device)) if any(pdls) else ""
    if why_not:
        say(f"--pdl on: not timed here: {why_not}")
        pdls = [False]
    found = []
    print(
        f"{'case':15} {'tile':13} {'splits':>6} {'indices':>7} {'pdl':>3} {'us':>10} {'range':>5} "
        f"{'TFLOP/s':>7} {'bound':>5}"
    )
    for case in cases:
        bound_s = max(
            case.bytes_moved / ceilings["copy_bytes_per_s"],
            case.flops / ceilings["matmul_flops_per_s"],
        )
        best = None
        forms = ["tokens"] if case.sparse else args.dense_indices
        for tile in tiles:
            counts = split_counts(case, tile, sm_count, extra)
            for splits, form, pdl in itertools.product(counts, forms, pdls):
                if pdl and splits == 1:  # one split: no combine to launch
                    continue
                # a page lookahead changes only the TMA loop of a page table's whole tiles:
                # elsewhere the same kernel as without, not timed twice
                page = BLOCK_SIZE if form == "pages" and not case.sparse else 0
                if tile[5] and not lookahead_acts(tile[0], tile[1], page, True):
                    continue
                try:
                    samples_us = time_tile(
                        backend, model, case, device, launch, args, tile, splits, form, pdl
                    )
                except Exception as exc:  # noqa: BLE001 - e.g. a tile over the shared memory
                    say(f"{where(case, tile, splits, form, pdl)} {type(exc).__name__}: {exc}")
                    continue
                row = {
                    "case": case.label,
                    "rows": case.rows,
                    "tokens": case.chunk,
                    "sparse": case.sparse,
                    "tile": list(tile[:5]),
                    "lookahead": bool(tile[5]),
                    "splits": splits,
                    "indices": form,
                    "pdl": pdl,
                    "us": (us := statistics.median(samples_us)),
                    "samples_us": samples_us,
                    "tflops": case.flops / us / 1e6,
                    "bound_share": bound_s * 1e6 / us,
                }
                found.append(row)
                best = row if best is None or us < best["us"] else best
                spread = 100 * (max(samples_us) - min(samples_us)) / us
                print(
                    f"{where(case, tile, splits, form, pdl)} {us:>10,.1f} {spread:>4.1f}% "
                    f"{row['tflops']:>7,.1f} {100 * row['bound_share']:>4.0f}%",
                    flush=True,
                )
        if best:
            say(
                f"best {case.label}: tile {tuple(best['tile'])}, {best['splits']} splits, "
                f"{best['indices']}{both_ways(found, best, 'lookahead')}"
                f"{both_ways(found, best, 'pdl')}"
            )
            print()
    if args.out:
        args.out.write_text(json.dumps({"ceilings": ceilings, "timings": found}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
