"""What every command shares: the consoles, the error mapping, output formats."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from xbench.errors import XbenchError, from_os_error, missing_dependency, out_of_memory


# Markup off: what xbench prints holds the user's strings (paths, profile and scenario names,
# descriptions) where "[/red]" must print as written, not raise or vanish. Colour is given
# as styles (Text, style=), never as markup in a string.
def _usable_columns() -> None:
    """A COLUMNS that is no positive width (0, -5, "wide") made rich print nothing, error
    lines included: such a value is dropped and the terminal's width (or 80) taken."""
    import os

    value = os.environ.get("COLUMNS")
    if value is not None and not (
        value.strip().isascii() and value.strip().isdigit() and int(value) > 0
    ):
        del os.environ["COLUMNS"]


class _Console(Console):
    """rich's console, but a closed pipe is a BrokenPipeError for ``handles_errors`` to end
    on (rich's own answer is exit 1, which compare means as a regression)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the output pipe was closed")


_usable_columns()
console = _Console(markup=False)
err_console = _Console(stderr=True, markup=False)


def coloured(text: str, style: str) -> Text:
    """``text`` in ``style`` (a table cell, a line), never read as markup."""
    return Text(str(text), style=style)


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


OversubscribeOption = Annotated[
    bool,
    typer.Option(
        "--oversubscribe",
        help="Start more ranks than this machine has cores (each busy-polls one: the times "
        "then measure the scheduler).",
    ),
]


def check_rank_count(np: int, spread: bool, oversubscribe: bool) -> None:
    """Refuse more local ranks than cores unless asked: every rank busy-polls a core, and a
    thousand of them on two cores take the machine down before the first sample."""
    from xbench.fabric.launch import srun_task
    from xbench.host import usable_cores

    cores = usable_cores()
    if np > cores and not spread and not oversubscribe:
        # an srun task has the cores its step gave it (one by default), not the node's
        in_step = srun_task()
        have = f"{cores} core{'s' if cores != 1 else ''}"
        where = f"the {have} this srun step gave it" if in_step else f"this machine's {have}"
        passes = [f"--np {cores} or fewer"] if cores >= 2 else []  # the probe's least
        passes += ["--hostfile to spread them", "--oversubscribe"]
        fix = "pass " + ", ".join(passes[:-1]) + ", or " + passes[-1]
        if in_step:
            fix = f"give the step {np} cores (srun --cpus-per-task={np}), or {fix}"
        raise XbenchError(f"--np {np} starts {np} ranks on {where}", fix)


def choose_cpu_attention(path: str) -> None:
    """--cpu-attention: the CPU attention's path for this process (refused in one line)."""
    from xbench.kernels import cpu_bf16

    try:
        cpu_bf16.choose_path(path)
    except ValueError as exc:
        raise XbenchError(str(exc), "pass --cpu-attention torch or auto") from None


def check_threads(threads: int | None, option: str = "--threads") -> None:
    """Refuse more torch threads than cores: they would time the scheduler, not the kernel."""
    from xbench.host import usable_cores

    cores = usable_cores()
    if threads is not None and threads > cores:
        raise XbenchError(
            f"{option} {threads} is more than this machine's {cores} cores",
            f"pass {option} {cores} or fewer",
        )


def _shorten(message: str, longest: int = 80) -> str:
    """Any word (a path, a value) longer than ``longest`` cut in its middle, so a one-line
    message stays one line a person can read."""
    import re

    def cut(match) -> str:
        word = match.group(0)
        return f"{word[:40]}...{word[-30:]} ({len(word)} characters)"

    return re.sub(rf"\S{{{longest + 1},}}", cut, message)


def fail(message: str, code: int = 2) -> typer.Exit:
    message = _shorten(message)
    err_console.print(
        Text.assemble(("xbench: error:", "bold red"), " ", message), highlight=False, soft_wrap=True
    )
    return typer.Exit(code)


def warn(line: str) -> None:
    """One warning line on stderr (output on stdout stays parseable)."""
    # wrapped between words at the terminal's width (an error stays one line: scripts grep it)
    err_console.print(f"xbench: warning: {_shorten(line)}", style="yellow", highlight=False)


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
    import threading

    if threading.current_thread() is threading.main_thread():  # only there can Python set it
        signal.signal(signal.SIGTERM, _terminate)


def _stdout_filled(exc: OSError, run_dir: Path | None) -> XbenchError | None:
    """A full disk or quota that names no file, met writing standard output redirected to
    a file (the generic line named the run, or advised --out). With a run of its own on
    another file system, only a full one is taken for stdout's: a quota cannot be told."""
    import errno
    import os
    import stat

    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or exc.filename is not None:
        return None
    try:
        stdout = os.fstat(1)
        if not stat.S_ISREG(stdout.st_mode):
            return None
        if exc.errno == errno.ENOSPC and os.fstatvfs(1).f_bavail > 0:
            return None  # stdout's file system has room: the disk that filled is another
        if run_dir is not None and (
            exc.errno != errno.ENOSPC or os.stat(run_dir).st_dev == stdout.st_dev
        ):
            return None  # a quota, or the run's own file system: the run's line
    except OSError:
        return None
    try:
        where = f" ({os.readlink('/proc/self/fd/1')})"  # Linux names the file
    except OSError:
        where = ""
    return XbenchError(
        f"{os.strerror(exc.errno)} writing standard output{where}",
        "free space where it is redirected (or raise the quota), or redirect it elsewhere",
    )


