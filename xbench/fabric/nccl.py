"""The ``nccl`` transport: torch.distributed point-to-point between ranks.

On GPUs, NCCL; ``--backend gloo`` runs the same code path on CPU tensors (which is what
runs on machines without a GPU). Written from the libraries' documentation.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from xbench.errors import XbenchError
from xbench.fabric.gpu import DeviceTimer, claim_own_gpu, local_gpu, torch_module
from xbench.fabric.transport import FETCH_MODES, Transport

RENDEZVOUS_ENV = "XBENCH_RENDEZVOUS_ADDR"  # rank 0's address for the others, when it knows better


def interface_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of this host's interfaces that have one (Linux ioctl)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:  # SIOCGIFADDR: no IPv4 address on this interface
                continue
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def rendezvous_host(hostnames: list[str], addresses, override: str | None) -> str:
    """Where the other ranks reach rank 0's store: loopback when every rank shares its host,
    else rank 0's first routable IPv4 address. Not ``gethostbyname(gethostname())``: on many
    nodes that is 127.0.1.1, and rank 1 then waits until torch's own timeout."""
    if override:
        return override
    if len(set(hostnames)) <= 1:
        return "127.0.0.1"
    routable = [ip for _, ip in addresses if not ip.startswith("127.")]
    if not routable:
        raise XbenchError(
            "rank 0 has no routable IPv4 address for the other nodes to reach",
            f"set {RENDEZVOUS_ENV} to an address of rank 0's node they can reach",
        )
    return routable[0]


def init_process_group(world_comm, backend: str) -> None:
    """torch.distributed over the MPI ranks of ``world_comm`` (same ranks, same size), its
    store at rank 0's routable address, which MPI hands the others; a bad address stops
    every rank alike. The GPU, where ``backend`` is nccl, is set by the caller."""
    import torch.distributed as dist

    hostnames = world_comm.allgather(socket.gethostname())
    address = None
    if world_comm.Get_rank() == 0:
        try:
            host = rendezvous_host(hostnames, interface_addresses(), os.environ.get(RENDEZVOUS_ENV))
            with socket.socket() as s:
                s.bind(("", 0))
                address = (host, s.getsockname()[1])
        except XbenchError as exc:
            address = str(exc)
    address = world_comm.bcast(address, root=0)
    if isinstance(address, str):
        raise XbenchError(address)
    host, port = address
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{port}",
        rank=world_comm.Get_rank(),
        world_size=world_comm.Get_size(),
    )


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
        init_process_group(world_comm, backend)

    def connect(self) -> None:
        """One untimed exchange: NCCL builds a pair's point-to-point communicator lazily, on
        its first send, which would otherwise land in the first case's calibration."""
        self.exchange(1, 1, 1)

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
