"""The version of xbench and the git revision it was built or run from.

A checkout (editable install) asks git each time; a wheel carries the revision its build
saw in ``_build_revision.txt`` (written by ``setup.py``'s build step), since an installed
package has no repository to ask.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib import resources
from pathlib import Path

__version__ = "0.3.0"


def checkout_revision(root: Path) -> str | None:
    """``git rev-parse`` of the checkout at ``root`` (``+dirty`` when it has changes)."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


@lru_cache(maxsize=1)
def git_revision() -> str | None:
    """The checkout's revision when running from one, else the revision the wheel was built at."""
    root = Path(__file__).resolve().parents[1]
    if (root / ".git").exists():
        found = checkout_revision(root)
        if found:
            return found
    try:
        stamp = resources.files("xbench").joinpath("_build_revision.txt").read_text().strip()
    except OSError:
        return None
    return stamp or None


def version_line() -> str:
    """What ``xbench --version`` prints."""
    return f"xbench {__version__} (git {git_revision() or 'unknown'})"
