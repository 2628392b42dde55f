"""Probe buffers are mapped early, before the rank's heavier libraries, and reused across pairs."""

import dataclasses
import json
import subprocess
import sys

import pytest

from xbench.fabric import transport
from xbench.fabric.transport import Pair, Transport, host_buffer_sizes, reserve_host_buffers
from xbench.probe.patterns import SweepSpec, buffer_plan


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
