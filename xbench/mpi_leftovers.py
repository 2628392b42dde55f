"""Files an MPI job leaves behind when its processes are killed inside MPI_Init.

MPICH's ranks create their node's shared-memory segments (``mpich_shm_*``, ``mpich_vci_*``,
``mpich_shar_tmp*``, UCX's ``ucx_shm_posix_*``) and remove their names once every local
rank has opened them; Hydra's proxy writes the node's topology (``hydra_hwloc_xmlfile_*``)
and removes it when its ranks end. A SIGKILL in between (an OOM kill, a killed launcher, a
test stopping a run at its start) leaves the names for good: nothing reclaims them, and a
small /dev/shm fills. None of the names says whose job it was, but each file's creator holds
it open or mapped until it removes the name, so a file of these names that no process holds
is garbage whoever made it. Only this user's files are considered.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# (folder, name patterns): where MPICH, UCX and Hydra put what they remove themselves
LEFTOVER_PATTERNS = (
    ("/dev/shm", ("mpich_shm_*", "mpich_vci_*", "mpich_shar_tmp*", "ucx_shm_posix_*")),
    ("/tmp", ("hydra_hwloc_xmlfile_*",)),
)


def _folders() -> list[tuple[Path, tuple[str, ...]]]:
    folders = [(Path(folder), patterns) for folder, patterns in LEFTOVER_PATTERNS]
    temp = Path(tempfile.gettempdir())
    if temp != Path("/tmp"):  # Hydra may follow TMPDIR
        folders.append((temp, LEFTOVER_PATTERNS[1][1]))
    return folders


def candidates() -> list[Path]:
    """This user's files with the names above (held or not)."""
    uid = os.getuid()
    found = []
    for folder, patterns in _folders():
        for pattern in patterns:
            for path in folder.glob(pattern):
                try:
                    if path.lstat().st_uid == uid and path.is_file():
                        found.append(path)
                except OSError:
                    continue  # removed meanwhile
    return found


def held_paths() -> set[str]:
    """Every path a process readable here holds open or has mapped."""
    held: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    held.add(os.readlink(fd))
                except OSError:
                    continue
            with open(proc / "maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith("/"):
                        held.add(fields[5].rstrip("\n"))
        except OSError:
            continue  # ended meanwhile, or another user's
    return held


def remove_orphans() -> list[Path]:
    """Remove the files above that no process holds; return what was removed. Cheap when
    there are none (two folder listings): /proc is read only when a candidate exists. The
    candidates are listed before /proc is read, so a file made in between is left alone."""
    found = candidates()
    if not found:
        return []
    held = held_paths()
    removed = []
    for path in found:
        if str(path) in held:
            continue
        try:
            path.unlink()
        except OSError:
            continue  # another cleaner was first, or it is not ours to remove
        removed.append(path)
    return removed
