"""Writing a file whole or not at all: a failure (a full disk, an interrupt) leaves the file
that was there, or none, never half of one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomically(path, write) -> None:
    """``write(tmp)`` to a hidden file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk, an interrupt: no half-written file left
        with contextlib.suppress(OSError):  # a read-only file system refuses even this
            tmp.unlink(missing_ok=True)
        # pyarrow's errors name no file, Python's name the hidden one: the one-line error
        # names the file the user asked for
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, tmp, str(tmp)):
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        raise


def write_text_atomically(path, text: str) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(text))
