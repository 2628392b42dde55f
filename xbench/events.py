"""Where the ranks report progress: JSON lines to a parent xbench, or a rich bar directly.

When ``xbench probe`` launched the ranks itself, rank 0 prints one ``XBENCH-EVENT {json}``
line per event on stdout and the parent draws the progress bar. When a site launcher
(srun, mpirun) started the ranks, rank 0 draws the bar itself (``xbench.cli.progress``).
Other ranks stay quiet.
"""

from __future__ import annotations

import json
import sys

EVENT_PREFIX = "XBENCH-EVENT "


class NullSink:
    def start(self, total: int, out_dir: str, loop: str) -> None: ...
    def case_started(self, index: int, label: str) -> None: ...
    def case_done(self, index: int, label: str, median: float, unit: str) -> None: ...
    # ``exit_code``: what the rank exits with right after (None: it does not say), so that
    # a parent that has to end the job itself still exits as the rank meant (124: timeout)
    def error(self, message: str, exit_code: int | None = None) -> None: ...
    def finish(self) -> None: ...


class JsonLinesSink(NullSink):
    """Rank 0 under a parent xbench: machine-readable lines on stdout."""

    def _emit(self, **event) -> None:
        sys.stdout.write(EVENT_PREFIX + json.dumps(event) + "\n")
        sys.stdout.flush()

    def start(self, total, out_dir, loop):
        self._emit(event="start", total=total, out_dir=out_dir, loop=loop)

    def case_started(self, index, label):
        self._emit(event="case_started", index=index, label=label)

    def case_done(self, index, label, median, unit):
        self._emit(event="case_done", index=index, label=label, median=median, unit=unit)

    def error(self, message, exit_code=None):
        self._emit(event="error", message=message, exit_code=exit_code)

    def finish(self):
        self._emit(event="finish")


class CallbackSink(JsonLinesSink):
    """The same events handed to a function in this process (work run in-process)."""

    def __init__(self, on_event):
        self.on_event = on_event

    def _emit(self, **event) -> None:
        self.on_event(event)
