"""The ``nvshmem`` transport: host-initiated NVSHMEM puts between PEs, completion by signals.

Exact sizes: nvshmem4py's ``put(dst[:n], src[:n])`` resolves each tensor to its whole
symmetric allocation and moves the smaller one entirely, whatever ``n`` is (on an H100 an
8 B and a 256 MB put both took 180 us), so every put here goes through the bindings'
pointer-and-size calls (``putmem_signal_on_stream``, ``putmem_nbi_on_stream``). A message
and its completion signal are one put-with-signal, so nothing can reorder them; each side
counts what it sent and what it has seen, and a pair zeroes its signal word before it starts.
Symmetric memory is allocated collectively, so every PE allocates the same buffers in
``setup_world`` (pair members or not), and every PE frees them and finalizes NVSHMEM in
``teardown_world``. Needs one GPU per PE; tested here with a fake nvshmem4py that records
every call's bytes.
"""

from __future__ import annotations

from xbench.errors import XbenchError
from xbench.fabric.gpu import DeviceTimer, claim_own_gpu, local_gpu, torch_module
from xbench.fabric.transport import Transport, host_buffer_sizes

# NVSHMEM's constants (nvshmem.h), for bindings whose enums are named otherwise
SIGNAL_SET = 9
CMP_GE = 5


def install_hint(cuda_version: str | None) -> str:
    """How to install nvshmem4py for the CUDA that torch was built for: its wheels are one
    per CUDA major version (nvshmem4py-cu12, nvshmem4py-cu13), and the wrong one fails to
    load its libraries on the node."""
    major = (cuda_version or "").split(".")[0]
    if major in ("12", "13"):
        return f"pip install nvshmem4py-cu{major} on GPU nodes (torch is built for CUDA {major})"
    return "pip install nvshmem4py-cu12 or -cu13 on GPU nodes, the one for torch's CUDA"


def signal_constants(bindings) -> tuple[int, int]:
    """(NVSHMEM_SIGNAL_SET, NVSHMEM_CMP_GE) as these bindings name them, else nvshmem.h's."""

    def constant(enum: str, member: str, default: int) -> int:
        return int(getattr(getattr(bindings, enum, None), member, default))

    return constant("Signal_op", "SIGNAL_SET", SIGNAL_SET), constant("Cmp_type", "CMP_GE", CMP_GE)


