"""Run metadata: what a result needs to be compared with another honestly.

Collected once per run on rank 0 and stored with every file (as pyperf does). Each probe
is best-effort: a missing tool gives ``None``, never an exception.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import uuid
from functools import lru_cache
from pathlib import Path

import xbench


def new_run_id(prefix: str = "run") -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{prefix}-{stamp}-{uuid.uuid4().hex[:6]}"


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


@lru_cache(maxsize=1)
def git_revision() -> str | None:
    """Git revision of the xbench checkout (``+dirty`` when it has changes)."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def torch_version() -> str | None:
    """The installed torch's version, read from its package metadata.

    Not ``import torch``: importing it changes how this process moves memory (a probe rank
    that had imported torch ran 16 MiB shared-memory ping-pongs 15-40 % faster than the same
    loop without it, and than osu_latency), so the host probes stay free of it.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def gpu_inventory() -> list[dict]:
    """GPUs seen by NVML in the topology format (xbench.fabric.topology); empty without a driver."""
    from xbench.fabric.topology import gpu_topology

    return gpu_topology()


def host_metadata() -> dict:
    """What this process can say about its host."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "thp": thp_mode(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def run_metadata(run_id: str, command: str, **extra) -> dict:
    """The metadata block stored with every file of a run."""
    meta = {
        "run_id": run_id,
        "command": command,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "xbench_version": xbench.__version__,
        "git_revision": git_revision(),
        "torch": torch_version(),
        "gpus": gpu_inventory(),
        **host_metadata(),
    }
    meta.update(extra)
    return meta


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
