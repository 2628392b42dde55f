"""What every command shares: the consoles, the error mapping, output formats."""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from xbench.errors import XbenchError

console = Console()
err_console = Console(stderr=True)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


# The options every measuring command takes alike.
FormatOption = Annotated[OutputFormat, typer.Option("--format", help="table, json or csv.")]
RunDirOption = Annotated[
    Path | None, typer.Option("--out", "-o", help="Run directory (default results/<run_id>).")
]
RoundsOption = Annotated[
    int,
    typer.Option(
        help="Passes over all cases, interleaved so drift on a shared machine hits every case "
        "alike (asv-style); each pass takes --samples per case."
    ),
]


def check_repeats(rounds: int, samples: int) -> None:
    """Refuse a sweep that would measure nothing."""
    if rounds < 1 or samples < 1:
        raise XbenchError(
            f"--rounds {rounds} --samples {samples}: nothing would be measured",
            "pass --rounds and --samples of 1 or more",
        )


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(
        f"[bold red]xbench: error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True
    )
    return typer.Exit(code)


def handles_errors(fn):
    """Map library errors to one line on stderr and an exit code: the only such place."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except XbenchError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted; results finished so far are on disk", 130) from None

    return wrapper


def emit_frame(frame, fmt: OutputFormat, render_table) -> None:
    """Print a result frame as a rich table, a JSON list of rows, or CSV."""
    if fmt == OutputFormat.json:
        sys.stdout.write(
            json.dumps(frame.to_dict(orient="records"), default=_json_default, indent=1) + "\n"
        )
    elif fmt == OutputFormat.csv:
        sys.stdout.write(frame.to_csv(index=False))
    else:
        render_table(frame)


def _json_default(value):
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
    except ImportError:
        pass
    if value != value:  # NaN
        return None
    return str(value)
