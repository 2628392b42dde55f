"""How validate's messages cross between its two ranks: MPI on the tensors' own memory, or
through host buffers around MPI for tensors on a GPU.

``host``: CPU tensors; MPI sends and receives their bytes in place (no copies). ``staged``:
each message is copied to a host buffer (page-locked where CUDA is there) before MPI sends
it and from one after MPI receives it, as a serving engine whose MPI is not CUDA-aware (the
PyPI MPICH and Debian's Open MPI are not) moves a GPU's bytes; the copies are part of the
send, return and transfer phases they belong to, and the run says so (transport
``mpi-staged``). On a CPU the same staged path runs with plain host buffers, which is how the
tests check it without a GPU. ``cuda-aware``: MPI handed the GPU's memory itself, for an MPI
built with CUDA (transport ``mpi-cuda``; on CPUs the same calls on host memory). ``nccl``: torch.distributed point-to-point on the tensors
themselves, as an engine with NCCL moves them (NCCL on GPUs, one GPU a rank; gloo on CPUs,
which is how the tests run it); its process group is set up once a run
(:func:`xbench.fabric.nccl.init_process_group`). ``nvshmem``: NVSHMEM puts from one GPU's
memory into the other's, as an engine with a symmetric KV heap moves them (NVSHMEM starts once
a run, :func:`xbench.fabric.nvshmem.init_pes`); what crosses it lives on the symmetric heap,
so the paths ask their wire to ``place`` those tensors.
"""

from __future__ import annotations

from xbench.errors import XbenchError


def transport_label(wire: str, device: str = "cpu") -> str:
    """The samples' ``transport``: what the bytes went through."""
    return WIRES[wire].transport(device)


def dist_backend(device: str) -> str:
    """torch.distributed's backend for the nccl wire: NCCL for GPU tensors, gloo for CPU
    ones (the same code path where no GPU is)."""
    return "nccl" if device.startswith("cuda") else "gloo"


def _waitall(requests) -> None:
    from mpi4py import MPI

    MPI.Request.Waitall(requests)


def byte_view(t):
    """A flat uint8 view of a contiguous tensor (any device): a message's bytes."""
    import torch

    return t.contiguous().view(-1).view(torch.uint8)


class Wire:
    """What every wire offers besides moving messages: what it starts once a run
    (``start_run``, ``stop_run``), where a case's tensors that cross it live (``place``),
    and the end of a case (``close``). MPI's wires need none of them."""

    # NCCL ("Duplicate GPU") and NVSHMEM (its limited MPG) refuse two ranks on one GPU
    one_gpu_each = False

    def __init__(self, comm, device: str = "cpu"):
        import torch

        self.comm, self.torch = comm, torch
        self.cuda = torch.device(device).type == "cuda"

    @staticmethod
    def transport(device: str) -> str:
        """The samples' ``transport`` for this wire's messages on ``device``."""
        return "mpi"

    def ready(self) -> None:
        """Work queued on the device is done (a phase boundary)."""
        if self.cuda:
            self.torch.cuda.synchronize()

    @staticmethod
    def start_run(comm, gpu: int | None) -> None:
        """Started over the run's two ranks, each on ``gpu`` (None: on CPUs)."""

    @staticmethod
    def stop_run() -> None:
        """The run is over on both ranks."""

    def place(self, t, landing: int | None = None):
        """``t``, or a copy of it where this wire can move it from and into; ``landing``: the
        tag of the messages that arrive in it."""
        return t

    def close(self) -> None:
        """The case is over on both ranks: what ``place`` took is given back."""


class HostWire(Wire):
    """MPI on the tensors' memory: CPU tensors only."""

    name = "host"

    def __init__(self, comm, device: str = "cpu"):
        if device != "cpu":
            raise ValueError("the host wire moves CPU tensors; GPU tensors take the staged wire")
        super().__init__(comm, device)

    @staticmethod
    def _memory(t):
        """What MPI is handed for a message: the tensor's own bytes, as an array."""
        return byte_view(t).numpy()

    def send(self, t, dest: int, tag: int) -> None:
        self.comm.Send(self._memory(t), dest=dest, tag=tag)

    def recv(self, t, source: int, tag: int) -> None:
        self.comm.Recv(self._memory(t), source=source, tag=tag)

    def send_all(self, tensors, dest: int, tag: int) -> None:
        """One message per tensor, all in flight at once (a per-page fetch)."""
        _waitall([self.comm.Isend(self._memory(t), dest, tag) for t in tensors])

    def recv_all(self, tensors, source: int, tag: int) -> None:
        _waitall([self.comm.Irecv(self._memory(t), source, tag) for t in tensors])


