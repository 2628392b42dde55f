"""Run metadata: what a result needs to be compared with another honestly.

Collected once per run on rank 0 and stored with every file (as pyperf does). Each probe
is best-effort: a missing tool gives ``None``, never an exception.
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid

from xbench.host import gpu_topology, host_metadata, installed_version
from xbench.version import __version__, git_revision


def new_run_id(prefix: str = "run") -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{prefix}-{stamp}-{uuid.uuid4().hex[:6]}"


# Settings that change what an MPI library does (its netmod, transports, components), as
# rank 0 saw them: two runs that differ here measured different paths
MPI_ENV_PREFIXES = ("MPICH_", "MPIR_CVAR_", "UCX_", "FI_", "OMPI_MCA_", "PMIX_MCA_", "I_MPI_")


def mpi_settings(environ=None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(MPI_ENV_PREFIXES)}


def run_metadata(run_id: str, command: str, **extra) -> dict:
    """The metadata block stored with every file of a run."""
    meta = {
        "run_id": run_id,
        "command": command,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "xbench_version": __version__,
        "git_revision": git_revision(),
        "torch": installed_version("torch"),
        "triton": installed_version("triton"),  # the triton backend's compiler
        "gpus": gpu_topology(),
        "mpi_settings": mpi_settings(),
        **host_metadata(),
    }
    meta.update(extra)
    return meta
