"""Probe buffers are mapped early, before the rank's heavier libraries, and reused across pairs."""

import dataclasses
import json
import subprocess
import sys

import pytest

from xbench.fabric import transport
from xbench.fabric.transport import Pair, Transport, host_buffer_sizes, reserve_host_buffers
from xbench.probe.patterns import SweepSpec, buffer_plan

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


class HostBuffersOnly(Transport):
    """A transport that only owns buffers: the loops are not what these tests look at."""

    def exchange(self, send_n, recv_n, iters):
        raise NotImplementedError

    def window(self, n, window, iters):
        raise NotImplementedError

    def biwindow(self, n, window, iters):
        raise NotImplementedError

    def fetch(self, mode, k, block, iters):
        raise NotImplementedError


PAIR = Pair(comm=None, me=0, world_ranks=(0, 1), hosts=("h", "h"))
SPEC = SweepSpec(
    patterns=("latency", "gather"), sizes=(8, 1 << 20), blocks=(1, 4), block_bytes=4096
)


@pytest.fixture(autouse=True)
def empty_reservation(monkeypatch):
    monkeypatch.setattr(transport, "_reserved", {})


def addresses(t: Transport) -> set[int]:
    return {b.ctypes.data for b in (t.sbuf, t.rbuf, t.cache, t.staging)}


def test_plan_names_every_buffer_a_transport_maps():
    plan = buffer_plan(SPEC)
    assert (plan.message_bytes, plan.blocks, plan.block_bytes) == (1 << 20, 4, 4096)
    assert host_buffer_sizes(plan) == [1 << 20, 1 << 20, 8 * 4096, 4 * 4096]


def test_transport_takes_the_reserved_buffers_and_writes_them():
    plan = buffer_plan(SPEC)
    reserve_host_buffers(plan)
    reserved = {b.ctypes.data for bufs in transport._reserved.values() for b in bufs}
    t = HostBuffersOnly(PAIR, plan)
    assert addresses(t) == reserved
    assert not any(transport._reserved.values())  # all handed out
    assert t.sbuf[0] == 0x5A and t.rbuf[-1] == 0xA5 and t.cache[123] == 0x33
    assert t.sbuf.ctypes.data % 4096 == 0


def test_next_pair_reuses_the_returned_buffers():
    plan = buffer_plan(SPEC)
    reserve_host_buffers(plan)
    first = HostBuffersOnly(PAIR, plan)
    kept = addresses(first)
    first.return_buffers()
    second = HostBuffersOnly(dataclasses.replace(PAIR, me=1), plan)
    assert addresses(second) == kept
    assert second.sbuf[0] == 0x5B  # rewritten for the new rank


def test_without_a_reservation_buffers_are_mapped_on_demand():
    t = HostBuffersOnly(PAIR, buffer_plan(SPEC))
    assert t.sbuf.nbytes == 1 << 20 and t.staging.nbytes == 4 * 4096


def test_worker_reserves_before_loading_pyarrow():
    config = json.dumps({"device": "host", "sweep": dataclasses.asdict(SPEC)})
    code = (
        "import sys; from xbench.probe import worker; from xbench.fabric import transport; "
        f"worker.reserve_buffers({config!r}); "
        "assert 'pyarrow' not in sys.modules and 'pandas' not in sys.modules, 'loaded early'; "
        "print(sorted(transport._reserved))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(sorted({1 << 20, 8 * 4096, 4 * 4096}))


class _FakeCudaTorch:
    """What a device transport's flush asks of torch: the L2's size, one device buffer
    twice that, written, then waited for (no GPU here)."""

    uint8 = "uint8"

    def __init__(self):
        self.asked: list = []
        torch = self

        class Buffer:
            def add_(self, value):
                torch.asked.append(("add_", value))

        class Cuda:
            @staticmethod
            def current_device():
                return 0

            @staticmethod
            def get_device_properties(index):
                torch.asked.append(("properties", index))
                return type("Props", (), {"L2_cache_size": 50 * 2**20})()

            @staticmethod
            def synchronize():
                torch.asked.append(("synchronize",))

        self.cuda = Cuda
        self._buffer = Buffer

    def empty(self, n, dtype, device):
        self.asked.append(("empty", n, dtype, device))
        return self._buffer()


class _Barrier:
    def __init__(self, log):
        self.log = log

    def Barrier(self):
        self.log.append(("barrier",))


def test_offcache_on_a_device_transport_flushes_the_gpus_l2_not_the_hosts(monkeypatch):
    from xbench.fabric import gpu

    fake = _FakeCudaTorch()
    monkeypatch.setattr(gpu, "torch_module", lambda: fake)

    class OnDevice(HostBuffersOnly):
        device = "cuda"

        def exchange(self, send_n, recv_n, iters):
            fake.asked.append(("exchange", send_n))
            return 1e-6

    t = OnDevice(dataclasses.replace(PAIR, comm=_Barrier(fake.asked)), buffer_plan(SPEC))
    assert t.exchange_offcache(64, 2) == pytest.approx(2e-6)
    flush = [("add_", 1), ("synchronize",), ("barrier",), ("exchange", 64)]
    assert fake.asked == [
        ("properties", 0),
        ("empty", 2 * 50 * 2**20, "uint8", "cuda"),  # twice the L2, allocated once
        *flush,
        *flush,
    ]


def test_offcache_on_a_host_transport_writes_a_line_of_twice_the_llc(monkeypatch):
    from xbench import host

    monkeypatch.setattr(host, "llc_bytes", lambda: 1 << 16)
    log = []

    class OnHost(HostBuffersOnly):
        def exchange(self, send_n, recv_n, iters):
            log.append(("exchange", send_n))
            return 1e-6

    t = OnHost(dataclasses.replace(PAIR, comm=_Barrier(log)), buffer_plan(SPEC))
    t.exchange_offcache(8, 3)
    assert t._flush.nbytes == 2 << 16 and set(t._flush[::64]) == {3}  # every line, 3 times
    assert log == [("barrier",), ("exchange", 8)] * 3