class CudaAwareWire(HostWire):
    """MPI handed the tensors' GPU memory itself (a CUDA-aware MPI: Open MPI or MPICH built
    with CUDA), as ``--transport mpi --device cuda`` probes it. mpi4py takes a torch tensor
    through DLPack, on any device, so on CPUs the same calls move host memory (the tests).
    The MPI is asked whether it takes device memory before the run starts (a build without
    CUDA crashes on a device pointer). A CUDA-aware MPI does not follow the stream, so a
    send waits for the queued work that wrote its message."""

    name = "cuda-aware"

    @staticmethod
    def start_run(comm, gpu: int | None) -> None:
        if gpu is not None:
            from xbench.fabric.mpi_device import require_cuda_aware

            require_cuda_aware(instead="--wire staged")

    def __init__(self, comm, device: str = "cpu"):
        Wire.__init__(self, comm, device)  # GPU tensors welcome, unlike the host wire's

    @staticmethod
    def transport(device: str) -> str:
        return "mpi-cuda" if device.startswith("cuda") else "mpi"

    @staticmethod
    def _memory(t):
        return byte_view(t)

    def _written(self) -> None:
        """The queued work that wrote a message is done before MPI reads it; a query, not
        a wait, where a phase boundary has just waited (every path stamps before it sends)."""
        if self.cuda:
            stream = self.torch.cuda.current_stream()
            if not stream.query():
                stream.synchronize()

    def send(self, t, dest: int, tag: int) -> None:
        self._written()
        super().send(t, dest, tag)

    def send_all(self, tensors, dest: int, tag: int) -> None:
        self._written()
        super().send_all(tensors, dest, tag)


class StagedWire(Wire):
    """Device tensors through host buffers around MPI (an MPI that is not CUDA-aware).

    One host buffer per message shape and role, allocated on first use and reused, as an
    engine registers its staging buffers once; page-locked on a GPU host, so the copies run
    at the link's rate. A send waits for its copy to the host before MPI takes the buffer; a
    receive copies to the device and waits for it, so the bytes are in place when it returns.
    """

    name = "staged"

    def __init__(self, comm, device: str = "cpu"):
        super().__init__(comm, device)
        self._buffers: dict = {}

    def _host(self, key, nbytes: int):
        buf = self._buffers.get((key, nbytes))
        if buf is None:
            buf = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.cuda)
            self._buffers[(key, nbytes)] = buf
        return buf

    @staticmethod
    def transport(device: str) -> str:
        return "mpi-staged"

    def _to_host(self, t, key):
        src = byte_view(t)
        host = self._host(key, src.numel())
        host.copy_(src)
        return host

    def send(self, t, dest: int, tag: int) -> None:
        host = self._to_host(t, ("send", tag))
        self.ready()  # the copy has landed before MPI reads the buffer
        self.comm.Send(host.numpy(), dest=dest, tag=tag)

    def recv(self, t, source: int, tag: int) -> None:
        dst = byte_view(t)
        host = self._host(("recv", tag), dst.numel())
        self.comm.Recv(host.numpy(), source=source, tag=tag)
        dst.copy_(host)
        self.ready()

    def send_all(self, tensors, dest: int, tag: int) -> None:
        hosts = [self._to_host(t, ("send", tag, i)) for i, t in enumerate(tensors)]
        self.ready()
        _waitall([self.comm.Isend(h.numpy(), dest, tag) for h in hosts])

    def recv_all(self, tensors, source: int, tag: int) -> None:
        views = [byte_view(t) for t in tensors]
        hosts = [self._host(("recv", tag, i), v.numel()) for i, v in enumerate(views)]
        _waitall([self.comm.Irecv(h.numpy(), source, tag) for h in hosts])
        for view, host in zip(views, hosts, strict=True):
            view.copy_(host)
        self.ready()


class TorchDistWire(Wire):
    """torch.distributed point-to-point on the tensors' own memory: NCCL between GPUs (it
    orders a pair's messages as they were posted, so tags need not match), gloo on CPUs."""

    name = "nccl"
    one_gpu_each = True

    @staticmethod
    def start_run(comm, gpu: int | None) -> None:
        from xbench.fabric.nccl import init_process_group

        init_process_group(comm, dist_backend("cpu" if gpu is None else "cuda"))

    @staticmethod
    def stop_run() -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    @staticmethod
    def transport(device: str) -> str:  # torch.distributed's backend, as it moved them
        return dist_backend(device)

    def __init__(self, comm, device: str = "cpu"):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ValueError("the nccl wire needs the run's process group (run_validate)")
        super().__init__(comm, device)
        self.dist = dist

    def send(self, t, dest: int, tag: int) -> None:
        self.dist.send(byte_view(t), dest, tag=tag)

    def recv(self, t, source: int, tag: int) -> None:
        self.dist.recv(byte_view(t), source, tag=tag)  # a view: the bytes land in t
        self.ready()

    def _all(self, op, tensors, peer: int, tag: int) -> None:
        """One message per tensor, all posted at once as one group."""
        ops = [self.dist.P2POp(op, byte_view(t), peer, tag=tag) for t in tensors]
        for request in self.dist.batch_isend_irecv(ops):
            request.wait()

    def send_all(self, tensors, dest: int, tag: int) -> None:
        self._all(self.dist.isend, tensors, dest, tag)

    def recv_all(self, tensors, source: int, tag: int) -> None:
        self._all(self.dist.irecv, tensors, source, tag)
        self.ready()


