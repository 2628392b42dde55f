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
