"""``xbench env``: what this machine can and cannot run, one line each."""

from __future__ import annotations

from rich.table import Table

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    coloured,
    console,
    emit_frame,
    handles_errors,
)


@handles_errors
def env(fmt: FormatOption = OutputFormat.table) -> None:
    """Print one line per capability (MPI, compiled loop, torch, GPUs, NVRTC, ...). Exit 0."""
    import pandas as pd

    from xbench.capabilities import all_capabilities

    frame = pd.DataFrame(
        [{"capability": c.name, "ok": c.ok, "detail": c.detail} for c in all_capabilities()]
    )
    emit_frame(frame, fmt, _table)


def _table(frame) -> None:
    table = Table(title="xbench env", show_header=True)
    table.add_column("capability")
    table.add_column("")
    table.add_column("detail", overflow="fold")
    for cap in frame.itertuples():
        table.add_row(
            cap.capability,
            coloured("yes", "green") if cap.ok else coloured("no", "red"),
            cap.detail,
        )
    console.print(table)
