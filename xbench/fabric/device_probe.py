"""The device-initiated probes built with nvcc: ``cuda/probe_device_main.cu`` as a program
(``make gpu-check``), and ``cuda/probe_device.cu``'s kernels as a cubin that ``xbench probe
--transport nvshmem --initiator device`` loads (``build_cubin``).

The GPU moves the bytes and times itself (``%globaltimer``), so no host overhead enters the
figure: NVSHMEM put, put-with-signal ping-pong and block-wide put bandwidth, and the peer
loops (two kernels bumping each other's flag, a grid copying between buffers). Built as
NVSHMEM's own perftest programs are: relocatable device code linked against the headers,
``libnvshmem_host`` and ``libnvshmem_device`` of the ``nvidia-nvshmem-cu12``/``-cu13``
wheel; without that wheel, the peer loops alone. The program prints one JSON object a line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from xbench.errors import XbenchError

# Who issues each put of the device-initiated ping-pong (--put-scope), and the threads of
# the block that does: XBENCH_SCOPE_* in cuda/probe_device.cu, in this order (a scope's
# place is its code for the kernel); the default is the second
PUT_SCOPES = {"thread": 1, "warp": 32, "block": 512}

SOURCE = "probe_device_main.cu"
KERNELS_SOURCE = "probe_device.cu"  # the kernels alone, for xbench probe to load


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
    _nvcc(build_command(exe, cuda_dir, home, arch), SOURCE)
    return exe


def _nvcc(cmd: list[str], source: str) -> None:
    """One nvcc step; its first error line as a one-line XbenchError when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr[-200:])
        raise XbenchError(
            f"nvcc failed on {source}: {first.strip()}",
            f"run it by hand to see the whole log: {' '.join(cmd)}",
        )


def cubin_command(
    obj: Path, cubin: Path, cuda_dir: Path, nvshmem: Path, arch: str
) -> list[list[str]]:
    """nvcc's two steps to one loadable cubin of the kernels: relocatable device code, then a
    device link against ``libnvshmem_device.a`` (whose state NVSHMEM sets when it initialises
    the loaded library)."""
    compile_ = ["nvcc", "-O2", "-std=c++17", f"-arch={arch}", "-rdc=true", "-c"]
    return [
        [*compile_, "-DXBENCH_WITH_NVSHMEM", f"-I{cuda_dir}", f"-I{nvshmem / 'include'}",
         str(cuda_dir / KERNELS_SOURCE), "-o", str(obj)],
        ["nvcc", f"-arch={arch}", "-dlink", "-cubin", str(obj), f"-L{nvshmem / 'lib'}",
         "-lnvshmem_device", "-o", str(cubin)],
    ]  # fmt: skip


def _nvcc_version() -> str:
    done = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout


def build_cubin(cuda_dir: Path, arch: str = "sm_90") -> bytes:
    """``cuda/probe_device.cu``'s kernels linked with NVSHMEM's device library, as one cubin
    for ``xbench probe --transport nvshmem --initiator device`` to load. Cached (keyed by the
    sources, nvcc's version, the device library and the arch): nvcc takes some 10 s."""
    from xbench.native import cache_dir

    if shutil.which("nvcc") is None:
        raise XbenchError(
            "--initiator device builds its kernels with nvcc, and none is on PATH",
            "install the CUDA toolkit (or the nvidia-cuda-nvcc wheel) and put nvcc on PATH",
        )
    home = nvshmem_home()
    if home is None:
        raise XbenchError(
            "--initiator device links NVSHMEM's device library, and its wheel is not installed",
            "pip install nvidia-nvshmem-cu13 (or -cu12, as nvshmem4py's)",
        )
    digest = hashlib.sha256()
    for name in (KERNELS_SOURCE, "common.cuh"):
        digest.update(name.encode() + (cuda_dir / name).read_bytes())
    digest.update(_nvcc_version().encode() + arch.encode())
    digest.update((home / "lib" / "libnvshmem_device.a").read_bytes())
    target = cache_dir() / f"probe_device-nvshmem-{arch}-{digest.hexdigest()[:16]}.cubin"
    if target.exists():
        return target.read_bytes()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, cubin = Path(tmp) / "probe_device.o", Path(tmp) / "probe_device.cubin"
        for cmd in cubin_command(obj, cubin, cuda_dir, home, arch):
            _nvcc(cmd, KERNELS_SOURCE)
        os.replace(cubin, target)  # whole or not at all: ranks on one node may race
    return target.read_bytes()


def parse_output(text: str) -> list[dict]:
    """The program's JSON lines (results, its NVSHMEM line, errors); other lines skipped."""
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{") and ln.endswith("}")]
