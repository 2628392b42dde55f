"""The ``nvshmem`` transport: nvshmem4py puts between PEs, completion by NVSHMEM signals.

Written from the library's documentation; needs one GPU per PE (not run on this project's
machines, which have no GPU).
"""

from __future__ import annotations

from xbench.errors import XbenchError
from xbench.fabric.gpu import DeviceTimer, claim_own_gpu, local_gpu, torch_module
from xbench.fabric.transport import Transport


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

        torch = torch_module()
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
        self.timer = DeviceTimer(True)

    def _buffer(self, nbytes, fill):
        torch = torch_module()
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
        torch = torch_module()
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
