"""The ``nvshmem`` transport posted by the GPU (``--initiator device``): kernels put.

What IBGDA changes is who posts a message: a GPU thread writes the work request and rings
the NIC's doorbell, with no host in the path (over NVLink the thread stores to the peer's
memory itself). The host-initiated transport (``nvshmem.py``) cannot show that, so here
the loops run in the kernels of ``cuda/probe_device.cu``, built with nvcc as relocatable
device code linked against NVSHMEM's device library (``device_probe.build_cubin``; one
build a node, cached), loaded with cuda.core and initialised by NVSHMEM after its own
start, and launched on torch's stream, one launch per sample:

- latency and rtt: ``nvshmem_putsig_pingpong``, one block a side, each message and its
  signal one put issued by one thread, a warp (the default, as serving kernels that move
  KV pages put) or the block (``--put-scope``; over NVLink a put is its threads' own
  copy, so one thread moves a KB-sized message at under 1 GB/s); the loop is timed on the
  GPU's global timer, so the launch is not in it. The counts continue from launch to
  launch (a launch starts one past the last count).
- bandwidth: ``nvshmem_put_bw``, the initiator's grid puts window x iterations messages
  back to back (each block its share, block-wide puts) and waits for their completion
  (``nvshmem_quiet``), timed with CUDA events, as NVSHMEM's own ``shmem_put_bw`` is: no
  acknowledgement per window, the responder waits at the pair's barrier.
- the loop's own cost (``loop_overhead``): ``empty_loop``, a kernel's loop that only counts.

Symmetric buffers, the signal word and NVSHMEM's start are the host-initiated transport's.
Without a GPU this is tested with fakes that record each launch.
"""

from __future__ import annotations

import time

import numpy as np

from xbench.errors import XbenchError
from xbench.fabric.device_probe import PUT_SCOPES
from xbench.fabric.gpu import claim_own_gpu, local_gpu, torch_module
from xbench.fabric.nvshmem import NvshmemTransport

KERNELS = ("nvshmem_putsig_pingpong", "nvshmem_put_bw", "empty_loop")
THREADS = {"nvshmem_put_bw": 512, "empty_loop": 32}
DEFAULT_PUT_SCOPE = list(PUT_SCOPES)[1]


def bandwidth_blocks(nbytes: int, sms: int) -> int:
    """Blocks that put one message: one below 1 MiB, 16 below 16 MiB, else one an SM (a
    block's share of a small message would be a few bytes; a large one needs the GPU)."""
    if nbytes < 1 << 20:
        return 1
    return min(16, sms) if nbytes < 16 << 20 else sms


def init_library(bindings, module) -> None:
    """NVSHMEM's device state into the loaded cubin: cuda.core loads a CUlibrary
    (``culibrary_init``); an nvshmem4py without that call takes the context's CUmodule."""
    if hasattr(bindings, "culibrary_init"):
        status = bindings.culibrary_init(int(module.handle))
    else:
        status = bindings.cumodule_init(int(module.get_module()))
    if status not in (None, 0):
        raise XbenchError(
            f"NVSHMEM could not initialise the probe's kernels (status {status})",
            "check that nvshmem4py and the nvidia-nvshmem wheel are the same release",
        )


def finalize_library(bindings, module) -> None:
    if hasattr(bindings, "culibrary_finalize"):
        bindings.culibrary_finalize(int(module.handle))
    else:
        bindings.cumodule_finalize(int(module.get_module()))


