"""The label of a rank pair, from the host and GPU each rank drives.

A pair of ranks (each: host plus the GPU dict of ``xbench.host.gpu_topology``) is
``same-GPU``, ``nvlink`` (the other's bus id is among this GPU's active NVLink peers),
``same-node-pcie`` or ``inter-node``.
"""

from __future__ import annotations


def _norm(bus: str) -> str:
    return bus.lower()[-12:]


def label_pair(a: dict, b: dict) -> str:
    """``a`` and ``b``: {"host": str, "gpu": gpu dict or None} for the two ranks.

    NVLink is read from NVML's peer-to-peer status (``nvlink_p2p``, GPU UUIDs); topology
    dicts from before it carry ``nvlink_peers`` (remote PCI bus ids), still understood.
    """
    if a["host"] != b["host"]:
        return "inter-node"
    ga, gb = a.get("gpu"), b.get("gpu")
    if not ga or not gb:
        return "intra-node"
    if ga["uuid"] == gb["uuid"]:
        return "same-GPU"
    if gb["uuid"] in ga.get("nvlink_p2p", ()) or ga["uuid"] in gb.get("nvlink_p2p", ()):
        return "nvlink"
    if _norm(gb["pci_bus_id"]) in {_norm(p) for p in ga.get("nvlink_peers", [])}:
        return "nvlink"
    return "same-node-pcie"
