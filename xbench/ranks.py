"""What every rank xbench launches (probe, kernel --np, validate) does before MPI_Init."""

from __future__ import annotations

import os

# Only the main thread calls MPI (the watchdog and the tcp sender threads never do), so the
# ranks ask for MPI_THREAD_FUNNELED instead of mpi4py's default MULTIPLE: under MULTIPLE
# MPICH takes a lock in every call, which adds to each small-message round trip and which
# a C benchmark (MPI_Init) does not pay. MPI4PY_RC_THREAD_LEVEL still overrides it.
THREAD_LEVEL = "funneled"
# set by xbench's launcher for the ranks it starts, whose stderr is its launcher.log
STACKS_ON_STOP = "XBENCH_STACKS_ON_STOP"


def ask_thread_level() -> None:
    """Have MPI_Init (at mpi4py's import) ask for THREAD_LEVEL: every launched xbench rank
    runs at the level its probe ran at, so a profile's wire terms hold in validate's ranks."""
    import mpi4py

    if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
        mpi4py.rc.thread_level = THREAD_LEVEL


def dump_stacks_when_stopped() -> None:
    """A rank xbench's launcher started, stopped by it (Ctrl-C, SIGTERM, a stall), first
    writes every thread's stack to launcher.log, then ends as it would have: where a hung
    rank waited, also where no watchdog fired. Ranks started by srun or mpirun themselves
    write nothing extra to the job's output."""
    if os.environ.get(STACKS_ON_STOP):
        import faulthandler
        import signal

        faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def mpi_library(MPI) -> str:
    """The MPI library's first version line, as run.json records it. Open MPI ends its
    string with a NUL, which no JSON reader minds and no XML or terminal accepts."""
    return clean_library(MPI.Get_library_version().strip().splitlines()[0])


def clean_library(text: str | None) -> str | None:
    """A library version line without NULs (runs recorded before they were dropped)."""
    return None if text is None else text.replace("\x00", "").strip()
