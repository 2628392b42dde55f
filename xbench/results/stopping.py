"""A launched rank that must stop now: it says why, marks its run partial, and ends, so the
launcher takes the other ranks down instead of leaving them to wait on it."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager


def stop_rank(rank: int, sink, message: str, code: int, out_dir=None):
    """Stop this rank now; the launcher takes the others down. Rank 0 says why through its
    sink (to the parent xbench, or on its own terminal) and marks its run partial (under a
    site launcher no parent does), the others on stderr, where the parent reads the first
    ``xbench: error on rank N:`` line of the launcher's log."""
    if rank == 0:
        if out_dir is not None:
            from xbench.results.store import mark_partial  # (pyarrow: only when stopping)

            mark_partial(out_dir, message, only_running=True)
        sink.error(message)
    else:
        sys.stderr.write(f"xbench: error on rank {rank}: {message}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextmanager
def failures_stop_the_job(sink, out_dir=None):
    """Around a launched rank's work: an exception raised through it (a full disk under rank
    0's part files, a refused CUDA graph capture, a bug) stops the job at once with one line
    that names it, its traceback left in the launcher's log. Without this the rank's Python
    left through MPI_Finalize while its peers waited in their next collective until their
    watchdog gave up (120 s by default) and blamed the peer or the fabric."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever it is, the job must not wait on it
        import traceback

        from mpi4py import MPI

        from xbench.errors import XbenchError, from_os_error

        rank = MPI.COMM_WORLD.Get_rank()
        if isinstance(exc, XbenchError):
            error = exc
        else:
            traceback.print_exc()
            first = (str(exc).strip().splitlines() or [""])[0]
            error = (
                from_os_error(exc, out_dir)
                if isinstance(exc, OSError)
                else XbenchError(
                    f"{type(exc).__name__}: {first}" if first else type(exc).__name__,
                    "an xbench bug: its traceback is on the rank's stderr (launcher.log)",
                )
            )
        stop_rank(rank, sink, str(error), error.exit_code, out_dir)
