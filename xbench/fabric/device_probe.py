"""The device-initiated probe program: ``cuda/probe_device_main.cu`` built with nvcc.

The GPU moves the bytes and times itself (``%globaltimer``), so no host overhead enters the
figure: NVSHMEM put, put-with-signal ping-pong and block-wide put bandwidth, and the peer
loops (two kernels bumping each other's flag, a grid copying between buffers). Built as
NVSHMEM's own perftest programs are: relocatable device code linked against the headers,
``libnvshmem_host`` and ``libnvshmem_device`` of the ``nvidia-nvshmem-cu12``/``-cu13``
wheel; without that wheel, the peer loops alone. The program prints one JSON object a line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from xbench.errors import XbenchError

SOURCE = "probe_device_main.cu"


def nvshmem_home() -> Path | None:
    """The NVSHMEM wheel's folder (``include/``, ``lib/``), or None where it is not installed."""
    try:
        import nvidia.nvshmem as wheel
    except ImportError:
        return None
    home = Path(list(wheel.__path__)[0])
    return home if (home / "include" / "nvshmem.h").exists() else None


def build_command(
    exe: Path, cuda_dir: Path, nvshmem: Path | None, arch: str = "sm_90"
) -> list[str]:
    """nvcc's command line: with NVSHMEM (``-rdc``, its two libraries) or the peer loops alone."""
    cmd = ["nvcc", "-O2", "-std=c++17", f"-arch={arch}", f"-I{cuda_dir}"]
    if nvshmem is None:
        return [*cmd, "-DXBENCH_NO_NVSHMEM", str(cuda_dir / SOURCE), "-o", str(exe)]
    lib = nvshmem / "lib"
    return [
        *cmd,
        "-rdc=true",
        f"-I{nvshmem / 'include'}",
        str(cuda_dir / SOURCE),
        "-o",
        str(exe),
        f"-L{lib}",
        "-l:libnvshmem_host.so.3",  # the wheel ships only the versioned name
        "-lnvshmem_device",
        "-Xlinker",
        f"-rpath,{lib}",
    ]


def build(exe: Path, cuda_dir: Path, *, with_nvshmem: bool = True, arch: str = "sm_90") -> Path:
    """Builds the program at ``exe``; one-line XbenchError when nvcc is missing or fails."""
    if shutil.which("nvcc") is None:
        raise XbenchError(
            "the device-initiated probe needs nvcc, and none is on PATH",
            "install the CUDA toolkit (or the nvidia-cuda-nvcc wheel) and put nvcc on PATH",
        )
    home = nvshmem_home() if with_nvshmem else None
    if with_nvshmem and home is None:
        raise XbenchError(
            "the device-initiated NVSHMEM probe needs NVSHMEM's headers and libraries",
            "pip install nvidia-nvshmem-cu13 (or -cu12), or build the peer loops alone",
        )
    done = subprocess.run(
        build_command(exe, cuda_dir, home, arch), capture_output=True, text=True, timeout=600
    )
    if done.returncode:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr[-200:])
        raise XbenchError(f"nvcc failed on {SOURCE}: {first.strip()}", "see nvcc's output above")
    return exe


def parse_output(text: str) -> list[dict]:
    """The program's JSON lines (results, its NVSHMEM line, errors); other lines skipped."""
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and ln.endswith("}")]
