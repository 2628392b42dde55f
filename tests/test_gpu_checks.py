"""What the GPU fabrics check before they trust a library, tested without a GPU: the MPI's own
CUDA-awareness answer (fakes of Open MPI's and MPICH's queries), the rank's GPU by UUID,
NVLink from NVML's peer-to-peer status (a fake NVML of an HGX node), and the --fabric preset
applied before MPI_Init."""

from __future__ import annotations

import ctypes
import json
import types
from pathlib import Path

import pytest

from xbench.errors import XbenchError
from xbench.fabric.mpi_device import ASSUME_ENV, cuda_aware_mpi, require_cuda_aware
from xbench.fabric.topology import label_pair
from xbench.host import _nvlink_peers, gpu_by_uuid
from xbench.ranks import MPICH_INIT_SEGMENT

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi
# what the MPIs name their node segments in /dev/shm (xbench/ranks.py says why they matter)
MPI_SEGMENTS = (Path(MPICH_INIT_SEGMENT).name, "sm_segment.", "vader_segment.")


class _CFunction:
    """A stand-in for a ctypes function: records argtypes/restype and the calls made."""

    def __init__(self, body):
        self.body, self.calls, self.argtypes, self.restype = body, [], None, None

    def __call__(self, *args):
        self.calls.append(args)
        return self.body(*args)


def _mpich(flag: int, rc: int = 0):
    def query(gpu_type, pointer):
        assert gpu_type == 0  # MPIX_GPU_SUPPORT_CUDA
        pointer._obj.value = flag
        return rc

    return _CFunction(query)


def _lookup(**symbols):
    return lambda name: symbols.get(name)


@pytest.mark.parametrize("answer", [0, 1])
def test_open_mpi_is_asked_with_mpix_query_cuda_support(answer):
    query = _CFunction(lambda: answer)
    supported, how = cuda_aware_mpi(_lookup(MPIX_Query_cuda_support=query))
    assert supported is bool(answer) and f"= {answer}" in how
    assert query.calls == [()] and query.restype is ctypes.c_int


@pytest.mark.parametrize("flag", [0, 1])
def test_mpich_is_asked_with_mpix_gpu_query_support(flag):
    query = _mpich(flag)
    supported, how = cuda_aware_mpi(_lookup(MPIX_GPU_query_support=query))
    assert supported is bool(flag) and "MPIX_GPU_query_support(CUDA)" in how
    assert query.argtypes == [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]


def test_a_failing_or_missing_query_is_unknown():
    assert cuda_aware_mpi(_lookup(MPIX_GPU_query_support=_mpich(1, rc=5)))[0] is None
    assert cuda_aware_mpi(_lookup())[0] is None


def test_refusals_are_one_line_and_name_the_way_out(monkeypatch):
    monkeypatch.delenv(ASSUME_ENV, raising=False)
    with pytest.raises(XbenchError) as no:
        require_cuda_aware(_lookup(MPIX_Query_cuda_support=_CFunction(lambda: 0)))
    assert "not CUDA-aware" in str(no.value) and "--device host" in str(no.value)
    with pytest.raises(XbenchError) as unknown:
        require_cuda_aware(_lookup())
    assert "cannot tell" in str(unknown.value) and ASSUME_ENV in str(unknown.value)
    assert "\n" not in str(no.value) + str(unknown.value)
    monkeypatch.setenv(ASSUME_ENV, "1")
    assert "assumed CUDA-aware" in require_cuda_aware(_lookup())
    yes = require_cuda_aware(_lookup(MPIX_Query_cuda_support=_CFunction(lambda: 1)))
    assert yes == "MPIX_Query_cuda_support() = 1"


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_installed_mpi_answers_its_own_query_in_a_child_that_leaves_nothing():
    """The real lookup against whatever MPI mpi4py loaded, asked as ``xbench env`` asks it,
    in a child that starts MPI on its own: the PyPI wheels (MPICH, Open MPI) export the
    query and are not built with CUDA, so they must answer no, not "cannot tell". Open MPI
    5's child left its 16 MiB segment in /dev/shm at every call, MPI_Finalize or not."""
    from xbench.capabilities import _cuda_aware_in_a_started_mpi

    def segments():
        return {p.name for p in Path("/dev/shm").glob("*") if p.name.startswith(MPI_SEGMENTS)}

    before = segments()
    supported, how = _cuda_aware_in_a_started_mpi()
    assert supported is False, how
    assert how.startswith(("MPIX_Query_cuda_support() = 0", "MPIX_GPU_query_support(CUDA) = 0"))
    assert segments() <= before


def test_gpu_by_uuid_not_by_ordinal():
    gpus = [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}]
    # under --gpu-bind a rank's only visible GPU is CUDA ordinal 0, NVML's index 1
    assert gpu_by_uuid(gpus, "bbbb")["index"] == 1  # torch reports the UUID without "GPU-"
    assert gpu_by_uuid(gpus, "GPU-aaaa")["index"] == 0
    assert gpu_by_uuid(gpus, "cccc") is None


