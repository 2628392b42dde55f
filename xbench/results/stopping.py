"""A command or launched rank that must stop now (an error, a signal): it says why, marks
the run it writes partial, and ends, so a launcher takes the other ranks down instead of
leaving them to wait on it."""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager

# what a signal to a rank means, and the exit code a shell gives a process it ended
SIGNALLED = {signal.SIGTERM: ("terminated", 143), signal.SIGINT: ("interrupted", 130)}


def mark_run_partial(run_dir, reason: str) -> str | None:
    """Mark the run this process writes (``run_dir``, None: none begun) partial unless it
    already says otherwise; what run.json says now (None: nothing written yet)."""
    if run_dir is None:
        return None
    from xbench.results.store import mark_partial  # (pyarrow: only when stopping)

    return mark_partial(run_dir, reason)


def mark_stopped(what: str, run_dir) -> str:
    """Mark the run this process writes partial, unless it finished (a signal while its
    summary prints), and say so in the one line for a command a signal stopped."""
    status = mark_run_partial(run_dir, what)
    if status is None:  # no run.json yet (ranks still starting): no case either
        return f"{what} before anything was written"
    from xbench.results.store import COMPLETE, RUNNING  # (loaded by mark_run_partial)

    if status == COMPLETE:
        return f"{what} after the run finished; it is whole in {run_dir}"
    if status == RUNNING:  # a full disk: run.json could not be rewritten
        said = (
            "run.json could not be rewritten and still says running; fit, compare, check "
            "and report say it never finished"
        )
    else:
        said = "run.json marks the run partial; fit, compare, check and report say so"
    return f"{what}; the cases finished so far are in {run_dir} ({said})"


def stop_rank(rank: int, sink, message: str, code: int, out_dir=None):
    """Stop this rank now; the launcher takes the others down. Rank 0 says why through its
    sink (to the parent xbench, or on its own terminal) and marks its run partial (under a
    site launcher no parent does), the others on stderr, where the parent reads the first
    ``xbench: error on rank N:`` line of the launcher's log."""
    if rank == 0:
        mark_run_partial(out_dir, message)
        sink.error(message, code)
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

        from xbench.errors import XbenchError, from_os_error, out_of_memory

        rank = MPI.COMM_WORLD.Get_rank()
        if isinstance(exc, XbenchError):
            error = exc
        elif oom := out_of_memory(exc):  # what was asked for outgrew the rank's memory
            error = oom
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


_wakeup: list = []  # the socket pair signals wake the stopping thread through
# How long the other ranks give rank 0 after a signal, under a launcher that ends the job
# once one rank exits (mpiexec, mpirun): with rank 1 leaving at once, mpiexec killed rank 0
# after it marked its run partial and before it said so, in 3 of 15 tries. Rank 0 took
# 3-15 ms for both here, and its own exit ends the others sooner. srun waits for every
# task (--kill-on-bad-exit too: no line lost in 16 tries), so its ranks need not wait.
OTHERS_LEAVE_AFTER_S = 1.0


def stop_when_signalled(rank: int, sink, *, others_wait: bool) -> None:
    """Around a rank a site launcher (srun, mpirun) started: a scheduler's time limit or
    scancel sends SIGTERM to every rank, Ctrl-C on srun SIGINT. A rank spinning in an MPI
    call never returns to Python, where the signal's handler would run, and one that leaves
    through MPI_Finalize waits for peers that are leaving too: the ranks stayed until
    Slurm's SIGKILL (run.json saying running), or for good under mpiexec. A thread woken by
    the signal ends the rank at once: rank 0 marks its run partial and says where the
    finished cases are, the others end with the same code and no line of their own (one a
    rank is thousands on a large job), after giving rank 0 time where ``others_wait``.
    Call from the main thread, after MPI_Init (Open MPI sets its own SIGTERM handler
    there)."""
    import socket
    import threading

    from xbench.results.written_here import run_dir_written_here

    woken, waker = _wakeup[:] = socket.socketpair()  # kept: a collected socket closes its fd
    waker.setblocking(False)
    for signum in SIGNALLED:  # a Python handler is what makes the C one write the wakeup fd
        signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(waker.fileno(), warn_on_full_buffer=False)

    def stop_when_woken() -> None:
        while (byte := woken.recv(1)) and byte[0] not in SIGNALLED:
            pass  # another signal with a Python handler: not ours to act on
        if not byte:
            return
        what, code = SIGNALLED[signal.Signals(byte[0])]
        if rank == 0:
            sink.error(mark_stopped(what, run_dir_written_here()), code)
        elif others_wait:  # each rank got the signal: rank 0 marks its run and says so
            time.sleep(OTHERS_LEAVE_AFTER_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=stop_when_woken, name="xbench-stop-on-signal", daemon=True).start()
