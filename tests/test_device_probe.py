"""The device-initiated probe program (cuda/probe_device_main.cu) built with nvcc here, without
a GPU: the peer loops alone, and with NVSHMEM's wheel (relocatable device code linked against
libnvshmem_host and libnvshmem_device). Without a GPU the program must fail in one JSON line;
on a GPU, benchmarks/gpu_check.py runs it (its figures: docs/gpu-check.md)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from xbench.errors import XbenchError
from xbench.fabric import device_probe
from xbench.resources import cuda_dir

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@needs_nvcc
def test_the_peer_loops_build_and_fail_in_one_json_line_without_a_gpu(tmp_path):
    exe = device_probe.build(tmp_path / "probe", cuda_dir(), with_nvshmem=False)
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    lines = device_probe.parse_output(ran.stdout)
    if ran.returncode == 0:  # a GPU after all: every result checked
        assert lines and all(r.get("checked") for r in lines if "probe" in r)
        return
    assert ran.returncode == 2 and len(lines) == 1 and "error" in lines[0], ran.stdout


@needs_nvcc
def test_the_nvshmem_probe_links_against_the_wheels_device_library(tmp_path):
    home = device_probe.nvshmem_home()
    if home is None:
        pytest.skip("the nvidia-nvshmem-cu13 wheel is not installed (make install adds it)")
    cmd = device_probe.build_command(tmp_path / "probe", cuda_dir(), home)
    assert "-rdc=true" in cmd and "-lnvshmem_device" in cmd
    exe = device_probe.build(tmp_path / "probe", cuda_dir())
    linked = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    assert "libnvshmem_host.so.3" in linked and str(home / "lib") in linked
    # the device kernels are in the program's GPU code
    symbols = exe.read_bytes()
    for kernel in (b"nvshmem_put_loop", b"nvshmem_putsig_pingpong", b"nvshmem_put_bw"):
        assert kernel in symbols


def test_without_nvcc_the_build_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(XbenchError) as err:
        device_probe.build(tmp_path / "probe", cuda_dir(), with_nvshmem=False)
    assert "nvcc" in err.value.problem and "\n" not in str(err.value)
    assert not (tmp_path / "probe").exists()


def test_the_programs_lines_are_read_and_other_output_skipped():
    text = (
        "NVSHMEM banner\n"
        '{"probe": "peer_pingpong", "bytes": 8, "us": 0.37, "gpus": "0-1"}\n{"error": "x"}\n'
    )
    assert device_probe.parse_output(text) == [
        {"probe": "peer_pingpong", "bytes": 8, "us": 0.37, "gpus": "0-1"},
        {"error": "x"},
    ]


def _elf_symbols(path) -> dict[str, str]:
    """name -> section index ('UND' when undefined) of the ELF's global symbols (readelf)."""
    listing = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True)
    symbols = {}
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[4] == "GLOBAL":  # the visibility may hold spaces
            symbols[fields[-1]] = fields[-2]
    return symbols


@needs_nvcc
@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not on PATH")
def test_the_kernels_cubin_links_nvshmems_device_state_and_is_cached(tmp_path, monkeypatch):
    """What --initiator device loads: probe_device.cu's kernels and NVSHMEM's device
    library in one cubin, nothing left undefined but what the driver provides."""
    if device_probe.nvshmem_home() is None:
        pytest.skip("the nvidia-nvshmem-cu13 wheel is not installed (make install adds it)")
    monkeypatch.setenv("XBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cubin = device_probe.build_cubin(cuda_dir(), "sm_90")
    (tmp_path / "k.cubin").write_bytes(cubin)
    symbols = _elf_symbols(tmp_path / "k.cubin")
    from xbench.fabric.nvshmem_device import KERNELS

    for name in (*KERNELS, "nvshmemi_device_state_d"):  # the state culibrary_init fills
        assert symbols.get(name, "UND") != "UND", name
    undefined = {name for name, section in symbols.items() if section == "UND"}
    assert undefined <= {"vprintf", ".nv.reservedSmem.offset0"}, undefined
    # a second build is the cached one: nvcc is asked its version, nothing compiled
    ran = []
    real_run = subprocess.run
    monkeypatch.setattr(
        device_probe.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or real_run(cmd, **kw)
    )
    assert device_probe.build_cubin(cuda_dir(), "sm_90") == cubin
    assert ran == [["nvcc", "--version"]]


def test_without_nvcc_the_kernels_cubin_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(XbenchError) as err:
        device_probe.build_cubin(cuda_dir())
    assert "nvcc" in err.value.problem and "--initiator device" in err.value.problem


BUILD_ON_EACH_NODE = """
import sys
from pathlib import Path
from mpi4py import MPI
from xbench.errors import XbenchError
from xbench.fabric.nvshmem_device import _built_on_each_node
try:
    _built_on_each_node(MPI.COMM_WORLD, "sm_90")
except XbenchError as exc:  # a file a rank: the launcher may interleave the ranks' stdout
    Path(sys.argv[1], f"rank{MPI.COMM_WORLD.Get_rank()}.txt").write_text(exc.problem)
"""


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_a_build_that_fails_on_a_node_stops_each_of_its_ranks_with_the_same_line(tmp_path):
    """One rank a node builds while the others wait; its failure (no nvcc here) reaches
    every rank as its one line, so none waits forever for a cubin."""
    import sys

    from conftest import BIN

    script = tmp_path / "build.py"
    script.write_text(BUILD_ON_EACH_NODE)
    env = {**os.environ, "PATH": str(tmp_path), "XBENCH_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "2", sys.executable, str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        said = (tmp_path / f"rank{rank}.txt").read_text()
        assert said == "--initiator device builds its kernels with nvcc, and none is on PATH"
