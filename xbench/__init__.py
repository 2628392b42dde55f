"""xbench: measure fabrics and MLA kernels, fit a cost model, decide route / fetch / local.

The cost model is importable without MPI, torch or a GPU::

    import xbench
    profile = xbench.load_profile("h100-priors")  # a shipped name, or a file's path
    decision = xbench.decide(profile, xbench.Request(rows=8, heads=128, chunk_tokens=2048))
    table = xbench.decide_grid(profile, {"rows": [1, 8, 64], "chunk_tokens": [512, 4096]})
"""

from xbench.core.costmodel import Decision, Profile, Request, decide  # noqa: E402
from xbench.core.profile import load_profile as _load_profile  # noqa: E402
from xbench.version import __version__  # noqa: E402


def load_profile(name_or_path) -> Profile:
    """A profile file, or one xbench ships by name ("h100-priors", "h200"), from any
    directory (the repository's profiles/ need not be here)."""
    from xbench.resources import profile_path

    return _load_profile(profile_path(name_or_path))


def decide_grid(profile, grid, *, threads=None):
    """The predicate over many requests (a DataFrame, or field -> values for a cartesian grid).

    Large grids run in blocks on ``threads`` threads (default: this process's CPUs, at most 8).
    """
    from xbench.core.grid import decide_grid as _decide_grid

    return _decide_grid(profile, grid, threads=threads)


__all__ = ["Decision", "Profile", "Request", "decide", "decide_grid", "load_profile", "__version__"]