def test_nvlink_from_nvml_p2p_status_on_an_hgx_node():
    """On HGX boards every NVLink's remote PCI id is an NVSwitch: only the P2P status says
    which GPUs a GPU reaches over NVLink."""
    nvml = types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_NVLINK=3,
        NVML_P2P_STATUS_OK=0,
        NVMLError=RuntimeError,
    )
    linked = {(0, 1), (1, 0)}  # GPU 2 hangs off PCIe only

    def status(a, b, index):
        assert index == 3
        return 0 if (a, b) in linked else 5

    nvml.nvmlDeviceGetP2PStatus = status
    uuids = ["GPU-a", "GPU-b", "GPU-c"]
    assert _nvlink_peers(nvml, 0, [0, 1, 2], uuids, 0) == ["GPU-b"]
    assert _nvlink_peers(nvml, 2, [0, 1, 2], uuids, 2) == []
    gpu = {"pci_bus_id": "00000000:18:00.0", "nvlink_peers": ["00000000:C1:00.0"]}  # a switch
    a = {"host": "n", "gpu": {**gpu, "uuid": "GPU-a", "nvlink_p2p": ["GPU-b"]}}
    b = {"host": "n", "gpu": {**gpu, "uuid": "GPU-b", "pci_bus_id": "00000000:2A:00.0"}}
    c = {"host": "n", "gpu": {**gpu, "uuid": "GPU-c", "pci_bus_id": "00000000:DB:00.0"}}
    assert label_pair(a, b) == "nvlink" and label_pair(b, a) == "nvlink"
    assert label_pair(a, c) == "same-node-pcie"


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_the_fabric_preset_is_applied_before_mpi_init(xbench, tmp_path):
    out = tmp_path / "p"
    r = xbench(
        "probe",
        "--np",
        "2",
        "-p",
        "latency",
        "--sizes",
        "8B",
        "--samples",
        "2",
        "--fabric",
        "tcp",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["preset_env"] == {"UCX_TLS": "tcp,cuda_copy,self"}
    assert meta["preset_applied"] == "before MPI_Init"


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("a:2\nb:1\n", [("a", 2), ("b", 1)]),  # MPICH Hydra
        ("a slots=2\nb slots=1 max_slots=4\n", [("a", 2), ("b", 1)]),  # Open MPI
        ("# nodes\na\n\nb:4  # fat node\n", [("a", None), ("b", 4)]),
    ],
)
def test_hosts_files_in_either_dialect(text, hosts):
    from xbench.fabric.launch import parse_hostfile, render_hostfile

    assert parse_hostfile(text) == hosts
    assert parse_hostfile(render_hostfile(hosts, hydra=True)) == hosts
    assert parse_hostfile(render_hostfile(hosts, hydra=False)) == hosts
    assert render_hostfile([("a", 2)], hydra=False) == "a slots=2\n"
    assert render_hostfile([("a", 2)], hydra=True) == "a:2\n"


@pytest.mark.parametrize("text", ["", "a:x\n", "a:0\n", ":3\n"])
def test_bad_hosts_files_are_one_line(text):
    from xbench.fabric.launch import parse_hostfile

    with pytest.raises(XbenchError) as err:
        parse_hostfile(text)
    assert "\n" not in str(err.value)


def test_the_nccl_rendezvous_is_a_routable_address():
    from xbench.fabric.nccl import rendezvous_host

    lo, eth = ("lo", "127.0.0.1"), ("eth0", "10.1.2.3")
    assert rendezvous_host(["n1", "n1"], [lo, eth], None) == "127.0.0.1"  # one host
    # Debian maps the hostname to 127.0.1.1: never hand that to another node
    assert rendezvous_host(["n1", "n2"], [lo, ("lo:1", "127.0.1.1"), eth], None) == "10.1.2.3"
    assert rendezvous_host(["n1", "n2"], [lo], "10.9.9.9") == "10.9.9.9"  # the user knows
    with pytest.raises(XbenchError) as err:
        rendezvous_host(["n1", "n2"], [lo], None)
    assert "XBENCH_RENDEZVOUS_ADDR" in str(err.value)


def test_interface_addresses_of_this_host():
    from xbench.fabric.nccl import interface_addresses

    found = interface_addresses()
    assert ("lo", "127.0.0.1") in found
    assert all(len(ip.split(".")) == 4 for _, ip in found)


@pytest.mark.mpi  # loads the MPI library: runs under every MPI
def test_the_query_is_asked_of_a_started_mpi_only():
    """MPICH's MPIX_GPU_query_support aborted ``xbench env`` on an H100 host: env does not
    start MPI. Unstarted, the query is not asked; env asks it in a child that starts MPI
    (the test of the installed MPI's answer)."""
    import subprocess
    import sys

    code = (
        "import mpi4py; mpi4py.rc.initialize = False; "
        "from xbench.fabric.mpi_device import cuda_aware_mpi; print(cuda_aware_mpi())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "(None, 'MPI is not started" in done.stdout
