"""``xbench models``: the shipped model presets and the byte counts they imply."""

from __future__ import annotations

from xbench.cli.common import FormatOption, OutputFormat, console, emit_frame, handles_errors


@handles_errors
def models(
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """List model presets: heads, widths, indexer top-k, layers, routed / returned / KV bytes."""
    import pandas as pd  # here, not at import: every command's start would pay for it

    from xbench.core.models import ALIASES, PRESETS, alias_words

    fp8 = [p.name for p in PRESETS.values() if p.matmul_dtype == "fp8"]

    frame = pd.DataFrame([p.as_row() for p in PRESETS.values()])
    frame["aliases"] = [
        ",".join(a for a, name in ALIASES.items() if name == p.name) for p in PRESETS.values()
    ]
    # a count or none (dense): not floats, which CSV would print as 2048.0
    frame["index_topk"] = pd.Series([p.index_topk for p in PRESETS.values()], dtype=object)

    def render(f):
        from xbench.cli.render import add_columns, notes, result_table

        table = result_table("xbench models")
        add_columns(
            table,
            ("model", "heads", "qk/v/rope", "top-k", "layers", "S_q B", "S_o B", "KV B"),
            left=("model", "KV B"),
            wraps=("KV B",),
        )
        for r in f.itertuples():
            kv = " ".join(f"{k}:{v}" for k, v in r.kv_formats.items())
            topk = (
                "dense"
                if r.index_topk != r.index_topk or r.index_topk is None
                else str(int(r.index_topk))
            )
            table.add_row(
                r.model if r.kv_heads == 1 else f"{r.model} {r.attention}",
                str(r.q_heads),
                f"{r.qk_dim}/{r.v_dim}/{r.rope_dim}",
                topk,
                str(r.layers),
                str(r.query_bytes_per_row),
                str(r.return_bytes_per_row),
                kv,
            )
        console.print(table)
        notes(
            "S_q, S_o: bytes per query row (one head of one token), routed and returned; "
            "KV: bytes per token per layer, by cache format;  GQA: grouped-query attention "
            "(xbench's kernels and device terms are MLA's: a GQA preset prices shared-KV "
            "batching and a prefill workload's served_model);  "
            + "".join(
                f"{r.model}: hybrid, the KV of its {r.full_attention_layers} full-attention "
                f"layers of {r.layers}, the others {r.window_kv_bytes} B a token of a "
                f"{r.window_tokens}-token window;  "
                for r in frame.itertuples()
                if r.full_attention_layers != r.layers
            )
            + f"linear layers' matmuls in FP8 (their released weights): "
            f"{', '.join(fp8)}, in BF16 the others;  also named: {alias_words()}"
        )

    emit_frame(frame, fmt, render)
