"""Device-buffer transports: NCCL (torch.distributed), NVSHMEM (nvshmem4py), CUDA-aware MPI.

Written from the libraries' documentation. Of these, only the ``gloo`` backend of the
``nccl`` transport (the same torch.distributed code path on CPU tensors) runs on this
project's machines, which have no GPU; the others are exercised on GPU machines
(``make gpu-check``). Timing: CUDA events on the transport's stream around the loop for
device work, never host clocks around asynchronous calls; device buffers are written
before timing.
"""

from __future__ import annotations

import os
import socket
import time

from xbench.errors import XbenchError
from xbench.fabric.mpi_host import MpiHostTransport
from xbench.fabric.transport import FETCH_MODES, Transport


def _torch():
    import torch

    return torch


class _Timer:
    """CUDA events for device work, perf_counter for synchronous CPU work."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def run(self, body) -> float:
        torch = _torch()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            body()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        body()
        return time.perf_counter() - t0


def local_gpu(world_comm) -> int:
    """This rank's GPU: the launcher's local rank modulo the GPUs it sees."""
    torch = _torch()
    local = int(
        os.environ.get("LOCAL_RANK")
        or os.environ.get("SLURM_LOCALID")
        or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        or os.environ.get("MPI_LOCALRANKID")
        or world_comm.Get_rank()
    )
    return local % max(torch.cuda.device_count(), 1)


def ranks_sharing_a_gpu(idents: list[tuple[str, str]]) -> list[int]:
    """World ranks whose (host, GPU UUID) another rank also holds, from an allgather."""
    return [r for r, ident in enumerate(idents) if idents.count(ident) > 1]


def claim_own_gpu(world_comm, gpu: int, transport: str) -> None:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected") and NVSHMEM's host
    barriers refuse it ("limited MPG"); say so before either library starts. Compared by
    UUID, so ranks that each see one different GPU (srun --gpus-per-task=1) pass."""
    torch = _torch()
    uuid = str(getattr(torch.cuda.get_device_properties(gpu), "uuid", gpu))
    host = socket.gethostname()
    shared = ranks_sharing_a_gpu(world_comm.allgather((host, uuid)))
    if shared:
        raise XbenchError(
            f"the {transport} transport needs one GPU per rank, and ranks {shared} share "
            f"a GPU ({torch.cuda.device_count()} visible on {host})",
            "launch at most one rank per GPU (--np, or srun --gpus-per-task=1), "
            "or use --transport mpi",
        )


