"""``xbench models``: the shipped model presets and the byte counts they imply."""

from __future__ import annotations

import pandas as pd
from rich.table import Table

from xbench.cli.common import FormatOption, OutputFormat, console, emit_frame, handles_errors


@handles_errors
def models(
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """List model presets: heads, widths, indexer top-k, layers, routed / returned / KV bytes."""
    from xbench.core.models import PRESETS

    frame = pd.DataFrame([p.as_row() for p in PRESETS.values()])

    def render(f):
        table = Table(
            title="xbench models",
            caption="S_q, S_o: bytes per query row (one head of one token); KV: bytes per token per layer",
        )
        for col in ("model", "heads", "qk/v/rope", "top-k", "layers", "S_q", "S_o", "KV"):
            table.add_column(
                col,
                justify="left" if col in ("model", "KV") else "right",
                no_wrap=col != "KV",
                overflow="fold",
            )
        for r in f.itertuples():
            kv = " ".join(f"{k}:{v}" for k, v in r.kv_formats.items())
            topk = (
                "dense"
                if r.index_topk != r.index_topk or r.index_topk is None
                else str(int(r.index_topk))
            )
            table.add_row(
                r.model,
                str(r.q_heads),
                f"{r.qk_dim}/{r.v_dim}/{r.rope_dim}",
                topk,
                str(r.layers),
                str(r.query_bytes_per_row),
                str(r.return_bytes_per_row),
                kv,
            )
        console.print(table)

    emit_frame(frame, fmt, render)
