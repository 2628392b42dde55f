"""The device-initiated probe program (cuda/probe_device_main.cu) built with nvcc here, without
a GPU: the peer loops alone, and with NVSHMEM's wheel (relocatable device code linked against
libnvshmem_host and libnvshmem_device). Without a GPU the program must fail in one JSON line;
on a GPU, benchmarks/gpu_check.py runs it (its figures: docs/measurements.md)."""

from __future__ import annotations

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
    text = 'NVSHMEM banner\n{"probe": "peer_pingpong", "bytes": 8, "us": 0.37}\n{"error": "x"}\n'
    assert device_probe.parse_output(text) == [
        {"probe": "peer_pingpong", "bytes": 8, "us": 0.37},
        {"error": "x"},
    ]
