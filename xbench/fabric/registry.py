"""Transports by name, and the fabric labels a run may carry."""

from __future__ import annotations

from xbench.errors import XbenchError

FABRICS = ("shm", "nvlink", "ib", "ibgda", "roce", "tcp", "unknown")
HOST_TRANSPORTS = ("mpi", "tcp")
DEVICE_TRANSPORTS = ("nccl", "nvshmem")
TRANSPORTS = HOST_TRANSPORTS + DEVICE_TRANSPORTS
# Who posts the messages: the host (every transport) or GPU kernels (NVSHMEM's device API)
INITIATORS = ("host", "device")
DEVICE_INITIATED = ("nvshmem",)


def needs_torch(name: str, device: str = "host") -> bool:
    """Whether a transport's ranks import torch: the device transports' buffers and timers,
    and any transport's device buffers."""
    return name in DEVICE_TRANSPORTS or device == "cuda"


def transport_class(name: str, device: str = "host", initiator: str = "host"):
    """The class behind a transport name (imports only what that transport needs)."""
    if name == "mpi":
        if device == "cuda":
            from xbench.fabric.mpi_device import MpiDeviceTransport

            return MpiDeviceTransport
        from xbench.fabric.mpi_host import MpiHostTransport

        return MpiHostTransport
    if name == "tcp":
        from xbench.fabric.tcp import TcpTransport

        return TcpTransport
    if name == "nccl":
        from xbench.fabric.nccl import TorchDistTransport

        return TorchDistTransport
    if name == "nvshmem" and initiator == "device":
        from xbench.fabric.nvshmem_device import NvshmemDeviceTransport

        return NvshmemDeviceTransport
    if name == "nvshmem":
        from xbench.fabric.nvshmem import NvshmemTransport

        return NvshmemTransport
    raise XbenchError(f"unknown transport {name!r}", f"pick one of {', '.join(TRANSPORTS)}")


def make_transport(
    name: str,
    pair,
    plan,
    *,
    loop: str = "auto",
    tcp_interface: str | None = None,
    seed: int = 0,
    device: str = "host",
    backend: str = "nccl",
    initiator: str = "host",
):
    """Build the transport ``name`` for one rank pair."""
    cls = transport_class(name, device, initiator)
    if name == "mpi":
        return cls(pair, plan, loop=loop, seed=seed)
    if name == "tcp":
        return cls(pair, plan, loop=loop, interface=tcp_interface, seed=seed)
    if name == "nccl":
        return cls(pair, plan, backend=backend, seed=seed)
    return cls(pair, plan, seed=seed)


def infer_fabric(transport: str, same_host: bool, device: str = "host") -> str:
    """The label a run gets when the user names none: what the pair most likely used."""
    if transport == "tcp":
        return "tcp"
    if device == "cuda" or transport == "nvshmem":
        return "unknown"  # NVLink or PCIe on one host, a network between hosts: say --fabric
    return "shm" if same_host else "unknown"


def check_fabric(label: str | None) -> str | None:
    if label is not None and label not in FABRICS:
        raise XbenchError(f"unknown fabric {label!r}", f"pick one of {', '.join(FABRICS)}")
    return label
