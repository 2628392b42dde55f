"""The nvshmem transport against a fake nvshmem4py that records every call's bytes, so the
whole-buffer put (every size moving the largest size's bytes) cannot come back. Without a
GPU: symmetric buffers are CPU tensors and the timer is the host clock."""

from __future__ import annotations

import ctypes
import types

import numpy as np
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


@pytest.mark.parametrize(
    "cuda, wheel",
    [("12.8", "nvshmem4py-cu12 on"), ("13.0", "nvshmem4py-cu13 on"), (None, "-cu12 or")],
)
def test_the_install_hint_names_the_wheel_of_torchs_cuda(cuda, wheel):
    """nvshmem4py ships one wheel per CUDA major version; the other one does not load."""
    hint = nv_transport.install_hint(cuda)
    assert hint.startswith("pip install nvshmem4py") and wheel in hint
    if cuda:
        assert f"CUDA {cuda.split('.')[0]}" in hint


# ----- the same transport posted by GPU kernels (--initiator device) -----


class FakeKernels:
    """cuda.core's launch of cuda/probe_device.cu's kernels, as their code would act on the
    arguments given (CPU memory here): a ping-pong's bytes and last count land at the peer's
    addresses and its span in the elapsed word; a stream's bytes land. Every launch recorded."""

    SPAN_NS = 12_345

    def __init__(self):
        self.launches: list[tuple] = []

    def __call__(self, kernel, blocks, threads, *args):
        self.launches.append((kernel, blocks, threads, args))
        if kernel == "nvshmem_putsig_pingpong":
            dst, src, nbytes, signal, _pe, scope, _me, first, iters, elapsed = args
            assert scope in (0, 1, 2) and threads == (1, 32, 512)[scope]
            ctypes.memmove(dst, src, int(nbytes))
            ctypes.c_int64.from_address(signal).value = int(first + iters - 1)
            ctypes.c_int64.from_address(elapsed).value = self.SPAN_NS
        elif kernel == "nvshmem_put_bw":
            dst, src, nbytes, _pe, _iters = args
            ctypes.memmove(dst, src, int(nbytes))
        elif kernel == "empty_loop":
            _iters, elapsed = args
            ctypes.c_int64.from_address(elapsed).value = self.SPAN_NS


@pytest.fixture
def device_world(world, monkeypatch):
    from xbench.fabric import nvshmem_device

    kernels = FakeKernels()
    monkeypatch.setattr(
        nvshmem_device.NvshmemDeviceTransport,
        "_loaded",
        {"kernels": {k: k for k in nvshmem_device.KERNELS}, "sms": 132, "launch": kernels},
    )
    yield (*world, kernels)


def _device_transport(plan, me: int, comm=None):
    from xbench.fabric.nvshmem_device import NvshmemDeviceTransport

    t = NvshmemDeviceTransport(Pair(comm or _Comm(), me, (3, 5), ("h", "h")), plan)
    t.timer = DeviceTimer(False)
    return t


def test_the_registry_gives_the_device_initiated_class_for_nvshmem_only():
    from xbench.fabric.nvshmem_device import NvshmemDeviceTransport
    from xbench.fabric.registry import transport_class

    assert transport_class("nvshmem", "host", "device") is NvshmemDeviceTransport
    assert transport_class("nvshmem") is nv_transport.NvshmemTransport
    assert NvshmemDeviceTransport.loop == "device"  # the samples say what ran the loop


def test_a_device_ping_pong_is_one_launch_timed_on_the_gpu(device_world):
    fake, plan, kernels = device_world
    initiator = _device_transport(plan, 0)
    initiator.connect()
    initiator.sbuf[:1152].copy_(torch.arange(1152) % 251)
    seconds = initiator.exchange(1152, 8, 3)
    assert seconds == FakeKernels.SPAN_NS / 1e9  # the kernel's span, not a host clock
    assert not fake.calls  # nothing posted by the host
    ((kernel, blocks, threads, args),) = kernels.launches
    # by default a warp puts each message, as serving kernels moving KV pages do
    assert (kernel, blocks, threads) == ("nvshmem_putsig_pingpong", 1, 32)
    dst, src, nbytes, signal, pe, scope, me, first, iters, elapsed = args
    assert scope == 1
    assert (dst, src, signal) == (
        initiator.rbuf.data_ptr(),
        initiator.sbuf.data_ptr(),
        initiator.signal.data_ptr(),
    )
    assert (nbytes, pe, me, first, iters) == (1152, 5, 1, 1, 3)
    assert torch.equal(initiator.rbuf[:1152], initiator.sbuf[:1152])
    assert elapsed == initiator.elapsed.data_ptr() and initiator.signal.item() == 3
    initiator.exchange(1152, 8, 4)  # the next sample's counts continue where these ended
    assert kernels.launches[-1][3][7:9] == (4, 4)


def test_the_device_responder_answers_with_the_return_size(device_world):
    _fake, plan, kernels = device_world
    responder = _device_transport(plan, 1)
    responder.connect()
    responder.exchange(8, 1152, 2)
    args = kernels.launches[0][3]
    assert (args[2], args[4], args[6], args[7], args[8]) == (1152, 3, 0, 1, 2)


@pytest.mark.parametrize("scope, code, threads", [("thread", 0, 1), ("block", 2, 512)])
def test_put_scope_picks_who_issues_each_ping_pong_put(device_world, scope, code, threads):
    """--put-scope thread: one thread puts (NVSHMEM perftest's latency); block: the whole
    block copies each message together."""
    from xbench.fabric import nvshmem_device

    _fake, plan, kernels = device_world
    nvshmem_device.NvshmemDeviceTransport._loaded["put_scope"] = scope
    t = _device_transport(plan, 0)
    t.connect()
    t.exchange(1152, 8, 2)
    ((kernel, blocks, launched, args),) = kernels.launches
    assert (kernel, blocks, launched, args[5]) == ("nvshmem_putsig_pingpong", 1, threads, code)


