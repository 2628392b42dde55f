"""Which run directory this process writes: the run an interrupt, a signal or an error
marks partial. Its own module: every command's error mapping asks (the store loads pandas),
and the store tells it (the stopping code marks runs through the store)."""

from __future__ import annotations

_written_here: list = []  # the run directory this process claimed or opened to write


def note_run_dir_written(path) -> None:
    """This process claimed ``path``, or opened it to write its tables."""
    _written_here[:] = [path]


def run_dir_written_here():
    """The run directory this process claimed, or opened to write its tables (rank 0 under
    a site launcher, where no parent xbench claimed it): the run an interrupt or an error
    marks partial. None before either."""
    return _written_here[0] if _written_here else None


def forget_run_dir() -> None:
    """A command begins: no run directory of its own yet."""
    _written_here.clear()
