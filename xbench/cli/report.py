"""``xbench report``: figures and one self-contained HTML page from stored results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    console,
    emit_frame,
    handles_errors,
    warn,
)
from xbench.errors import XbenchError


@handles_errors
def report(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Probe, kernel or validate run directories, profile .toml files, comparison "
            ".parquet files (xbench compare --out)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNGs and index.html.")],
    heads: Annotated[int, typer.Option(help="Heads per device for the decision map.")] = 16,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace the report already in --out (its PNGs too)."),
    ] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Draw what the results hold: fabric curves, roofline, decision map, validate, comparison."""
    from xbench.report import build

    if heads < 1:
        raise XbenchError(f"--heads {heads}: at least one head", "pass --heads 1 or more")
    for path in results:
        if not path.exists():
            raise XbenchError(f"{path} does not exist", "pass results written by xbench")
    from xbench.results.store import incompleteness, refuse_repeats

    refuse_repeats(results, "drawn twice, it would pass for two results that agree")
    for path in results:
        why = incompleteness(path) if path.is_dir() else None
        if why:
            warn(f"{why}: drawn from the cases it holds")
    if (out / "index.html").exists() and not force:
        raise XbenchError(
            f"{out} already holds a report", "pass another --out, or --force to replace it"
        )
    import pandas as pd  # here, not at import: every command's start would pay for it

    figures = build(results, out, heads)
    # each figure, then the page that holds them all
    made = pd.DataFrame(
        [{"title": fig.title, "path": str(fig.path)} for fig in figures]
        + [{"title": "report", "path": str(out / "index.html")}]
    )

    def render(frame) -> None:
        for row in frame.iloc[:-1].itertuples():
            console.print(f"{row.title}: {row.path}", highlight=False)
        console.print(
            f"report: {frame.path.iloc[-1]} ({len(figures)} "
            f"figure{'s' if len(figures) > 1 else ''}, self-contained)",
            highlight=False,
        )

    emit_frame(made, fmt, render)
