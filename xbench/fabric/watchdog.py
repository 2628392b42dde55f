"""A rank's own timeout: a hung peer becomes an error (exit 124), never a hang.

Armed per case on every rank (probe and validate alike); the launcher then takes the other
ranks down (``xbench.fabric.launch``).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from contextlib import contextmanager

EXIT_TIMEOUT = 124


class Watchdog:
    """Ends this process when one case outlasts the timeout.

    The thread sleeps on a condition until the deadline; it does not poll, because on a
    2-core machine every wake-up steals time from a busy-polling rank.
    """

    def __init__(self, timeout_s: float, on_fire):
        self.timeout_s = timeout_s
        self.on_fire = on_fire
        self._deadline = None
        self._label = ""
        self._cond = threading.Condition()
        threading.Thread(target=self._watch, daemon=True, name="xbench-watchdog").start()

    def arm(self, label: str) -> None:
        with self._cond:
            self._label, self._deadline = label, time.monotonic() + self.timeout_s
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    @contextmanager
    def watching(self, label: str):
        """Armed for the block's work (an exception leaves it armed: the rank's handler
        ends the process, or the watchdog does)."""
        self.arm(label)
        yield
        self.disarm()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.on_fire(self._label)
                os._exit(EXIT_TIMEOUT)


def write_hang_report(path: str, lines: list[str]) -> str:
    """What this rank knew when its case outlasted the timeout: ``lines`` (the case, the
    transport's state) and every thread's Python stack, where the main thread shows the
    call it waits in (an MPI barrier, a transport's loop). Written to ``path``, or to
    stderr where ``path`` cannot be written (a node without the run's folder); returns
    where it went, as the one-line error says it ("in PATH" or "on stderr")."""
    try:
        with open(path, "w") as report:
            report.write("".join(f"{line}\n" for line in lines) + "\n")
            report.flush()
            faulthandler.dump_traceback(report, all_threads=True)
        return f"in {path}"
    except OSError:
        sys.stderr.write("".join(f"xbench: {line}\n" for line in lines))
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        return "on stderr"