class TorchDistTransport(Transport):
    """Point-to-point send/recv through torch.distributed: NCCL on GPUs, gloo on CPUs."""

    name = "nccl"
    loop = "python"

    def __init__(self, pair, plan, *, backend: str = "nccl", seed: int = 0):
        torch = _torch()
        self.backend = backend
        self.dev = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.device = "cuda" if backend == "nccl" else "host"
        super().__init__(pair, plan, seed=seed)
        self.timer = _Timer(backend == "nccl")
        self.peer_world = pair.world_ranks[pair.peer]
        self.ack = torch.zeros(4, dtype=torch.uint8, device=self.dev)
        self.offs = [int(o) for o in self.offsets]

    def _buffer(self, nbytes, fill):
        torch = _torch()
        return torch.full((max(int(nbytes), 1),), fill & 0xFF, dtype=torch.uint8, device=self.dev)

    @staticmethod
    def setup_world(world_comm, cfg) -> None:
        import torch.distributed as dist

        torch = _torch()
        backend = cfg.backend
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise XbenchError(
                    "the nccl backend needs CUDA GPUs, and torch sees none here",
                    "run on GPU nodes, or pass --backend gloo for the same path on CPUs",
                )
            gpu = local_gpu(world_comm)
            claim_own_gpu(world_comm, gpu, "nccl")
            torch.cuda.set_device(gpu)
        if world_comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            address = (
                socket.gethostbyname(socket.gethostname())
                if world_comm.Get_size() > 1
                else "127.0.0.1",
                port,
            )
        else:
            address = None
        host, port = world_comm.bcast(address, root=0)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=world_comm.Get_rank(),
            world_size=world_comm.Get_size(),
        )

    def close(self) -> None:
        pass  # the process group lives for the run

    def exchange(self, send_n, recv_n, iters):
        import torch.distributed as dist

        me, peer = self.pair.initiator, self.peer_world
        s, r = (
            self.sbuf[:send_n] if me else self.sbuf[:recv_n],
            self.rbuf[:recv_n] if me else self.rbuf[:send_n],
        )

        def body():
            for _ in range(iters):
                if me:
                    dist.send(s, peer)
                    dist.recv(r, peer)
                else:
                    dist.recv(r, peer)
                    dist.send(s, peer)

        return self.timer.run(body)

    def window(self, n, window, iters):
        import torch.distributed as dist

        me, peer = self.pair.initiator, self.peer_world
        buf = (self.sbuf if me else self.rbuf)[:n]

        def body():
            for _ in range(iters):
                if me:
                    for w in [dist.isend(buf, peer) for _ in range(window)]:
                        w.wait()
                    dist.recv(self.ack, peer)
                else:
                    for w in [dist.irecv(buf, peer) for _ in range(window)]:
                        w.wait()
                    dist.send(self.ack, peer)

        return self.timer.run(body)

    def biwindow(self, n, window, iters):
        import torch.distributed as dist

        peer = self.peer_world
        ops_list = [dist.P2POp(dist.irecv, self.rbuf[:n], peer) for _ in range(window)] + [
            dist.P2POp(dist.isend, self.sbuf[:n], peer) for _ in range(window)
        ]

        def body():
            for _ in range(iters):
                for w in dist.batch_isend_irecv(ops_list):
                    w.wait()

        return self.timer.run(body)

    def fetch(self, mode, k, block, iters):
        import torch.distributed as dist

        me, peer, m = self.pair.initiator, self.peer_world, FETCH_MODES.index(mode)
        offs = self.offs[:k]

        def body():
            for _ in range(iters):
                if me:
                    dist.send(self.ack[:1], peer)
                    if m == 0:
                        for w in [dist.irecv(self.cache[o : o + block], peer) for o in offs]:
                            w.wait()
                    else:
                        dist.recv(self.staging[: k * block], peer)
                        if m == 1:
                            for j, o in enumerate(offs):
                                self.cache[o : o + block].copy_(
                                    self.staging[j * block : (j + 1) * block]
                                )
                else:
                    dist.recv(self.ack[:1], peer)
                    if m == 0:
                        for w in [dist.isend(self.cache[o : o + block], peer) for o in offs]:
                            w.wait()
                    else:
                        if m == 1:
                            for j, o in enumerate(offs):
                                self.staging[j * block : (j + 1) * block].copy_(
                                    self.cache[o : o + block]
                                )
                        dist.send(self.staging[: k * block], peer)

        return self.timer.run(body)


