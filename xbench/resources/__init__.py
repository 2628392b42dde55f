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


def profile_path(name_or_path) -> Path:
    """A profile file: an existing path as given, else a profile shipped with xbench by name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    return profiles_dir() / f"{name_or_path}.toml"


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in scenarios_dir().glob("*.toml"))


def scenario_path(name_or_path) -> Path:
    """A scenario file: an existing path as given, else a scenario shipped with xbench by name
    (``agentic-codebase``), so a wheel's user need not find the repository's scenarios/."""
    path = Path(name_or_path)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    shipped = scenarios_dir() / f"{name_or_path}.toml"
    if not shipped.is_file():
        raise XbenchError(
            f"scenario {name_or_path} is neither a file nor one xbench ships",
            f"pass a scenario file, or one of {', '.join(shipped_scenarios())}",
        )
    return shipped
