"""What every command shares: the consoles, the error mapping, output formats."""

from __future__ import annotations

import functools
import json
import math
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


def warn(line: str) -> None:
    """One warning line on stderr (output on stdout stays parseable)."""
    err_console.print(
        f"[yellow]xbench: warning: {escape(line)}[/yellow]", highlight=False, soft_wrap=True
    )


def warn_conditions(profile, current: dict) -> None:
    """Warn in one line when ``profile`` was fitted under conditions other than ``current``."""
    from xbench.core import conditions

    diffs = conditions.differences(profile.provenance.get("conditions") or {}, current)
    if diffs:
        warn(conditions.describe(profile.name, diffs))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's cancel, ``kill``, a CI job's timeout), raised where the command
    stands so that the clean-up Ctrl-C gets runs for it too: the ranks taken down, the run
    marked partial."""


def _terminate(signum, frame):
    raise Terminated()


def _catch_sigterm() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():  # only there can Python set it
        signal.signal(signal.SIGTERM, _terminate)


_run_dir: list[Path] = []  # the run directory the running command writes, once it has one


def note_run_dir(path: Path) -> None:
    """Tell the error mapping where this command's results go (for the interrupt message)."""
    _run_dir[:] = [Path(path)]


def handles_errors(fn):
    """Map library errors to one line on stderr and an exit code: the only such place."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _run_dir.clear()
        _catch_sigterm()
        try:
            return fn(*args, **kwargs)
        except XbenchError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except MemoryError:  # what was asked for (requests, sizes, shapes) outgrew the machine
            if _run_dir:
                from xbench.results.store import mark_partial

                mark_partial(_run_dir[0], "out of memory")
            raise fail(
                "out of memory: what was asked for does not fit in this machine's memory; "
                "ask for less (fewer --requests, smaller sizes, rows or chunks)",
                2,
            ) from None
        except KeyboardInterrupt as exc:
            what, code = (
                ("terminated", 143) if isinstance(exc, Terminated) else ("interrupted", 130)
            )
            if not _run_dir:
                raise fail(f"{what} before anything was written", code) from None
            from xbench.results.store import mark_partial

            mark_partial(_run_dir[0], what)
            raise fail(
                f"{what}; the cases finished so far are in {_run_dir[0]} "
                "(run.json marks the run partial; fit, compare, check and report say so)",
                code,
            ) from None

    return wrapper


def emit_frame(frame, fmt: OutputFormat, render_table) -> None:
    """Print a result frame as a rich table, a JSON list of rows, or CSV."""
    if fmt == OutputFormat.json:
        sys.stdout.write(strict_json(frame.to_dict(orient="records")) + "\n")
    elif fmt == OutputFormat.csv:
        sys.stdout.write(frame.to_csv(index=False))
    else:
        render_table(frame)


def strict_json(value) -> str:
    """JSON that every parser reads: NaN and infinities become null, numpy scalars numbers."""
    return json.dumps(_plain(value), indent=1, allow_nan=False, default=str)


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def interval_label(coverages) -> str:
    """The header of a median-interval column: the coverage the sample counts give.

    Order-statistic intervals reach 95 % only from 6 samples on; with fewer, the interval is
    the range of the samples and covers less (2 samples: 50 %). The label says the least
    coverage of any row, never more than the rows have.
    """
    values = [float(c) for c in coverages if c == c]
    low = min(values, default=0.0)
    return "95% CI" if low >= 0.95 - 1e-9 else f"{math.floor(low * 100)}% CI"
