"""``--fabric`` presets: the settings that force each path, per communication library.

Applied to the ranks' environment before the library initialises, recorded with the run,
and, for NCCL, checked after the fact in the log NCCL writes with ``NCCL_DEBUG=INFO``
(its channel lines say ``via P2P/...``, ``via NET/IB/...``, ``via NET/Socket/...``).

| fabric | NCCL (nccl transport) | UCX (MPI over UCX) | NVSHMEM (nvshmem transport) |
|---|---|---|---|
| nvlink | P2P on, SHM and network off | UCX_TLS=cuda_ipc,cuda_copy,sm,self | P2P on, NVSHMEM_REMOTE_TRANSPORT=none |
| ib | P2P and SHM off, NCCL_NET=IB | UCX_TLS=rc_x,cuda_copy,self | P2P off, ibrc, IBGDA off |
| ibgda | (n/a: NCCL proxies through the CPU) | (n/a) | P2P off, NVSHMEM_IB_ENABLE_IBGDA=1 |
| roce | as ib, plus NCCL_IB_GID_INDEX=3 (RoCE v2) | UCX_TLS=rc_v,..., UCX_IB_GID_INDEX=3 | as ib, plus NVSHMEM_IB_GID_INDEX=3 |
| tcp | P2P, SHM, IB off, NCCL_NET=Socket | UCX_TLS=tcp,cuda_copy,self | NVSHMEM_REMOTE_TRANSPORT=ucx with UCX_TLS=tcp |
"""

from __future__ import annotations

import re

from xbench.errors import XbenchError

NCCL = {
    "nvlink": {"NCCL_P2P_DISABLE": "0", "NCCL_SHM_DISABLE": "1", "NCCL_NET_DISABLE_INTRA": "1"},
    "ib": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET": "IB",
    },
    "roce": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "0",
        "NCCL_NET": "IB",
        "NCCL_IB_GID_INDEX": "3",
    },
    "tcp": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "Socket",
    },
}
UCX = {
    "nvlink": {"UCX_TLS": "cuda_ipc,cuda_copy,sm,self"},
    "ib": {"UCX_TLS": "rc_x,cuda_copy,self"},
    "roce": {"UCX_TLS": "rc_v,cuda_copy,self", "UCX_IB_GID_INDEX": "3"},
    "tcp": {"UCX_TLS": "tcp,cuda_copy,self"},
    "shm": {"UCX_TLS": "sm,self"},
}
NVSHMEM = {
    "nvlink": {"NVSHMEM_DISABLE_P2P": "0", "NVSHMEM_REMOTE_TRANSPORT": "none"},
    "ib": {
        "NVSHMEM_DISABLE_P2P": "1",
        "NVSHMEM_REMOTE_TRANSPORT": "ibrc",
        "NVSHMEM_IB_ENABLE_IBGDA": "0",
    },
    "ibgda": {"NVSHMEM_DISABLE_P2P": "1", "NVSHMEM_IB_ENABLE_IBGDA": "1"},
    "roce": {
        "NVSHMEM_DISABLE_P2P": "1",
        "NVSHMEM_REMOTE_TRANSPORT": "ibrc",
        "NVSHMEM_IB_ENABLE_IBGDA": "0",
        "NVSHMEM_IB_GID_INDEX": "3",
    },
    "tcp": {
        "NVSHMEM_DISABLE_P2P": "1",
        "NVSHMEM_REMOTE_TRANSPORT": "ucx",
        "UCX_TLS": "tcp,cuda_copy,self",
    },
}
LIBRARY_OF_TRANSPORT = {"nccl": NCCL, "nvshmem": NVSHMEM, "mpi": UCX}
DEBUG = {
    "nccl": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"},
    "nvshmem": {"NVSHMEM_DEBUG": "INFO"},
}


def preset_env(transport: str, fabric: str | None, backend: str = "nccl") -> dict[str, str]:
    """The environment that forces ``fabric`` on ``transport`` (empty when nothing applies)."""
    if fabric is None or transport == "tcp" or (transport == "nccl" and backend == "gloo"):
        return {}
    table = LIBRARY_OF_TRANSPORT.get(transport, {})
    if transport == "mpi" and fabric == "shm":
        return {}  # MPICH's shared memory needs no forcing
    if fabric not in table:
        if transport in ("nccl", "nvshmem"):
            raise XbenchError(
                f"fabric {fabric!r} has no preset for the {transport} transport",
                f"pick one of {', '.join(table)}",
            )
        return {}
    return {**table[fabric], **DEBUG.get(transport, {})}


_NCCL_VIA = re.compile(r"via (P2P|SHM|NET/IB|NET/Socket|NET/[A-Za-z_]+)")
EXPECTED_NCCL = {"nvlink": ("P2P",), "ib": ("NET/IB",), "roce": ("NET/IB",), "tcp": ("NET/Socket",)}


def check_nccl_log(text: str, fabric: str) -> tuple[bool, set[str]]:
    """Did NCCL use the path the preset asked for? (ok, transports seen in its channel lines)."""
    seen = set(_NCCL_VIA.findall(text))
    if not seen:  # no evidence is not a pass: NCCL_DEBUG=INFO did not reach the ranks
        return False, seen
    if fabric not in EXPECTED_NCCL:
        return True, seen
    return all(any(s.startswith(e) for e in EXPECTED_NCCL[fabric]) for s in seen), seen