class NvshmemTransport(Transport):
    """Host-initiated NVSHMEM puts between PEs (nvshmem4py bindings), completion by signals.

    The fabric NVSHMEM uses (NVLink P2P, IBRC, IBGDA, UCX) is chosen by its own settings,
    which ``--fabric`` presets (see ``xbench.fabric.presets``).
    """

    name = "nvshmem"
    device = "cuda"
    loop = "python"
    _world: dict = {}  # this process's symmetric buffers and library handles (setup_world)

    def __init__(self, pair, plan, *, seed: int = 0):
        world = NvshmemTransport._world
        if not world:
            raise XbenchError(
                "the nvshmem transport was not set up on this rank", "run it through xbench probe"
            )
        self.bindings = world["bindings"]
        self._symmetric = iter(world["buffers"])
        super().__init__(pair, plan, seed=seed)
        self.signal = world["signal"]
        self.peer_pe = pair.world_ranks[pair.peer]
        self.signal_set, self.cmp_ge = signal_constants(self.bindings)
        self.sent = self.seen = 0
        self.timer = DeviceTimer(True)

    def _buffer(self, nbytes, fill):
        """The next symmetric buffer setup_world allocated (the same sizes, in order)."""
        buf = next(self._symmetric)
        buf[: max(int(nbytes), 1)].fill_(fill & 0xFF)
        return buf

    @staticmethod
    def _stream() -> int:
        return torch_module().cuda.current_stream().cuda_stream

    @staticmethod
    def _sync() -> None:
        torch_module().cuda.synchronize()

    def connect(self) -> None:
        """A fresh signal word and fresh counts for this pair (a previous pair's signals
        would otherwise satisfy this pair's first waits)."""
        self.signal.zero_()
        self._sync()
        self.pair.comm.Barrier()
        self.sent = self.seen = 0

    def _put_signal(self, dst, src, nbytes: int) -> None:
        """``nbytes`` bytes and, after them, the peer's signal word set to our count."""
        self.sent += 1
        self.bindings.putmem_signal_on_stream(
            dst.data_ptr(),
            src.data_ptr(),
            nbytes,
            self.signal.data_ptr(),
            self.sent,
            self.signal_set,
            self.peer_pe,
            self._stream(),
        )

    def _wait(self) -> None:
        """Until the peer's count of puts to us reaches what we have seen, plus one."""
        self.seen += 1
        self.bindings.signal_wait_until_on_stream(
            self.signal.data_ptr(), self.cmp_ge, self.seen, self._stream()
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
        b = self.bindings

        def body():
            for _ in range(iters):
                if me:
                    stream = self._stream()
                    for _ in range(window):
                        b.putmem_nbi_on_stream(
                            self.rbuf.data_ptr(), self.sbuf.data_ptr(), n, self.peer_pe, stream
                        )
                    b.quiet_on_stream(stream)  # the window has landed before the signal
                    self.sent += 1
                    b.signal_op_on_stream(
                        self.signal.data_ptr(), self.sent, self.signal_set, self.peer_pe, stream
                    )
                    self._wait()  # the responder's one-byte acknowledgement
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

    @staticmethod
    def require_library() -> None:
        """nvshmem4py importable, or one line naming the wheel to install."""
        try:
            import nvshmem.core  # noqa: F401
            from cuda.core import Device  # noqa: F401
            from nvshmem import bindings  # noqa: F401
        except ImportError as exc:
            raise XbenchError(
                f"nvshmem transport: {exc}", install_hint(torch_module().version.cuda)
            ) from None

    @staticmethod
    def setup_world(world_comm, cfg, plan) -> None:
        NvshmemTransport.require_library()
        import nvshmem.core
        from nvshmem import bindings

        torch = torch_module()
        if not torch.cuda.is_available():
            raise XbenchError(
                "nvshmem transport needs CUDA GPUs, and torch sees none here", "run on GPU nodes"
            )
        gpu = local_gpu(world_comm)
        claim_own_gpu(world_comm, gpu, "nvshmem")
        torch.cuda.set_device(gpu)
        init_pes(world_comm, gpu)
        NvshmemTransport._world = allocate_symmetric(
            nvshmem.core, bindings, host_buffer_sizes(plan)
        )
        torch.cuda.synchronize()
        world_comm.Barrier()

    @staticmethod
    def teardown_world(world_comm) -> None:
        world, NvshmemTransport._world = NvshmemTransport._world, {}
        if not world:
            return
        torch_module().cuda.synchronize()
        world_comm.Barrier()  # no PE frees what a peer may still be putting into
        release_symmetric(world)


def init_pes(world_comm, gpu: int | None) -> None:
    """NVSHMEM started on every rank of ``world_comm``, one PE each, bound to ``gpu``: rank 0
    makes the unique ID and MPI hands it to the others (NVSHMEM's UID bootstrap, so it needs
    no MPI of its own). ``gpu`` None binds no device: only the tests' stand-in library,
    which runs on CPUs, takes that."""
    import numpy as np
    import nvshmem.core

    device = None
    if gpu is not None:
        from cuda.core import Device

        device = Device(gpu)
        device.set_current()
    uid = nvshmem.core.get_unique_id(empty=world_comm.Get_rank() != 0)
    world_comm.Bcast(uid._data.view(np.int8), root=0)
    nvshmem.core.init(
        device=device,
        uid=uid,
        rank=world_comm.Get_rank(),
        nranks=world_comm.Get_size(),
        initializer_method="uid",
    )


def allocate_symmetric(core, bindings, sizes) -> dict:
    """Every PE, the same buffers in the same order (symmetric allocation is collective)."""
    torch = torch_module()
    interop = core.interop.torch
    buffers = [interop.bytetensor((max(int(n), 1),), dtype=torch.uint8) for n in sizes]
    signal = interop.tensor((1,), dtype=torch.int64)
    signal.zero_()
    return {"core": core, "bindings": bindings, "buffers": buffers, "signal": signal}


def free_symmetric(world: dict) -> None:
    interop = world["core"].interop.torch
    for tensor in [*world["buffers"], world["signal"]]:
        interop.free_tensor(tensor)


def release_symmetric(world: dict) -> None:
    """The buffers freed, then NVSHMEM finalized."""
    free_symmetric(world)
    world["core"].finalize()
