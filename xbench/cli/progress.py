"""Rich progress for probe sweeps: fed by rank 0's events, in-process or from a parent."""

from __future__ import annotations

from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from xbench.cli.common import err_console
from xbench.events import NullSink


def make_progress() -> Progress:
    # Redrawn only when an event arrives: a timer thread would wake on the cores the
    # ranks are busy-polling and show up as latency.
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
        auto_refresh=False,
    )


class RichSink(NullSink):
    """Rank 0 under a site launcher: draws the bar itself."""

    def __init__(self):
        self.progress = make_progress()
        self.task = None

    def start(self, total, out_dir, loop):
        self.progress.start()
        self.task = self.progress.add_task("probe", total=total)

    def case_started(self, index, label):
        self.progress.update(self.task, description=f"probe {label}", refresh=True)

    def case_done(self, index, label, median, unit):
        self.progress.update(self.task, advance=1, refresh=True)

    def error(self, message, exit_code=None):
        self.progress.stop()
        err_console.print(
            Text.assemble(("xbench: error:", "bold red"), " ", message),
            highlight=False,
            soft_wrap=True,
        )

    def finish(self):
        self.progress.update(self.task, description="probe done")
        self.progress.stop()


class EventProgress:
    """The parent's view: turns JSON events from rank 0 into bar updates."""

    def __init__(self, progress: Progress, name: str = "probe"):
        self.progress = progress
        self.name = name
        self.task = None

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            self.task = self.progress.add_task(
                f"{self.name} ({event['loop']} loop)" if self.name == "probe" else self.name,
                total=event["total"],
            )
        elif kind == "case_started" and self.task is not None:
            self.progress.update(
                self.task, description=f"{self.name} {event['label']}", refresh=True
            )
        elif kind == "case_done" and self.task is not None:
            self.progress.update(self.task, advance=1, refresh=True)
        elif kind == "finish" and self.task is not None:
            self.progress.update(self.task, description=f"{self.name} done", refresh=True)


@contextmanager
def bars(label: str):
    """One launch's progress bar, fed by rank 0's events (``xbench.launches``' progress)."""
    with make_progress() as progress:
        yield EventProgress(progress, label)
