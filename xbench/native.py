"""Where compiled native code is cached: the probe loop, the CPU bf16 kernel, CUDA cubins.

One place, so every builder keys its artefacts the same way and a user clears one folder.
``$XBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/xbench``, else ``~/.cache/xbench``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from xbench.errors import XbenchError


def prove_writable(path: Path) -> Path:
    """Create the folder ``path`` if need be and write a file in it; OSError if either fails."""
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
        pass
    return path


def cache_dir() -> Path:
    """The cache folder, created if need be; a one-line error when it cannot be used (a
    variable that points at a file, a folder without write permission)."""
    root = Path(
        os.environ.get("XBENCH_CACHE_DIR")
        or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "xbench")
    )
    try:
        return prove_writable(root)
    except OSError as exc:
        raise XbenchError(
            f"the cache folder {root} is unusable ({exc.strerror or exc})",
            "point XBENCH_CACHE_DIR (or XDG_CACHE_HOME) at a folder you can write",
        ) from None
