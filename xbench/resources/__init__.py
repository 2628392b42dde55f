"""What xbench ships besides code: profiles and CUDA sources, found through importlib.resources.

The repository keeps them at its top level (``profiles/``, ``cuda/``); ``profiles`` and
``cuda`` here are links to those folders, so a checkout (editable install) and a wheel
(which holds copies) find them the same way, from any working directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from xbench.errors import XbenchError

DEFAULT_PROFILE = "h100-priors"


def _folder(name: str) -> Path:
    folder = resources.files(__name__).joinpath(name)
    path = Path(str(folder))
    if not path.is_dir():  # a zipped install: NVRTC and the TOML reader need real files
        raise XbenchError(
            f"xbench's {name}/ folder is not on disk ({folder})",
            "install xbench as a regular (unzipped) package",
        )
    return path


def profiles_dir() -> Path:
    return _folder("profiles")


def cuda_dir() -> Path:
    return _folder("cuda")


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml"))


def profile_path(name_or_path) -> Path:
    """A profile file: an existing path as given, else a profile shipped with xbench by name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    return profiles_dir() / f"{name_or_path}.toml"
