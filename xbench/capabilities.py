"""What this machine can run: one check per capability, each with the reason when it can't.

Checks never raise; each returns a :class:`Capability`. ``xbench env`` prints them and
later commands use the same checks to explain why a path is unavailable.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from xbench.errors import XbenchError
from xbench.ranks import clean_library, mpi_library, singleton_environment


@dataclass(frozen=True)
class Capability:
    name: str
    ok: bool
    detail: str


def loaded_mpi_library(whole: bool = False) -> str | None:
    """The version line of the MPI library mpi4py loads here (``whole``: all its lines, e.g.
    MPICH's device line), read without starting MPI; None where none loads."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # reading the version must not start MPI
        mpi4py.rc.finalize = False
        from mpi4py import MPI

        if whole:
            return clean_library(MPI.Get_library_version())
        return mpi_library(MPI)
    except Exception:  # noqa: BLE001 - any failure here means "no usable MPI"
        return None


def check_mpi() -> Capability:
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # reading the version must not start MPI
        mpi4py.rc.finalize = False
        from mpi4py import MPI

        lib = mpi_library(MPI)
        return Capability("MPI", True, f"{lib} (mpi4py {mpi4py.__version__})")
    except Exception as exc:  # noqa: BLE001 - any failure here means "no usable MPI"
        return Capability("MPI", False, f"mpi4py cannot load an MPI library: {exc}")


def check_mpiexec() -> Capability:
    from xbench.fabric.launch import find_mpiexec, mpiexec_missing

    path = find_mpiexec()
    return Capability("mpiexec", path is not None, path or "; ".join(mpiexec_missing()))


def check_cache() -> Capability:
    from xbench.native import cache_dir

    try:
        return Capability("cache folder", True, f"{cache_dir()} (compiled loops and kernels)")
    except XbenchError as exc:
        return Capability("cache folder", False, f"{exc}; nothing can be compiled")


def check_compiled_loop() -> Capability:
    from xbench.fabric.cloop import LoopUnavailable, build_loops, find_mpicc

    try:
        path = build_loops()
        return Capability("compiled probe loop", True, f"built with {find_mpicc()} -> {path.name}")
    except XbenchError as exc:
        return Capability("compiled probe loop", False, str(exc))
    except (LoopUnavailable, OSError) as exc:
        return Capability(
            "compiled probe loop", False, f"{exc}; probes fall back to the Python loop"
        )


def check_torch() -> Capability:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return Capability("torch", False, f"not importable: {exc}")
    if torch.cuda.is_available():
        return Capability(
            "torch", True, f"{torch.__version__}, device cuda ({torch.cuda.get_device_name(0)})"
        )
    reason = (
        "CPU build"
        if torch.version.cuda is None
        else f"CUDA {torch.version.cuda} build, but no usable GPU/driver"
    )
    return Capability(
        "torch",
        True,
        f"{torch.__version__}, device cpu ({reason}; {torch.get_num_threads()} threads)",
    )


def check_nvml() -> Capability:
    from xbench.host import gpu_topology

    gpus = gpu_topology()
    if gpus:
        names = ", ".join(f"{g['index']}: {g['name']}" for g in gpus)
        return Capability(
            "GPUs (NVML)", True, f"{len(gpus)} GPU(s), driver {gpus[0]['driver']}: {names}"
        )
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return Capability("GPUs (NVML)", False, f"no NVIDIA driver: {type(exc).__name__}")
    return Capability("GPUs (NVML)", False, "driver present but no GPUs")


def check_nvrtc() -> Capability:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return Capability("NVRTC", False, f"nvrtcVersion failed: {err}")
        return Capability(
            "NVRTC", True, f"NVRTC {major}.{minor}: compiles CUDA C++ for sm_90 without a GPU"
        )
    except Exception as exc:  # noqa: BLE001 - missing wheel or library
        return Capability("NVRTC", False, f"unavailable: {exc}")


def check_cuda_driver() -> Capability:
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return Capability(
                "CUDA driver",
                False,
                f"cuInit failed ({err.name}): no GPU here; GPU kernels and device transports cannot run",
            )
        err, count = driver.cuDeviceGetCount()
        return Capability("CUDA driver", True, f"{count} device(s)")
    except Exception as exc:  # noqa: BLE001 - libcuda absent raises on load
        return Capability(
            "CUDA driver",
            False,
            f"libcuda not loadable ({type(exc).__name__}): no GPU here; GPU kernels and device transports cannot run",
        )


def check_tcp() -> Capability:
    import socket

    names = [n for _, n in socket.if_nameindex()]
    return Capability("transport tcp", True, f"sockets; interfaces: {', '.join(names)}")


def check_cpu_bf16() -> Capability:
    from xbench.kernels import cpu_bf16

    if not cpu_bf16.cpu_has_bf16():
        return Capability(
            "CPU bf16 attention kernel",
            False,
            "no avx512_bf16 on this CPU: bf16 attention uses fp32 products",
        )
    try:
        ok = cpu_bf16.load() is not None
    except XbenchError as exc:
        return Capability("CPU bf16 attention kernel", False, str(exc))
    except ImportError as exc:  # it runs on torch's OpenMP threads
        return Capability("CPU bf16 attention kernel", False, f"needs torch: {exc}")
    return Capability(
        "CPU bf16 attention kernel",
        ok,
        "AVX512-BF16 partial attention, both products fp32-accumulated, on torch's OpenMP threads (torch backend, >= 4 query rows)"
        if ok
        else "gcc could not build it, or torch brings another OpenMP runtime: bf16 attention uses fp32 products",
    )


def check_kernel_backends() -> list[Capability]:
    """Each kernel backend: can it run here, and if not, why."""
    from xbench.kernels import backend as kernel_backends
    from xbench.kernels.cuda_backend import nvrtc_status

    caps = []
    for name in kernel_backends.BACKENDS:
        try:
            kernel_backends.get_backend(name)
            detail = "runs here"
            ok = True
        except kernel_backends.BackendUnavailable as exc:
            detail, ok = exc.problem, False
        except Exception as exc:  # noqa: BLE001 - env reports every backend, whatever breaks
            detail, ok = f"fails to load: {type(exc).__name__}: {exc}".splitlines()[0], False
        if name == "cuda-ref":
            detail += f"; NVRTC {nvrtc_status()}"
        caps.append(Capability(f"kernel backend {name}", ok, detail))
    return caps


def _ib_devices() -> list[str]:
    from pathlib import Path

    return sorted(p.name for p in Path("/sys/class/infiniband").glob("*"))


def _link_layers() -> set[str]:
    from pathlib import Path

    layers = set()
    for port in Path("/sys/class/infiniband").glob("*/ports/*/link_layer"):
        try:
            layers.add(port.read_text().strip())
        except OSError:
            continue
    return layers


def _gpu_stack() -> tuple[int, bool, bool, bool, str | None, bool]:
    """(CUDA GPUs, torch's gloo, torch's NCCL, nvshmem4py importable, the CUDA version torch
    was built for, torch installed) on this machine."""
    cuda, has_torch = None, importlib.util.find_spec("torch") is not None
    try:
        import torch

        cuda = torch.version.cuda

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        import torch.distributed as dist

        gloo = dist.is_available() and dist.is_gloo_available()
        nccl = dist.is_available() and dist.is_nccl_available()
    except Exception:  # noqa: BLE001 - torch absent or broken: neither backend runs
        gpus, gloo, nccl = 0, False, False
    try:
        import nvshmem.core  # noqa: F401

        nvshmem = True
    except Exception:  # noqa: BLE001
        nvshmem = False
    return gpus, gloo, nccl, nvshmem, cuda, has_torch


def _transports(
    mpi_ok: bool,
    gpus: int,
    gloo: bool,
    nccl: bool,
    nvshmem: bool,
    cuda: str | None,
    has_torch: bool,
) -> list:
    """Per transport: can this machine run it, and if not, why."""
    from xbench.fabric.nvshmem import install_hint

    no_gpu = "no CUDA GPU here"
    no_torch = "needs torch, which is not installed here"
    if nccl and gpus:
        nccl_why = "NCCL on GPUs"
    elif not has_torch:
        nccl_why = no_torch
    else:
        nccl_why = "torch is a CPU build without NCCL" if not nccl else no_gpu
    nv_why = (
        "nvshmem4py present"
        if nvshmem and gpus
        else (f"nvshmem4py not installed ({install_hint(cuda)})" if not nvshmem else no_gpu)
    )
    return [
        Capability(
            "probe mpi (host buffers)",
            mpi_ok,
            "runs: MPI point-to-point, compiled loop" if mpi_ok else "no usable MPI",
        ),
        _cuda_aware_capability(mpi_ok, gpus, no_gpu),
        Capability("probe tcp", True, "plain sockets between ranks"),
        Capability(
            "probe nccl --backend gloo",
            gloo,
            "torch.distributed gloo: the nccl transport's code path on CPUs"
            if gloo
            else (no_torch if not has_torch else "torch has no gloo backend"),
        ),
        Capability("probe nccl --backend nccl", bool(nccl and gpus), nccl_why),
        Capability("probe nvshmem", bool(nvshmem and gpus), nv_why),
        _device_initiated_capability(nvshmem, gpus),
    ]


def _device_initiated_capability(nvshmem: bool, gpus: int) -> Capability:
    """--initiator device: nvshmem4py on a GPU, and nvcc with NVSHMEM's device library to
    build the kernels that post the puts."""
    from xbench.fabric.device_probe import nvshmem_home

    name = "probe nvshmem device"
    missing = [
        what
        for what, there in (
            ("nvcc", shutil.which("nvcc") is not None),
            ("NVSHMEM's device library (nvidia-nvshmem wheel)", nvshmem_home() is not None),
        )
        if not there
    ]
    if missing:
        return Capability(
            name, False, f"--initiator device builds its kernels with {' and '.join(missing)}"
        )
    if not (nvshmem and gpus):
        return Capability(name, False, "--initiator device: needs what probe nvshmem needs")
    return Capability(
        name, True, "--initiator device: GPU kernels post the puts (IBGDA on InfiniBand)"
    )


def _fabrics(mpi_ok: bool, gpus: int, nvshmem: bool) -> list:
    """Per fabric: can this machine reach it, and if not, why."""
    no_gpu = "no CUDA GPU here"
    ib = _ib_devices()
    layers = _link_layers()
    ib_why = (
        f"HCAs {', '.join(ib)}"
        if "InfiniBand" in layers
        else "no InfiniBand HCA in /sys/class/infiniband"
    )
    roce_why = (
        f"RoCE ports on {', '.join(ib)}"
        if "Ethernet" in layers
        else "no RoCE port (Ethernet link layer) in /sys/class/infiniband"
    )
    return [
        Capability("fabric shm", mpi_ok, "local ranks over shared memory"),
        Capability("fabric tcp", True, "any IP interface (--tcp-interface)"),
        Capability(
            "fabric nvlink",
            gpus >= 2,
            f"{gpus} GPU(s)" if gpus >= 2 else "needs 2+ GPUs joined by NVLink; " + no_gpu,
        ),
        Capability("fabric ib", "InfiniBand" in layers, ib_why),
        Capability(
            "fabric ibgda",
            "InfiniBand" in layers and nvshmem and gpus > 0,
            "needs an InfiniBand HCA, a GPU and NVSHMEM with IBGDA"
            if not ("InfiniBand" in layers and nvshmem and gpus)
            else "IBGDA possible",
        ),
        Capability("fabric roce", "Ethernet" in layers, roce_why),
    ]


def check_transports_and_fabrics() -> list[Capability]:
    """Per transport and per fabric: can this machine run it, and if not, why."""
    mpi_ok = check_mpi().ok
    gpus, gloo, nccl, nvshmem, cuda, has_torch = _gpu_stack()
    return _transports(mpi_ok, gpus, gloo, nccl, nvshmem, cuda, has_torch) + _fabrics(
        mpi_ok, gpus, nvshmem
    )


def _cuda_aware_capability(mpi_ok: bool, gpus: int, no_gpu: str) -> Capability:
    """The MPI's own answer to whether it takes device pointers (never assumed)."""
    name = "probe mpi --device cuda"
    if not gpus:
        return Capability(name, False, f"{no_gpu}; needs a CUDA-aware MPI too")
    if not mpi_ok:
        return Capability(name, False, "no MPI")
    supported, how = _cuda_aware_in_a_started_mpi()
    return Capability(name, bool(supported), f"CUDA-aware MPI: {how}")


def _cuda_aware_in_a_started_mpi() -> tuple[bool | None, str]:
    """The query asked in a child process that starts MPI, as a rank would: MPICH's
    ``MPIX_GPU_query_support`` aborts a process that has not called ``MPI_Init`` (it did so
    to ``xbench env`` on an H100 host), and ``env`` itself does not start MPI."""
    code = (
        "import json; from mpi4py import MPI; "
        "from xbench.fabric.mpi_device import cuda_aware_mpi; "
        "print(json.dumps(cuda_aware_mpi()))"
    )
    try:
        with singleton_environment() as env:  # (Open MPI's singleton left 16 MiB a call)
            done = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                env=env,
            )
    except subprocess.TimeoutExpired:
        return None, "the query did not answer within 60 s in a process that started MPI"
    try:
        supported, how = json.loads(done.stdout.strip().splitlines()[-1])
        return supported, how
    except (ValueError, IndexError, TypeError):
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return None, f"the query failed in a process that started MPI: {last[:120]}"


def all_capabilities() -> list[Capability]:
    caps = [
        Capability("python", True, f"{platform.python_version()} on {platform.machine()}"),
        check_mpi(),
        check_mpiexec(),
        check_cache(),
        check_compiled_loop(),
        check_tcp(),
        check_torch(),
        check_nvml(),
        check_cuda_driver(),
        check_nvrtc(),
        Capability(
            "nvcc",
            shutil.which("nvcc") is not None,
            shutil.which("nvcc") or "not on PATH (not needed: NVRTC compiles the kernels)",
        ),
        check_cpu_bf16(),
        *check_kernel_backends(),
        *check_transports_and_fabrics(),
    ]
    return caps
