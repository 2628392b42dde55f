"""The one exception type the CLI turns into a one-line message and an exit code."""

from __future__ import annotations

import errno
import os
import re
import sys


class XbenchError(Exception):
    """A problem the user can fix. ``problem`` says what is wrong, ``fix`` what to do."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None, exit_code: int | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class RankFailure(XbenchError):
    """A rank died, hung or reported an error while measuring."""

    exit_code = 3


def from_os_error(exc: OSError, where=None) -> XbenchError:
    """The one line for an OSError no layer caught. A full disk or quota is named as such
    (pyarrow's carries no file name: ``where`` is the run being written); a path the system
    refuses (too long, a file as a folder) is named with the fix; any other error with no
    path is a socket's or the system's."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        place = exc.filename or where
        return XbenchError(
            os.strerror(exc.errno) + (f" writing {place}" if place else ""),
            f"free space {'there' if place else 'where xbench writes'} (or raise the quota), "
            "or write elsewhere (--out)",
        )
    if exc.errno == errno.EROFS:
        return XbenchError(
            f"cannot write {exc.filename or 'there'}: {exc.strerror}",
            "pass a path on a file system mounted read-write",
        )
    if exc.filename is None and not isinstance(exc, (FileNotFoundError, PermissionError)):
        return XbenchError(
            f"system error: {exc.strerror or exc}", "check the network and the peers"
        )
    return XbenchError(
        f"cannot use {exc.filename or 'a path'}: {exc.strerror or exc}",
        "pass a path the file system accepts (a shorter name, a folder you can write)",
    )


def missing_dependency(module: str) -> XbenchError | None:
    """The one line for a dependency of xbench's that this Python cannot find (GPU sites
    install xbench with --no-deps and bring their own torch and MPI): ``module`` is what
    failed to import. None where it is no declared dependency, or is there but broken: a
    bug, left to its traceback."""
    import importlib.util
    from importlib import metadata  # (about 17 ms: only on this path, not each command's start)

    top = module.partition(".")[0]
    if not top or importlib.util.find_spec(top) is not None:
        return None
    try:
        declared = metadata.requires("xbench") or []
    except metadata.PackageNotFoundError:
        return None

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    for line in declared:
        requirement, _, marker = line.partition(";")
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
        if "extra" in marker or name is None or normal(name.group()) != normal(top):
            continue
        fix = f"pip install '{requirement.strip()}'"
        if top == "torch":  # PyPI's Linux torch is the CUDA build, GBs where no GPU uses it
            fix += (
                " (on GPUs a CUDA build; without one the CPU build: "
                "--index-url https://download.pytorch.org/whl/cpu)"
            )
        return XbenchError(f"{top} is not installed for {sys.executable}", fix)
    return None


def require_installed(module: str) -> None:
    """Refuse a command whose processes will import ``module``, a declared dependency, where
    it is absent: before anything is written, and without importing it (torch takes over a
    second)."""
    error = missing_dependency(module)
    if error is not None:
        raise error


# What torch's allocators say when an allocation fails (its CPU allocator, CUDA's caching
# allocator: torch.OutOfMemoryError is a RuntimeError)
ALLOCATION_FAILED = ("can't allocate memory", "CUDA out of memory", "out of memory")


def out_of_memory(exc: BaseException) -> XbenchError | None:
    """The one line for what was asked for (requests, sizes, shapes) outgrowing the
    machine: Python's MemoryError, or torch's allocators' RuntimeError (CPU and CUDA);
    None for anything else (any other RuntimeError is a bug)."""
    failed = isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and (
            type(exc).__name__ == "OutOfMemoryError"
            or any(words in str(exc) for words in ALLOCATION_FAILED)
        )
    )
    if not failed:
        return None
    return XbenchError(
        "out of memory: what was asked for does not fit in this machine's memory",
        "ask for less (fewer --requests, smaller sizes, rows or chunks)",
    )
