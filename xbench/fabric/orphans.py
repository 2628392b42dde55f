"""The processes a launcher leaves running after it exits, waited for before a launch returns.

Hydra's proxy (and Open MPI's daemons) start in sessions of their own, so once ``mpiexec``
has exited they are re-parented to init and nothing of xbench's waits for them: a proxy
whose ranks were killed outlived the launch by seconds and then left its topology file in
/tmp. While a launch runs, xbench is a child subreaper (Linux's PR_SET_CHILD_SUBREAPER):
orphans of the job become its children, and the launch ends only when they have ended,
stopped if they outlive ``LINGER_S``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# how long a launcher's orphans may take to end by themselves once the launcher has exited
LINGER_S = 5.0


def _prctl(option: int, value) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False  # not Linux: orphans go to init, as before


def _is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and flag.value != 0


def parents() -> dict[int, list[tuple[int, int]]]:
    """Every process readable in /proc under its parent: ppid -> [(pid, process group)]."""
    found: dict[int, list[tuple[int, int]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        found.setdefault(int(fields[1]), []).append((int(stat.parent.name), int(fields[2])))
    return found


def children() -> set[int]:
    """The pids whose parent is this process (zombies included)."""
    return {pid for pid, _ in parents().get(os.getpid(), [])}


def _reap(pid: int) -> bool:
    """True once ``pid`` has ended and been waited for (or is not a child any more)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def end_adopted(known: set[int], linger_s: float = LINGER_S) -> list[int]:
    """Wait for this process's children other than ``known`` (orphans adopted during a
    launch, and what they started in turn) to end, up to ``linger_s``; kill what is left
    then. Returns the pids killed."""
    deadline = time.monotonic() + linger_s
    killed: set[int] = set()
    while True:
        adopted = {pid for pid in children() - known if not _reap(pid)}
        if not adopted or time.monotonic() > deadline + LINGER_S:
            return sorted(killed)  # (the second: a killed one stuck in the kernel)
        if time.monotonic() > deadline:
            for pid in adopted - killed:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.add(pid)
        time.sleep(0.05)


@dataclass
class Adoption:
    """What :func:`adopting_orphans` found: the children this process already had (left
    alone), and, once the block has ended, the adopted processes it had to kill."""

    known: set[int]
    stopped: list[int] = field(default_factory=list)


@contextmanager
def adopting_orphans(linger_s: float = LINGER_S) -> Iterator[Adoption]:
    """Within the block, this process adopts the orphans of what it starts; at its end it
    waits up to ``linger_s`` for every process adopted (then stops them, listed in the
    yielded ``stopped``), and returns to how it was."""
    was = _is_subreaper()
    adoption = Adoption(children())
    if not was:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield adoption
    finally:
        try:
            adoption.stopped = end_adopted(adoption.known, linger_s)
        finally:
            if not was:
                _prctl(PR_SET_CHILD_SUBREAPER, 0)
