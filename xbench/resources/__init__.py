"""What xbench ships besides code: profiles, scenarios and CUDA sources, found through
importlib.resources.

The repository keeps them at its top level (``profiles/``, ``scenarios/``, ``cuda/``); the
folders here are links to those, so a checkout (editable install) and a wheel
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


def scenarios_dir() -> Path:
    return _folder("scenarios")


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml"))


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


def _given_or_shipped(name_or_path, kind: str, folder: Path, shipped: list[str]) -> Path:
    """An existing path as given (or anything written as a path: a suffix, a folder), else
    the file xbench ships under that name, else one line listing the names it ships."""
    path = Path(name_or_path)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    if path.name not in shipped:
        raise XbenchError(
            f"{kind} {path} is neither a file nor one xbench ships",
            f"pass a {kind} file, or one of {', '.join(shipped)}",
        )
    return folder / f"{path.name}.toml"


def profile_path(name_or_path) -> Path:
    """A profile file: an existing path as given, else a profile shipped with xbench by name."""
    return _given_or_shipped(name_or_path, "profile", profiles_dir(), shipped_profiles())


def scenario_path(name_or_path) -> Path:
    """A scenario file: an existing path as given, else a scenario shipped with xbench by name
    (``agentic-codebase``), so a wheel's user need not find the repository's scenarios/."""
    return _given_or_shipped(name_or_path, "scenario", scenarios_dir(), shipped_scenarios())
