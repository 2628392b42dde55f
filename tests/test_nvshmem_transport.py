"""The nvshmem transport against a fake nvshmem4py that records every call's bytes, so the
whole-buffer put (every size moving the largest size's bytes) cannot come back. Without a
GPU: symmetric buffers are CPU tensors and the timer is the host clock."""

from __future__ import annotations

import types

import pytest
import torch

from xbench.fabric import nvshmem as nv_transport
from xbench.fabric.gpu import DeviceTimer
from xbench.fabric.transport import Pair, host_buffer_sizes
from xbench.probe.patterns import SweepSpec, buffer_plan

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


class FakeNvshmem:
    """nvshmem.core (interop.torch allocation, finalize) and nvshmem.bindings, recording."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.allocated: list[int] = []
        self.freed: list[int] = []
        fake = self

        class Interop:
            @staticmethod
            def bytetensor(shape, dtype=None):
                fake.allocated.append(shape[0])
                return torch.zeros(shape, dtype=torch.uint8)

            @staticmethod
            def tensor(shape, dtype=None):
                fake.allocated.append(shape[0] * torch.tensor([], dtype=dtype).element_size())
                return torch.full(shape, 7, dtype=dtype)  # not zero: the transport must zero it

            @staticmethod
            def free_tensor(t):
                fake.freed.append(t.numel() * t.element_size())

        self.core = types.SimpleNamespace(
            interop=types.SimpleNamespace(torch=Interop),
            finalize=lambda: fake.calls.append(("finalize",)),
        )
        self.bindings = types.SimpleNamespace(
            putmem_signal_on_stream=lambda d, s, n, sig, val, op, pe, st: fake.calls.append(
                ("put_signal", n, val, op, pe)
            ),
            putmem_nbi_on_stream=lambda d, s, n, pe, st: fake.calls.append(("put_nbi", n, pe)),
            quiet_on_stream=lambda st: fake.calls.append(("quiet",)),
            signal_op_on_stream=lambda sig, val, op, pe, st: fake.calls.append(
                ("signal", val, op, pe)
            ),
            signal_wait_until_on_stream=lambda sig, cmp, val, st: fake.calls.append(
                ("wait", cmp, val)
            ),
        )


class _Comm:
    def __init__(self):
        self.barriers = 0

    def Barrier(self):
        self.barriers += 1


@pytest.fixture
def world(monkeypatch):
    fake = FakeNvshmem()
    plan = buffer_plan(SweepSpec(patterns=("latency", "bandwidth"), sizes=(8, 4096, 1 << 20)))
    nv_transport.NvshmemTransport._world = nv_transport.allocate_symmetric(
        fake.core, fake.bindings, host_buffer_sizes(plan)
    )
    monkeypatch.setattr(nv_transport.NvshmemTransport, "_stream", staticmethod(lambda: 0))
    monkeypatch.setattr(nv_transport.NvshmemTransport, "_sync", staticmethod(lambda: None))
    yield fake, plan
    nv_transport.NvshmemTransport._world = {}


def _transport(plan, me: int, comm=None):
    pair = Pair(comm or _Comm(), me, (3, 5), ("h", "h"))
    t = nv_transport.NvshmemTransport(pair, plan)
    t.timer = DeviceTimer(False)
    return t


def test_every_pe_allocates_the_same_buffers_and_a_zeroed_signal(world):
    fake, plan = world
    sizes = [max(n, 1) for n in host_buffer_sizes(plan)]
    assert fake.allocated == [*sizes, 8]  # the four buffers, then the 8-byte signal word
    t = _transport(plan, 0)
    assert t.signal.item() == 0  # zeroed at allocation (the fake's memory held 7)
    t.signal.fill_(7)  # what a previous pair's last signal leaves
    t.connect()
    assert t.signal.item() == 0 and t.pair.comm.barriers == 1


@pytest.mark.parametrize("size", [8, 4096, 1 << 20])
def test_latency_puts_exactly_the_message_with_its_signal(world, size):
    fake, plan = world
    initiator = _transport(plan, 0)
    initiator.connect()
    initiator.exchange(size, size, 3)
    puts = [c for c in fake.calls if c[0] == "put_signal"]
    assert puts == [("put_signal", size, k, nv_transport.SIGNAL_SET, 5) for k in (1, 2, 3)]
    waits = [c for c in fake.calls if c[0] == "wait"]
    assert waits == [("wait", nv_transport.CMP_GE, k) for k in (1, 2, 3)]
    assert [c[0] for c in fake.calls] == ["put_signal", "wait"] * 3  # put, then the answer


def test_the_responder_waits_then_answers_with_its_own_count(world):
    fake, plan = world
    responder = _transport(plan, 1)
    responder.connect()
    responder.exchange(8, 1152, 2)
    assert [c[:3] if c[0] == "put_signal" else c for c in fake.calls] == [
        ("wait", nv_transport.CMP_GE, 1),
        ("put_signal", 1152, 1),
        ("wait", nv_transport.CMP_GE, 2),
        ("put_signal", 1152, 2),
    ]
    assert all(c[4] == 3 for c in fake.calls if c[0] == "put_signal")  # to the peer's PE


def test_windowed_bandwidth_puts_the_window_then_one_signal(world):
    fake, plan = world
    t = _transport(plan, 0)
    t.connect()
    t.window(4096, 64, 2)
    kinds = [c[0] for c in fake.calls]
    assert kinds == (["put_nbi"] * 64 + ["quiet", "signal", "wait"]) * 2
    assert {c[1] for c in fake.calls if c[0] == "put_nbi"} == {4096}
    assert [c[1] for c in fake.calls if c[0] == "signal"] == [1, 2]


def test_a_second_pair_starts_from_zero(world):
    fake, plan = world
    first = _transport(plan, 0)
    first.connect()
    first.exchange(8, 8, 2)
    second = _transport(plan, 0)
    second.connect()
    fake.calls.clear()
    second.exchange(8, 8, 1)
    assert fake.calls[0][:3] == ("put_signal", 8, 1) and fake.calls[1] == ("wait", 5, 1)


def test_teardown_frees_every_buffer_and_finalizes_once(world, monkeypatch):
    fake, plan = world
    monkeypatch.setattr(
        nv_transport,
        "torch_module",
        lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None)),
    )
    comm = _Comm()
    nv_transport.NvshmemTransport.teardown_world(comm)
    assert sorted(fake.freed) == sorted(fake.allocated)
    assert fake.calls.count(("finalize",)) == 1 and comm.barriers == 1
    nv_transport.NvshmemTransport.teardown_world(comm)  # a second call does nothing
    assert fake.calls.count(("finalize",)) == 1
