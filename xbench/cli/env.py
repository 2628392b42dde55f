"""``xbench env``: what this machine can and cannot run, one line each."""

from __future__ import annotations

from rich.table import Table

from xbench.cli.common import console


def env() -> None:
    """Print one line per capability (MPI, compiled loop, torch, GPUs, NVRTC, ...). Exit 0."""
    from xbench.capabilities import all_capabilities

    table = Table(title="xbench env", show_header=True)
    table.add_column("capability")
    table.add_column("")
    table.add_column("detail", overflow="fold")
    for cap in all_capabilities():
        table.add_row(cap.name, "[green]yes[/green]" if cap.ok else "[red]no[/red]", cap.detail)
    console.print(table)