class NvshmemTransport(Transport):
    """Host-initiated NVSHMEM puts between PEs (nvshmem4py), completion by signals.

    The fabric NVSHMEM uses (NVLink P2P, IBRC, IBGDA, UCX) is chosen by its own settings,
    which ``--fabric`` presets (see ``xbench.fabric.presets``). Device-initiated puts live
    in ``cuda/probe_device.cu``.
    """

    name = "nvshmem"
    device = "cuda"
    loop = "python"

    def __init__(self, pair, plan, *, seed: int = 0):
        import nvshmem.core  # noqa: F401 - fail early with the real import error

        torch = _torch()
        self.nv = __import__("nvshmem.core", fromlist=["core"])
        super().__init__(pair, plan, seed=seed)
        self.stream = (
            self.nv.NvshmemStream(torch.cuda.current_stream())
            if hasattr(self.nv, "NvshmemStream")
            else torch.cuda.current_stream()
        )
        self.signal = self.nv.buffer(8)
        self.seq = 0
        self.peer_pe = pair.world_ranks[pair.peer]
        self.timer = _Timer(True)

    def _buffer(self, nbytes, fill):
        torch = _torch()
        t = self.nv.interop.torch.bytetensor((max(int(nbytes), 1),), dtype=torch.uint8)
        t.fill_(fill & 0xFF)
        return t

    @staticmethod
    def setup_world(world_comm, cfg) -> None:
        import numpy as np

        try:
            import nvshmem.core
            from cuda.core import Device
        except ImportError as exc:
            raise XbenchError(
                f"nvshmem transport: {exc}", "pip install nvshmem4py-cu12 (or -cu13) on GPU nodes"
            ) from None
        torch = _torch()
        if not torch.cuda.is_available():
            raise XbenchError(
                "nvshmem transport needs CUDA GPUs, and torch sees none here", "run on GPU nodes"
            )
        gpu = local_gpu(world_comm)
        claim_own_gpu(world_comm, gpu, "nvshmem")
        torch.cuda.set_device(gpu)
        dev = Device(gpu)
        dev.set_current()
        uid = nvshmem.core.get_unique_id(empty=world_comm.Get_rank() != 0)
        world_comm.Bcast(uid._data.view(np.int8), root=0)
        nvshmem.core.init(
            device=dev,
            uid=uid,
            rank=world_comm.Get_rank(),
            nranks=world_comm.Get_size(),
            initializer_method="uid",
        )

    def _put_signal(self, dst, src, n):
        self.seq += 1
        self.nv.put(dst[:n], src[:n], self.peer_pe, stream=self.stream)
        self.nv.signal_op(
            self.signal, self.seq, self.nv.SignalOp.SIGNAL_SET, self.peer_pe, stream=self.stream
        )

    def _wait(self):
        self.seq += 1
        self.nv.signal_wait(
            self.signal, self.seq, self.nv.ComparisonType.CMP_GE, stream=self.stream
        )

    def exchange(self, send_n, recv_n, iters):
        me = self.pair.initiator

        def body():
            for _ in range(iters):
                if me:
                    self._put_signal(self.rbuf, self.sbuf, send_n)
                    self._wait()
                else:
                    self._wait()
                    self._put_signal(self.rbuf, self.sbuf, recv_n)

        return self.timer.run(body)

    def window(self, n, window, iters):
        me = self.pair.initiator

        def body():
            for _ in range(iters):
                if me:
                    for _ in range(window):
                        self.nv.put(self.rbuf[:n], self.sbuf[:n], self.peer_pe, stream=self.stream)
                    self.nv.quiet(stream=self.stream)
                    self._put_signal(self.rbuf, self.sbuf, 1)
                    self._wait()
                else:
                    self._wait()
                    self._put_signal(self.rbuf, self.sbuf, 1)

        return self.timer.run(body)

    def biwindow(self, n, window, iters):
        raise XbenchError(
            "bibw is not implemented on the nvshmem transport",
            "use -p latency,bandwidth,rtt with --transport nvshmem",
        )

    def fetch(self, mode, k, block, iters):
        raise XbenchError(
            "gather is not implemented on the nvshmem transport",
            "use -p latency,bandwidth,rtt with --transport nvshmem",
        )


class MpiDeviceTransport(MpiHostTransport):
    """CUDA-aware MPI: the same compiled loops, handed device pointers."""

    device = "cuda"

    def __init__(self, pair, plan, *, loop: str = "auto", seed: int = 0):
        torch = _torch()
        if not torch.cuda.is_available():
            raise XbenchError(
                "--device cuda needs CUDA GPUs, and torch sees none here",
                "run on GPU nodes, or use --device host",
            )
        super().__init__(pair, plan, loop=loop, seed=seed)
        if self.lib is None:
            raise XbenchError(
                "CUDA-aware MPI probes need the compiled loop",
                "install an MPI with mpicc, built with CUDA support",
            )

    def _buffer(self, nbytes, fill):
        torch = _torch()
        return torch.full((max(int(nbytes), 1),), fill & 0xFF, dtype=torch.uint8, device="cuda")

    def _addr(self, buf, offset: int = 0) -> int:
        return buf.data_ptr() + offset
