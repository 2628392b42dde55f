"""Files the project reads and writes: a TOML file read into one error line where it cannot
be, and a file written whole or not at all (a failure, a full disk or an interrupt, leaves
the file that was there, or none, never half of one)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from xbench.errors import XbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_toml(path, what: str, fix: str, error: type[XbenchError] = XbenchError) -> dict:
    """The TOML file ``path`` as tables, or ``error``'s one line saying why it cannot be read:
    missing, not TOML (with the line), or not a readable text file. ``what`` names the kind
    of file ("profile"), ``fix`` what to pass instead."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist", fix) from None
    except tomllib.TOMLDecodeError as exc:
        raise error(
            f"{what} {path} is not valid TOML ({exc})", "fix the syntax at that line"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, unreadable, not text
        reason = getattr(exc, "strerror", None) or exc
        raise error(f"cannot read {what} {path} ({reason})", fix) from None


def write_atomically(path, write, replace: bool = True) -> None:
    """``write(tmp)`` to a hidden file beside ``path``, then rename it over ``path``; with
    ``replace`` False, link it there only if ``path`` is still absent (two commands started
    together on one --out: the second is refused, not both saying "written")."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if replace:
            os.replace(tmp, path)
        else:
            appeared = XbenchError(
                f"{path} appeared while this ran (another command wrote it)",
                "pass another --out, or --force to replace it",
            )
            try:
                os.link(tmp, path)  # fails where path exists, atomically
            except FileExistsError:
                raise appeared from None
            except OSError:  # a file system without hard links: the check, then the rename
                if path.exists() or path.is_symlink():
                    raise appeared from None
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
    except BaseException as exc:  # a full disk, an interrupt: no half-written file left
        with contextlib.suppress(OSError):  # a read-only file system refuses even this
            tmp.unlink(missing_ok=True)
        # pyarrow's errors name no file, Python's name the hidden one: the one-line error
        # names the file the user asked for
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, tmp, str(tmp)):
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        raise


def write_text_atomically(path, text: str, replace: bool = True) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(text), replace)