class NvshmemDeviceTransport(NvshmemTransport):
    """NVSHMEM puts posted by GPU kernels (``cuda/probe_device.cu``), timed on the GPU."""

    loop = "device"  # what runs the loop: a kernel, not the host
    _loaded: dict = {}  # this process's module, its kernels and its device (setup_world)

    def __init__(self, pair, plan, *, seed: int = 0):
        loaded = NvshmemDeviceTransport._loaded
        if not loaded:
            raise XbenchError(
                "the device-initiated nvshmem transport was not set up on this rank",
                "run it through xbench probe --transport nvshmem --initiator device",
            )
        super().__init__(pair, plan, seed=seed)
        self.kernels, self.sms = loaded["kernels"], loaded["sms"]
        self.launcher = loaded["launch"]
        scope = loaded.get("put_scope", DEFAULT_PUT_SCOPE)
        self.scope, self.scope_threads = list(PUT_SCOPES).index(scope), PUT_SCOPES[scope]
        # where the kernel writes its loop's span (ns), beside the signal word
        torch = torch_module()
        self.elapsed = torch.zeros(1, dtype=torch.int64, device=self.signal.device)

    def _launch(self, name: str, blocks: int, *args, threads: int | None = None) -> None:
        self.launcher(self.kernels[name], blocks, threads or THREADS[name], *args)

    def exchange(self, send_n, recv_n, iters):
        me = self.pair.initiator
        first = self.sent + 1  # both sides count the same round trips
        self._launch(
            "nvshmem_putsig_pingpong",
            1,
            self.rbuf.data_ptr(),
            self.sbuf.data_ptr(),
            np.uint64(send_n if me else recv_n),
            self.signal.data_ptr(),
            np.int32(self.peer_pe),
            np.int32(self.scope),
            np.int32(int(me)),
            np.int64(first),
            np.int64(iters),
            self.elapsed.data_ptr(),
            threads=self.scope_threads,
        )
        self._sync()
        self.sent += iters
        self.seen += iters
        return int(self.elapsed.item()) / 1e9

    def window(self, n, window, iters):
        if not self.pair.initiator:  # nothing to post: wait until the stream has landed
            t0 = time.perf_counter()
            self.pair.comm.Barrier()
            return time.perf_counter() - t0
        blocks = bandwidth_blocks(n, self.sms)

        def body():
            self._launch(
                "nvshmem_put_bw",
                blocks,
                self.rbuf.data_ptr(),
                self.sbuf.data_ptr(),
                np.uint64(n),
                np.int32(self.peer_pe),
                np.int64(window * iters),
            )

        elapsed = self.timer.run(body)
        self.pair.comm.Barrier()  # no sample starts before the last put has landed
        return elapsed

    def empty_loop(self, iters: int) -> float:
        """The kernels' loop with nothing in it, timed on the GPU as they are."""
        self._launch("empty_loop", 1, np.int64(iters), self.elapsed.data_ptr())
        self._sync()
        return int(self.elapsed.item()) / 1e9

    @staticmethod
    def setup_world(world_comm, cfg, plan) -> None:
        torch = torch_module()
        NvshmemTransport.require_library()
        gpu = local_gpu(world_comm)
        arch = arch_of(torch, gpu)  # refused before a build: no GPU, or ranks sharing one
        claim_own_gpu(world_comm, gpu, "nvshmem")
        cubin = _built_on_each_node(world_comm, arch)
        NvshmemTransport.setup_world(world_comm, cfg, plan)
        NvshmemDeviceTransport._loaded = load_kernels(
            NvshmemTransport._world["bindings"], cubin, gpu
        )
        NvshmemDeviceTransport._loaded["put_scope"] = cfg.put_scope or DEFAULT_PUT_SCOPE
        torch.cuda.synchronize()
        world_comm.Barrier()

    @staticmethod
    def teardown_world(world_comm) -> None:
        loaded, NvshmemDeviceTransport._loaded = NvshmemDeviceTransport._loaded, {}
        world = NvshmemTransport._world
        if loaded and world:
            torch_module().cuda.synchronize()
            world_comm.Barrier()  # no PE finalizes the kernels a peer may still be running
            finalize_library(world["bindings"], loaded["module"])
        NvshmemTransport.teardown_world(world_comm)


def load_kernels(bindings, cubin: bytes, gpu: int) -> dict:
    """The cubin loaded on ``gpu`` (NVSHMEM started), NVSHMEM's state put in it, its kernels,
    and a launch on torch's current stream: what the transport's instances share."""
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    torch = torch_module()
    device = Device(gpu)
    module = ObjectCode.from_cubin(cubin, name="probe_device")
    kernels = {name: module.get_kernel(name) for name in KERNELS}  # loads the library
    init_library(bindings, module)  # before any launch: the kernels read NVSHMEM's state

    streams: dict = {}  # cuda.core's view of each torch stream, made once, not per launch

    def launch_on_torchs_stream(kernel, blocks, threads, *args):
        current = torch.cuda.current_stream()
        stream = streams.get(current.cuda_stream)
        if stream is None:
            stream = streams[current.cuda_stream] = device.create_stream(current)
        launch(stream, LaunchConfig(grid=blocks, block=threads), kernel, *args)

    return {
        "module": module,
        "kernels": kernels,
        "sms": torch.cuda.get_device_properties(gpu).multi_processor_count,
        "launch": launch_on_torchs_stream,
    }


def _built_on_each_node(world_comm, arch: str) -> bytes:
    """The cubin, built (or read from the cache) by one rank a node and handed to the
    others; a build that fails stops every rank with the builder's one line."""
    from mpi4py import MPI

    from xbench.fabric.device_probe import build_cubin
    from xbench.resources import cuda_dir

    node = world_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        built = None
        if node.Get_rank() == 0:
            try:
                built = build_cubin(cuda_dir(), arch)
            except XbenchError as exc:
                built = (exc.problem, exc.fix)
        built = node.bcast(built, root=0)
    finally:
        node.Free()
    if isinstance(built, tuple):
        raise XbenchError(*built)
    return built


def arch_of(torch, gpu: int) -> str:
    if not torch.cuda.is_available():
        raise XbenchError(
            "--initiator device runs kernels on the GPUs, and torch sees none here",
            "run on GPU nodes",
        )
    major, minor = torch.cuda.get_device_capability(gpu)
    return f"sm_{major}{minor}"
