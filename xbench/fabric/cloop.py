"""Build and load the compiled probe loops (``xbench/probe/loops.c``) with the MPI's mpicc.

The shared object is cached by a hash of the source and of what ``mpicc -show`` runs, so
a different MPI gets its own build. Building is atomic (compile to a temporary name,
rename), so ranks that race to build on one host do no harm.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from xbench.fabric.launch import find_mpi_tool
from xbench.native import cache_dir

SOURCE = Path(__file__).resolve().parent.parent / "probe" / "loops.c"


class LoopUnavailable(RuntimeError):
    """The compiled loop cannot be built or loaded here (the reason is the message)."""


def find_mpicc() -> str | None:
    return find_mpi_tool("mpicc", "MPICC")


@lru_cache(maxsize=1)
def build_loops() -> Path:
    """Compile loops.c once per (source, MPI) and return the shared object's path."""
    mpicc = find_mpicc()
    if not mpicc:
        raise LoopUnavailable("no mpicc found (set MPICC, or pip install mpich)")
    try:
        show = subprocess.run([mpicc, "-show"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise LoopUnavailable(f"{mpicc} -show failed: {exc}") from None
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + show.encode() + mpicc.encode()).hexdigest()[:16]
    target = cache_dir() / f"xbench-loops-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so")
    os.close(fd)
    cmd = [mpicc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        os.unlink(tmp)
        first = (result.stderr.strip().splitlines() or ["unknown error"])[0]
        raise LoopUnavailable(f"mpicc could not build the probe loop: {first}")
    os.replace(tmp, target)
    return target


@lru_cache(maxsize=1)
def load_loops() -> ctypes.CDLL:
    """Load the compiled loops with their C signatures declared."""
    lib = ctypes.CDLL(str(build_loops()), mode=ctypes.RTLD_GLOBAL)
    vp, i, lg, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_double
    signatures = {
        "xb_mpi_exchange": [vp, i, i, vp, lg, vp, lg, lg],
        "xb_mpi_window": [vp, i, i, vp, lg, i, lg, vp],
        "xb_mpi_biwindow": [vp, i, vp, vp, lg, i, lg, vp],
        "xb_mpi_fetch": [vp, i, i, i, vp, vp, i, lg, vp, lg, vp],
        "xb_tcp_exchange": [i, i, vp, lg, vp, lg, lg],
        "xb_tcp_window": [i, i, vp, lg, i, lg],
        "xb_tcp_duplex": [i, vp, vp, lg, i, lg],
        "xb_tcp_fetch": [i, i, i, vp, vp, i, lg, vp, lg],
        "xb_empty": [lg],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = d
    return lib
