"""The ``nccl`` transport: torch.distributed point-to-point between ranks.

On GPUs, NCCL; ``--backend gloo`` runs the same code path on CPU tensors (which is what
runs on machines without a GPU). Written from the libraries' documentation.
"""

from __future__ import annotations

import socket

from xbench.errors import XbenchError
from xbench.fabric.gpu import DeviceTimer, claim_own_gpu, local_gpu, torch_module
from xbench.fabric.transport import FETCH_MODES, Transport


class TorchDistTransport(Transport):
    """Point-to-point send/recv through torch.distributed: NCCL on GPUs, gloo on CPUs."""

    name = "nccl"
    loop = "python"

    def __init__(self, pair, plan, *, backend: str = "nccl", seed: int = 0):
        torch = torch_module()
        self.backend = backend
        self.dev = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.device = "cuda" if backend == "nccl" else "host"
        super().__init__(pair, plan, seed=seed)
        self.timer = DeviceTimer(backend == "nccl")
        self.peer_world = pair.world_ranks[pair.peer]
        self.ack = torch.zeros(4, dtype=torch.uint8, device=self.dev)
        self.offs = [int(o) for o in self.offsets]

    def _buffer(self, nbytes, fill):
        torch = torch_module()
        return torch.full((max(int(nbytes), 1),), fill & 0xFF, dtype=torch.uint8, device=self.dev)

    @staticmethod
    def setup_world(world_comm, cfg, plan) -> None:
        import torch.distributed as dist

        torch = torch_module()
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
