"""Facts about the host this process runs on: CPU, caches, memory mode, GPUs (NVML).

The lowest layer with ``core``: every other layer may ask it, it asks none of them. Each
fact is best-effort: a missing tool or driver gives ``None`` or ``[]``, never an exception.

``gpu_topology()`` returns, per GPU, a dict in this documented format (also what the tests
feed ``xbench.fabric.topology.label_pair`` from captured machines)::

    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "driver": "560.35.03", "memory_bytes": 85520809984,
     "pci_bus_id": "00000000:18:00.0", "numa_node": 0, "sm_clock_max_mhz": 1980,
     "mem_clock_max_mhz": 2619, "nvlink_p2p": ["GPU-...", ...],
     "nearest_nic": "mlx5_0"}
"""

from __future__ import annotations

import gc
import os
import platform
import socket
from contextlib import contextmanager
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def thp_mode() -> str | None:
    """Transparent huge page mode, e.g. ``always [madvise] never`` -> ``madvise``."""
    text = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    if not text:
        return None
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return text


def cpu_model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


# The CPU features that change which kernels run and how fast (AVX512-BF16 selects the C
# bf16 attention; AMX would change it again).
RELEVANT_CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_tile",
)


def cpu_flags() -> str | None:
    """The relevant CPU flags this host has, space-separated in a fixed order."""
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return " ".join(f for f in RELEVANT_CPU_FLAGS if f in have)
    return None


def installed_version(distribution: str) -> str | None:
    """An installed package's version, read from its metadata (None where absent).

    Not an import: importing torch changes how this process moves memory (a probe rank that
    had imported torch ran 16 MiB shared-memory ping-pongs 15-40 % faster than the same loop
    without it, and than osu_latency), so the host probes stay free of it.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def llc_bytes() -> int:
    """Last-level cache size of CPU 0 (sysfs), 32 MiB when unknown."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            best = max(
                best,
                int(text[:-1])
                * (1024 if text.endswith("K") else 1024**2 if text.endswith("M") else 1),
            )
        except (OSError, ValueError):
            continue
    return best or 32 * 2**20


def available_memory() -> int | None:
    """Bytes this host can give a process without swapping (MemAvailable), or None where
    the kernel does not say."""
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as a container or cgroup sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_placement() -> dict:
    """Where this process runs: the CPU it is on now (/proc's ``processor`` field, None
    where it cannot be read) and the CPUs it may run on (its affinity, as ``0-3,8``). Two
    launches of one benchmark differ by where their ranks land; pinned ranks stay put."""
    cpu = None
    stat = _read("/proc/self/stat")
    if stat:
        try:
            cpu = int(stat.rsplit(")", 1)[1].split()[36])
        except (IndexError, ValueError):
            cpu = None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = []
    spans, start = [], None
    for i, c in enumerate(allowed):  # 0,1,2,3,8 -> 0-3,8
        if start is None:
            start = c
        if i + 1 == len(allowed) or allowed[i + 1] != c + 1:
            spans.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return {"cpu": cpu, "allowed": ",".join(spans)}


def host_metadata() -> dict:
    """What this process can say about its host (stored with every run)."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "thp": thp_mode(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def host_conditions(gpu: bool) -> dict:
    """This host's side of a profile's conditions: its GPU and driver (``gpu``), else its CPU."""
    if gpu:
        gpus = gpu_topology()
        return {"gpu": gpus[0]["name"], "driver": gpus[0]["driver"]} if gpus else {}
    return {"cpu_model": cpu_model(), "cpu_flags": cpu_flags()}


# glibc serves allocations above a moving threshold (128 KiB to start) with fresh mmaps,
# faulted in page by page and unmapped on free, and raises the threshold as large blocks
# are freed: a process's history decides whether a 128 KiB partial costs page faults. A
# serving process has long reached steady state; fixing both thresholds gives every
# measuring process that state, whatever ran before (otherwise validate's merges and
# splices would pay page faults the kernel sweep's did not, and the two would disagree).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_MMAP_THRESHOLD = 64 * 2**20


@contextmanager
def collector_paused():
    """Python's cyclic collector off while timing, as timeit does: its pauses (measured:
    100-190 ms in the simulate replay's ranks, at the same points of each run) land on
    whichever call runs into them. Cycles made meanwhile wait for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def steady_allocator() -> str | None:
    """Put glibc's allocator in a serving process's steady state; say what was set."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None  # not glibc: nothing to set, nothing claimed
    if not (
        mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
        and mallopt(M_TRIM_THRESHOLD, 4 * STEADY_MMAP_THRESHOLD)
    ):
        return None
    return f"glibc mmap threshold {STEADY_MMAP_THRESHOLD >> 20} MiB"


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


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlink_peers(pynvml, handle, handles, uuids, me: int) -> list[str]:
    """UUIDs of the GPUs this one reaches over NVLink (NVML P2P status OK on the NVLink index)."""
    peers = []
    for j, other in enumerate(handles):
        if j == me:
            continue
        try:
            status = pynvml.nvmlDeviceGetP2PStatus(handle, other, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        except pynvml.NVMLError:
            continue
        if status == pynvml.NVML_P2P_STATUS_OK:
            peers.append(uuids[j])
    return peers


def gpu_by_uuid(gpus: list[dict], uuid: str) -> dict | None:
    """The GPU whose NVML UUID is ``uuid`` (a CUDA ordinal says nothing under --gpu-bind or
    CUDA_VISIBLE_DEVICES: NVML numbers every GPU of the node, CUDA only the visible ones)."""
    wanted = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    return next((g for g in gpus if g.get("uuid") == wanted), None)


def gpu_topology() -> list[dict]:
    """Every GPU NVML sees, in the format above; [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver here
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        gpus = []
        for i, h in enumerate(handles):
            bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            try:
                numa = int(Path(f"/sys/bus/pci/devices/{bus.lower()[-12:]}/numa_node").read_text())
            except (OSError, ValueError):
                numa = None
            gpus.append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": uuids[i],
                    "driver": _text(driver),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "pci_bus_id": bus,
                    "numa_node": numa,
                    "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                    "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
                    # NVLink peers by NVML's peer-to-peer status, as GPU UUIDs: on HGX boards
                    # the links' remote PCI ids are NVSwitches, never the other GPU
                    "nvlink_p2p": _nvlink_peers(pynvml, h, handles, uuids, i),
                    "nearest_nic": _nearest_nic(bus),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()
