"""Where compiled native code is cached: the probe loop, the CPU bf16 kernel, CUDA cubins.

One place, so every builder keys its artefacts the same way and a user clears one folder.
``$XBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/xbench``, else ``~/.cache/xbench``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("XBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "xbench"
    )
    return Path(root)
