"""pip constraints that hold each runtime dependency, and the mpich extra, to its declared
floor, for `make test-lowest`: "name>=X" becomes "name==X.*" (X or its post-releases), so a
floor is written as the oldest release that exists (mpich>=4.2.3: 4.2.0 has no wheel).

    python tests/lowest_constraints.py [pyproject.toml] > constraints.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement

try:  # run before xbench is installed, so not xbench.files's
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# torch: `make test-lowest` installs the CPU pin first (Makefile TORCH_CPU), as `make install`
# does, so no CUDA wheel is downloaded; its floor is not what runs.
NOT_PINNED = {"torch"}
# nvidia-cuda-nvrtc>=13 brings libnvrtc.so.13, which only the 13.x bindings load: the floor's
# 12.x line needs nvidia-cuda-nvrtc-cu12 (README), so the lowest run takes 13.x's oldest.
LINE_FLOORS = {"cuda-python": "13.0.0", "cuda-bindings": "13.0.0"}


def constraints(pyproject: Path) -> list[str]:
    """One "name==X.*" line per runtime dependency and the mpich extra; one without a ">="
    floor is an error, as its oldest release cannot be tried."""
    project = tomllib.loads(pyproject.read_text())["project"]
    lines = []
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["mpich"]]:
        declared = Requirement(requirement)
        floors = [s.version for s in declared.specifier if s.operator == ">="]
        if not floors:
            raise SystemExit(f"{requirement!r} has no '>=' floor; give it one in {pyproject}")
        if declared.name in NOT_PINNED:
            continue
        pin = f"{declared.name}=={LINE_FLOORS.get(declared.name, floors[0])}.*"
        lines.append(f"{pin}; {declared.marker}" if declared.marker else pin)
    return lines


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "pyproject.toml")
    print("\n".join(constraints(path)))