class NvshmemWire(Wire):
    """Host-initiated NVSHMEM puts on the stream, GPU memory into the peer's GPU memory, each
    message's arrival a signal (as the nvshmem transport probes it).

    A put lands at a symmetric address, and over a network its source is read by the NIC,
    which needs memory NVSHMEM registered: so what crosses lives on the symmetric heap. The
    ranks build a case identically, so their ``place`` calls are the same collective
    allocations in the same order. A message lands in the tensor placed with its tag; a
    fetch's pages are puts of their own, back to back in that tensor, then one signal after
    NVSHMEM's quiet, so the requester waits once. Each side counts the messages it sent and
    has seen; the signal word holds the peer's count. The word is zeroed as the case starts
    and a barrier follows, so no count of an earlier case satisfies a wait.
    """

    name = "nvshmem"
    one_gpu_each = True

    @staticmethod
    def start_run(comm, gpu: int | None) -> None:
        from xbench.fabric.nvshmem import NvshmemTransport, init_pes

        NvshmemTransport.require_library()
        init_pes(comm, gpu)

    @staticmethod
    def stop_run() -> None:
        import nvshmem.core

        nvshmem.core.finalize()

    @staticmethod
    def transport(device: str) -> str:
        return "nvshmem"

    def __init__(self, comm, device: str = "cpu"):
        import nvshmem.core
        from nvshmem import bindings

        from xbench.fabric.nvshmem import signal_constants

        super().__init__(comm, device)
        self.bindings = bindings
        self.interop = nvshmem.core.interop.torch
        self.peer_pe = 1 - comm.Get_rank()  # the PEs are the run's two ranks (init_pes)
        self.signal_set, self.cmp_ge = signal_constants(bindings)
        self.placed: list = []
        self.landings: dict = {}
        self.signal = self.place(self.torch.zeros(1, dtype=self.torch.int64))
        self.ready()
        comm.Barrier()
        self.sent = self.seen = 0

    def place(self, t, landing: int | None = None):
        try:
            symmetric = self.interop.tensor(tuple(t.shape), dtype=t.dtype)
        except Exception as exc:  # nvshmem4py's own errors; the heap's size, mostly
            raise XbenchError(
                f"NVSHMEM could not place {t.nbytes} B on the symmetric heap: {exc}",
                "raise NVSHMEM_SYMMETRIC_SIZE (1 GB unless set), or pass a smaller --chunk",
            ) from None
        symmetric.copy_(t)
        self.placed.append(symmetric)
        if landing is not None:
            self.landings[landing] = symmetric
        return symmetric

    def _stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream if self.cuda else 0

    def _wait(self) -> None:
        """Until the peer's count of messages to us passes the ones we have seen."""
        self.seen += 1
        self.bindings.signal_wait_until_on_stream(
            self.signal.data_ptr(), self.cmp_ge, self.seen, self._stream()
        )

    def _check_landing(self, t, tag: int) -> None:
        """A message is received where it landed: in the tensor placed for its tag."""
        if t.data_ptr() != self.landings[tag].data_ptr():
            raise ValueError(f"messages tagged {tag} land in the tensor placed for them")

    def send(self, t, dest: int, tag: int) -> None:
        self.sent += 1
        self.bindings.putmem_signal_on_stream(
            self.landings[tag].data_ptr(),
            t.data_ptr(),
            t.nbytes,
            self.signal.data_ptr(),
            self.sent,
            self.signal_set,
            self.peer_pe,
            self._stream(),
        )

    def recv(self, t, source: int, tag: int) -> None:
        self._check_landing(t, tag)
        self._wait()
        self.ready()

    def send_all(self, tensors, dest: int, tag: int) -> None:
        b, stream = self.bindings, self._stream()
        at = self.landings[tag].data_ptr()
        for t in tensors:
            b.putmem_nbi_on_stream(at, t.data_ptr(), t.nbytes, self.peer_pe, stream)
            at += t.nbytes
        b.quiet_on_stream(stream)  # every page has landed before the signal says so
        self.sent += 1
        b.signal_op_on_stream(
            self.signal.data_ptr(), self.sent, self.signal_set, self.peer_pe, stream
        )

    def recv_all(self, tensors, source: int, tag: int) -> None:
        self._check_landing(tensors[0], tag)
        self._wait()
        self.ready()

    def close(self) -> None:
        self.ready()
        self.comm.Barrier()  # no rank frees what its peer may still put into
        for t in self.placed:
            self.interop.free_tensor(t)
        self.placed, self.landings = [], {}


WIRES = {
    "host": HostWire,
    "staged": StagedWire,
    "cuda-aware": CudaAwareWire,
    "nccl": TorchDistWire,
    "nvshmem": NvshmemWire,
}


def make_wire(name: str, comm, device: str):
    return WIRES[name](comm, device)
