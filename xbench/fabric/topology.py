"""GPU topology via NVML, and the label of a rank pair.

``gpu_topology()`` returns, per GPU, a dict in this documented format (also what the tests
feed ``label_pair`` from captured machines)::

    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "driver": "560.35.03", "memory_bytes": 85520809984,
     "pci_bus_id": "00000000:18:00.0", "numa_node": 0, "sm_clock_max_mhz": 1980,
     "mem_clock_max_mhz": 2619, "nvlink_peers": ["00000000:2A:00.0", ...],
     "nearest_nic": "mlx5_0"}

A pair of ranks (each: host plus the GPU it drives) is ``same-GPU``, ``nvlink`` (the
other's bus id is among this GPU's active NVLink peers), ``same-node-pcie`` or
``inter-node``.
"""

from __future__ import annotations

from pathlib import Path


def _nearest_nic(bus_id: str) -> str | None:
    """The InfiniBand device sharing the longest PCI path with the GPU (sysfs), if any."""
    gpu = Path("/sys/bus/pci/devices") / bus_id.lower()[-12:]
    try:
        gpu_path = gpu.resolve().parts
    except OSError:
        return None
    best, best_len = None, 0
    for nic in Path("/sys/class/infiniband").glob("*"):
        try:
            parts = (nic / "device").resolve().parts
        except OSError:
            continue
        common = 0
        for a, b in zip(gpu_path, parts, strict=False):
            if a != b:
                break
            common += 1
        if common > best_len:
            best, best_len = nic.name, common
    return best


def gpu_topology() -> list[dict]:
    """Every GPU NVML sees, in the format above; [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver here
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            peers = []
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link):
                        remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                        peers.append(remote.decode() if isinstance(remote, bytes) else remote)
                except pynvml.NVMLError:
                    break
            try:
                numa = int(Path(f"/sys/bus/pci/devices/{bus.lower()[-12:]}/numa_node").read_text())
            except (OSError, ValueError):
                numa = None
            gpus.append(
                {
                    "index": i,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "uuid": pynvml.nvmlDeviceGetUUID(h),
                    "driver": driver,
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "pci_bus_id": bus,
                    "numa_node": numa,
                    "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                    "nvlink_peers": sorted(set(peers)),
                    "nearest_nic": _nearest_nic(bus),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _norm(bus: str) -> str:
    return bus.lower()[-12:]


def label_pair(a: dict, b: dict) -> str:
    """``a`` and ``b``: {"host": str, "gpu": gpu dict or None} for the two ranks."""
    if a["host"] != b["host"]:
        return "inter-node"
    ga, gb = a.get("gpu"), b.get("gpu")
    if not ga or not gb:
        return "intra-node"
    if ga["uuid"] == gb["uuid"]:
        return "same-GPU"
    if _norm(gb["pci_bus_id"]) in {_norm(p) for p in ga.get("nvlink_peers", [])}:
        return "nvlink"
    return "same-node-pcie"