def _stdout_closed(exc: BrokenPipeError) -> bool:
    """Whether the broken pipe is standard output's: rich's (raised from the console with
    no errno), or a pipe on stdout whose reader is gone (it polls as an error)."""
    import select

    if exc.errno is None:  # _Console.on_broken_pipe
        return True
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush into the closed
    pipe neither fails nor prints "Exception ignored"."""
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def handles_errors(fn):
    """Map library errors to one line on stderr and an exit code: the only such place."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # (the store loads pandas: imported where a run is marked, not for every command)
        from xbench.results.stopping import SIGNALLED, mark_run_partial, mark_stopped
        from xbench.results.written_here import forget_run_dir, run_dir_written_here

        forget_run_dir()
        _catch_sigterm()
        try:
            result = fn(*args, **kwargs)
            # what is still buffered is written here, where a full disk under a redirect
            # is one line and exit 2 (at the interpreter's exit it was lost, and exit 0)
            sys.stdout.flush()
            return result
        except BrokenPipeError as exc:
            # what read the output stopped reading (| head): the exit of a program a closed
            # pipe stopped (128 + SIGPIPE), never 1, which compare means as a regression;
            # a broken socket of a transport is no closed stdout: the generic line below
            if not _stdout_closed(exc):
                run_dir = run_dir_written_here()
                error = from_os_error(exc, run_dir)
                mark_run_partial(run_dir, str(error))
                raise fail(str(error), error.exit_code) from None
            mark_run_partial(run_dir_written_here(), "its output pipe was closed")
            _quiet_stdout()
            raise typer.Exit(128 + signal.SIGPIPE) from None
        except (XbenchError, OSError) as exc:  # OSError: a full disk, a refused path, a socket
            run_dir = run_dir_written_here()
            if isinstance(exc, XbenchError):
                error = exc
            else:
                error = _stdout_filled(exc, run_dir) or from_os_error(exc, run_dir)
            mark_run_partial(run_dir, str(error))
            raise fail(str(error), error.exit_code) from None
        except ModuleNotFoundError as exc:
            # a declared dependency missing (GPU sites install with --no-deps and bring their
            # own torch and MPI); any other module is a bug, left to its traceback
            error = missing_dependency(exc.name or "")
            if error is None:
                raise
            mark_run_partial(run_dir_written_here(), str(error))
            raise fail(str(error), error.exit_code) from None
        except (MemoryError, RuntimeError) as exc:
            error = out_of_memory(exc)
            if error is None:  # any other RuntimeError is a bug, left to its traceback
                raise
            mark_run_partial(run_dir_written_here(), "out of memory")
            raise fail(str(error), error.exit_code) from None
        except KeyboardInterrupt as exc:
            what, code = SIGNALLED[signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT]
            raise fail(mark_stopped(what, run_dir_written_here()), code) from None

    return wrapper


def emit_frame(frame, fmt: OutputFormat, render_table) -> None:
    """Print a result frame as a rich table, a JSON list of rows, or CSV."""
    if fmt == OutputFormat.json:
        sys.stdout.write(strict_json(frame.to_dict(orient="records")) + "\n")
    elif fmt == OutputFormat.csv:
        sys.stdout.write(csv_text(frame))
    else:
        render_table(frame)


def emit_frames(frames: dict, fmt: OutputFormat, render_tables) -> None:
    """A command's tables, the first its result: on screen as ``render_tables`` draws
    them; as JSON, one object of each table's rows by name; as CSV, one table whose first
    column names the table each row belongs to (the columns of all of them, a row's others
    empty). A table that is None or empty is left out."""
    import pandas as pd

    shown = {name: f for name, f in frames.items() if f is not None and len(f)}
    if fmt == OutputFormat.json:
        rows = {name: f.to_dict(orient="records") for name, f in shown.items()}
        sys.stdout.write(strict_json(rows) + "\n")
    elif fmt == OutputFormat.csv:
        # counts and flags stay counts and flags where another table's rows leave them empty
        nullable = {"integer": "Int64", "bool": "boolean"}
        parts = [
            f.astype(
                {c: to for kind, to in nullable.items() for c in f.select_dtypes(kind)}
            ).assign(table=name)[["table", *f.columns]]
            for name, f in shown.items()
        ]
        sys.stdout.write(csv_text(pd.concat(parts, ignore_index=True)))
    else:
        render_tables()


def csv_text(frame) -> str:
    """The frame as CSV, each dict or list cell as its JSON text: CSV readers parse that,
    not Python's repr of it."""
    frame = frame.copy()
    for column in frame.select_dtypes(include="object").columns:
        cells = frame[column].tolist()
        if any(isinstance(v, (dict, list)) for v in cells):
            # assigned as a list: Series.map would turn a column of counts and Nones to floats
            frame[column] = [
                json.dumps(_plain(v), allow_nan=False, default=str)
                if isinstance(v, (dict, list))
                else v
                for v in cells
            ]
    return frame.to_csv(index=False)


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
