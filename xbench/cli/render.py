"""Rich tables of result frames."""

from __future__ import annotations

import math

from rich import box
from rich.table import Table

from xbench.cli.common import console, interval_label


def num(x) -> str:
    """Three significant figures, thousands separated; '-' for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def result_table(title: str, caption: str | None = None) -> Table:
    """A results table that fits 80 columns: rules between header and rows only, no edge
    padding, so numbers keep their digits (a column never shrinks below its widest cell)."""
    return Table(
        title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True
    )


def add_columns(table: Table, names, left=(), wraps=()) -> None:
    """Columns that never wrap a cell (numbers and labels stay on one line), except those in
    ``wraps``, which wrap between words; ``left`` are the text columns, the rest are
    right-aligned numbers."""
    for name in names:
        table.add_column(
            name,
            justify="left" if name in left else "right",
            no_wrap=name not in wraps,
            overflow="fold" if name in wraps else "ellipsis",
            min_width=len(name),
        )


def notes(*lines: str) -> None:
    """What a table's symbols and columns mean: after the table, wrapped between words at the
    terminal's width (a table's caption is centred and cut mid-word when it wraps)."""
    for line in lines:
        console.print(line, style="dim", highlight=False)


def _constant(frame, column):
    values = frame[column].dropna().unique()
    return values[0] if len(values) == 1 else None


def probe_table(
    summary, title: str = "xbench probe", caption: str | None = None, statistic: str = "median"
) -> None:
    """One row per case; columns that hold one value for the whole run go to the title."""
    shared = []
    for column in ("transport", "fabric", "loop", "pair", "pair_class"):
        value = _constant(summary, column)
        if value is not None:
            shared.append(f"{column}={value}" if column in ("loop", "pair") else str(value))
    table = result_table(f"{title}: {' '.join(shared)}" if shared else title)
    many_pairs = _constant(summary, "pair") is None
    columns = (
        ["pattern"]
        + (["pair"] if many_pairs else [])
        + [
            "size",
            "detail",
            "median" if statistic == "median" else "mean",
            f"median {interval_label(summary.ci_coverage)}",
            "p99",
            "unit",
        ]
    )
    add_columns(table, columns, left=("pattern", "pair", "detail", "unit"))
    for r in summary.itertuples():
        detail = ""
        if r.pattern in ("bandwidth", "bibw"):
            detail = f"window {int(r.window)}"
        elif r.pattern == "rtt":
            detail = f"{int(r.rows)} rows"
        elif r.pattern == "gather":
            detail = f"{int(r.blocks)} blk {r.metric.removeprefix('fetch_')}"
        elif r.pattern == "offgather":
            detail = f"{int(r.blocks)} blk messages, cold"
        cells = (
            [r.pattern]
            + ([r.pair] if many_pairs else [])
            + [
                r.size,
                detail,
                num(getattr(r, statistic)),
                f"{num(r.ci_low)}-{num(r.ci_high)}",
                num(r.p99),
                r.unit,
            ]
        )
        table.add_row(*cells)
    console.print(table)
    if caption:
        notes(caption)
