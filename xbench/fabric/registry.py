"""Transports by name, and the fabric labels a run may carry."""

from __future__ import annotations

from xbench.errors import XbenchError

FABRICS = ("shm", "nvlink", "ib", "ibgda", "roce", "tcp", "unknown")
HOST_TRANSPORTS = ("mpi", "tcp")
TRANSPORTS = HOST_TRANSPORTS  # GPU transports (nccl, nvshmem, mpi --device cuda) register here


def make_transport(
    name: str, pair, plan, *, loop: str = "auto", tcp_interface: str | None = None, seed: int = 0
):
    """Build the transport ``name`` for one rank pair."""
    if name == "mpi":
        from xbench.fabric.mpi_host import MpiHostTransport

        return MpiHostTransport(pair, plan, loop=loop, seed=seed)
    if name == "tcp":
        from xbench.fabric.tcp import TcpTransport

        return TcpTransport(pair, plan, loop=loop, interface=tcp_interface, seed=seed)
    raise XbenchError(f"unknown transport {name!r}", f"pick one of {', '.join(TRANSPORTS)}")


def infer_fabric(transport: str, same_host: bool) -> str:
    """The label a run gets when the user names none: what the pair most likely used."""
    if transport == "tcp":
        return "tcp"
    return "shm" if same_host else "unknown"


def check_fabric(label: str | None) -> str | None:
    if label is not None and label not in FABRICS:
        raise XbenchError(f"unknown fabric {label!r}", f"pick one of {', '.join(FABRICS)}")
    return label