@pytest.mark.parametrize("size, blocks", [(4096, 1), (1 << 20, 16)])
def test_device_bandwidth_streams_window_times_iterations_puts(device_world, size, blocks):
    _fake, plan, kernels = device_world
    comm = _Comm()
    initiator = _device_transport(plan, 0, comm)
    initiator.connect()
    initiator.sbuf[:size].fill_(9)
    initiator.window(size, 64, 3)
    ((kernel, grid, threads, args),) = kernels.launches
    assert (kernel, grid, threads) == ("nvshmem_put_bw", blocks, 512)
    assert args[2:] == (size, 5, 64 * 3)
    assert bool((initiator.rbuf[:size] == 9).all()) and comm.barriers == 2  # connect, end
    responder = _device_transport(plan, 1, _Comm())
    responder.window(size, 64, 3)  # waits at the pair's barrier; launches nothing
    assert len(kernels.launches) == 1 and responder.pair.comm.barriers == 1


def test_bandwidth_blocks_follow_the_message_size():
    from xbench.fabric.nvshmem_device import bandwidth_blocks

    assert [bandwidth_blocks(n, 132) for n in (8, (1 << 20) - 1, 1 << 20, 16 << 20)] == [
        1,
        1,
        16,
        132,
    ]
    assert bandwidth_blocks(1 << 20, 8) == 8  # never more blocks than SMs


def test_nvshmem_initialises_the_loaded_kernels_through_the_call_its_release_has():
    from xbench.errors import XbenchError
    from xbench.fabric.nvshmem_device import finalize_library, init_library

    calls = []
    module = types.SimpleNamespace(handle=0x1000, get_module=lambda: 0x2000)
    library = types.SimpleNamespace(
        culibrary_init=lambda h: calls.append(("library", h)),
        culibrary_finalize=lambda h: calls.append(("library-end", h)),
    )
    init_library(library, module)
    finalize_library(library, module)
    older = types.SimpleNamespace(  # an nvshmem4py with the module calls only
        cumodule_init=lambda h: calls.append(("module", h)) or 0,
        cumodule_finalize=lambda h: calls.append(("module-end", h)),
    )
    init_library(older, module)
    finalize_library(older, module)
    assert calls == [
        ("library", 0x1000),
        ("library-end", 0x1000),
        ("module", 0x2000),
        ("module-end", 0x2000),
    ]
    with pytest.raises(XbenchError, match="status 7"):
        init_library(types.SimpleNamespace(culibrary_init=lambda h: 7), module)


def test_device_teardown_finalizes_the_kernels_before_nvshmem(device_world, monkeypatch):
    from xbench.fabric import nvshmem_device

    fake, _plan, _kernels = device_world
    ended = []
    fake.bindings.culibrary_finalize = lambda h: ended.append(("kernels", h))
    nvshmem_device.NvshmemDeviceTransport._loaded["module"] = types.SimpleNamespace(handle=42)
    sync = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(nv_transport, "torch_module", lambda: sync)
    monkeypatch.setattr(nvshmem_device, "torch_module", lambda: sync)
    fake.core.finalize = lambda: ended.append(("nvshmem",))
    nvshmem_device.NvshmemDeviceTransport.teardown_world(_Comm())
    assert ended == [("kernels", 42), ("nvshmem",)]
    assert nvshmem_device.NvshmemDeviceTransport._loaded == {}


def test_the_device_loops_own_cost_is_timed_by_a_kernel(device_world):
    _fake, plan, kernels = device_world
    t = _device_transport(plan, 0)
    assert t.empty_loop(100_000) == FakeKernels.SPAN_NS / 1e9
    assert kernels.launches == [("empty_loop", 1, 32, (100_000, t.elapsed.data_ptr()))]


def _device_kernel_parameters() -> dict[str, list[str]]:
    """Each NVSHMEM kernel's parameter types, read from cuda/probe_device.cu."""
    import re

    from xbench.resources import cuda_dir

    text = (cuda_dir() / "probe_device.cu").read_text()
    found = {}
    for m in re.finditer(r'extern "C" __global__\s+void\s+(\w+)\s*\(([^)]*)\)', text, re.S):
        found[m.group(1)] = [" ".join(p.split()[:-1]) for p in m.group(2).split(",")]
    return found


# how cuda.core passes each argument: a Python int is a pointer, numpy scalars their type
_PASSED_AS = {"size_t": np.uint64, "int": np.int32, "long long": np.int64}


def test_every_launch_passes_what_the_kernels_signature_takes(device_world):
    from xbench.fabric.nvshmem_device import KERNELS

    _fake, plan, kernels = device_world
    t = _device_transport(plan, 0)
    t.connect()
    t.exchange(8, 8, 2)
    t.window(4096, 4, 2)
    t.empty_loop(10)
    parameters = _device_kernel_parameters()
    assert {k for k, *_ in kernels.launches} == set(KERNELS)
    for kernel, _blocks, _threads, args in kernels.launches:
        types_ = parameters[kernel]
        assert len(args) == len(types_), kernel
        for arg, c_type in zip(args, types_, strict=True):
            if c_type.endswith("*"):
                assert type(arg) is int, (kernel, c_type)
            else:
                assert type(arg) is _PASSED_AS[c_type], (kernel, c_type, type(arg))
