"""What every rank xbench launches (probe, kernel --np, validate) does before MPI_Init."""

from __future__ import annotations

import os

# Only the main thread calls MPI (the watchdog and the tcp sender threads never do), so the
# ranks ask for MPI_THREAD_FUNNELED instead of mpi4py's default MULTIPLE: under MULTIPLE
# MPICH takes a lock in every call, which adds to each small-message round trip and which
# a C benchmark (MPI_Init) does not pay. MPI4PY_RC_THREAD_LEVEL still overrides it.
THREAD_LEVEL = "funneled"


def ask_thread_level() -> None:
    """Have MPI_Init (at mpi4py's import) ask for THREAD_LEVEL: every launched xbench rank
    runs at the level its probe ran at, so a profile's wire terms hold in validate's ranks."""
    import mpi4py

    if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
        mpi4py.rc.thread_level = THREAD_LEVEL


def mpi_library(MPI) -> str:
    """The MPI library's first version line, as run.json records it. Open MPI ends its
    string with a NUL, which no JSON reader minds and no XML or terminal accepts."""
    return clean_library(MPI.Get_library_version().strip().splitlines()[0])


def clean_library(text: str | None) -> str | None:
    """A library version line without NULs (runs recorded before they were dropped)."""
    return None if text is None else text.replace("\x00", "").strip()
