"""The transport interface: timed inner loops of the probe patterns over one rank pair.

A transport owns its buffers (host memory here; device memory for the GPU transports) and
implements four loops. Each loop runs ``iters`` repetitions and returns the elapsed seconds
measured on the calling rank; the probe patterns turn those into metrics. Keeping whole
loops inside the transport (rather than single sends) is what lets the inner loop run in
compiled code or on the device, so the figure measures the fabric, not Python.
"""

from __future__ import annotations

import mmap
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

FETCH_MODES = ("messages", "packed", "contiguous")

# Host buffers mapped early by reserve_host_buffers, by size, waiting for a transport.
_reserved: dict[int, list[np.ndarray]] = {}


@dataclass
class Pair:
    """The two ranks of one measurement: ``me`` is 0 (initiator) or 1 (responder)."""

    comm: object  # mpi4py communicator of exactly these two ranks
    me: int
    world_ranks: tuple[int, int]
    hosts: tuple[str, str]

    @property
    def peer(self) -> int:
        return 1 - self.me

    @property
    def initiator(self) -> bool:
        return self.me == 0

    @property
    def same_host(self) -> bool:
        return self.hosts[0] == self.hosts[1]


@dataclass
class BufferPlan:
    """The largest buffers any case of the sweep needs, allocated once and touched."""

    message_bytes: int  # latency / bandwidth / rtt messages
    window: int
    blocks: int  # gather: most blocks
    block_bytes: int


def host_buffer_sizes(plan: BufferPlan) -> list[int]:
    """Bytes of each host buffer a transport maps for ``plan``, in the order it maps them."""
    k, s = plan.blocks, plan.block_bytes
    return [plan.message_bytes, plan.message_bytes, 2 * k * s, k * s]


def reserve_host_buffers(plan: BufferPlan) -> None:
    """Map and write a transport's host buffers now, before the rank loads heavier libraries.

    A C benchmark's ranks map their buffers in a near-empty process, just after MPI_Init.
    On the development VM the same 16 MiB shared-memory stream ran 10-20 % faster from
    buffers mapped after pyarrow and pandas had loaded than from buffers mapped before them,
    and osu_bw likewise with 160 MB allocated ahead of its buffers, for reasons not pinned
    down; the probe's ranks reserve early so their buffers sit where a C benchmark's would.
    """
    for nbytes in host_buffer_sizes(plan):
        buf = _map_anonymous(nbytes)
        buf.fill(0)  # first touch now: the pages are taken here, not later
        _reserved.setdefault(buf.nbytes, []).append(buf)


def _map_anonymous(nbytes: int) -> np.ndarray:
    region = mmap.mmap(-1, max(int(nbytes), 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(region, dtype=np.uint8)


class Transport(ABC):
    """One way of moving bytes between the two ranks of a pair."""

    name: str = "?"
    device: str = "host"
    loop: str = "python"  # which timed loop runs: "c" or "python"

    def __init__(self, pair: Pair, plan: BufferPlan, *, seed: int = 0):
        self.pair = pair
        self.plan = plan
        rng = np.random.default_rng(seed + pair.me)
        self._host_buffers: list[np.ndarray] = []  # what return_buffers hands back
        # Distinct, written contents: untouched pages would flatter the first samples.
        # The sizes come from host_buffer_sizes, which the early reservation maps too.
        # cache: a paged cache, half of it free; staging: one packed selection.
        fills = (0x5A + pair.me, 0xA5 - pair.me, 0x33 + pair.me, 0x44 + pair.me)
        self.sbuf, self.rbuf, self.cache, self.staging = (
            self._buffer(n, fill=f) for n, f in zip(host_buffer_sizes(plan), fills, strict=True)
        )
        k, s = plan.blocks, plan.block_bytes
        # Blocks sit at scattered pages of the cache, as a selection would find them.
        self.offsets = (rng.permutation(2 * k)[:k] * s).astype(np.int64)
        self._flush = None  # the offcache patterns' flush buffer (host or GPU), on first use

    @staticmethod
    def _host_buffer(nbytes: int, fill: int) -> np.ndarray:
        """Page-aligned anonymous memory, written once.

        Allocated with mmap rather than numpy: numpy advises transparent huge pages on
        large arrays, which C benchmarks (posix_memalign + memset) do not get, and which
        made large shared-memory transfers look twice as fast as osu_bw here. Taken from
        the early reservation (:func:`reserve_host_buffers`) when it holds one this size.
        """
        waiting = _reserved.get(max(int(nbytes), 1))
        buf = waiting.pop() if waiting else _map_anonymous(nbytes)
        buf.fill(fill & 0xFF)
        return buf

    def _buffer(self, nbytes: int, fill: int):
        """Where this transport's buffers live; device transports override it."""
        buf = self._host_buffer(nbytes, fill)
        self._host_buffers.append(buf)
        return buf

    def return_buffers(self) -> None:
        """Hand the host buffers back to the reservation, for the next pair's transport."""
        for buf in self._host_buffers:
            _reserved.setdefault(buf.nbytes, []).append(buf)
        self._host_buffers = []

    @staticmethod  # noqa: B027 - optional hook
    def setup_world(world_comm, cfg, plan) -> None:  # noqa: B027 - optional hook
        """Once per run on every rank, before any pair connects (process groups, NVSHMEM init);
        ``plan``: the buffers every pair's transport will take (host_buffer_sizes)."""

    @staticmethod  # noqa: B027 - optional hook
    def teardown_world(world_comm) -> None:  # noqa: B027 - optional hook
        """Once per run on every rank, after the last pair (free, finalize)."""

    def connect(self) -> None:  # noqa: B027 - optional hook, most transports need none
        """Establish whatever the transport needs between the pair (collective on the pair)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def state(self) -> str:
        """One line on what the connection is waiting for, for a hang report (the watchdog's):
        what the transport can read without its peer; empty where it has nothing to say."""
        return ""

    @abstractmethod
    def exchange(self, send_n: int, recv_n: int, iters: int) -> float:
        """Initiator sends ``send_n`` bytes, responder answers ``recv_n``; repeat."""

    @abstractmethod
    def window(self, n: int, window: int, iters: int) -> float:
        """Initiator streams ``window`` messages of ``n`` bytes, responder acknowledges."""

    @abstractmethod
    def biwindow(self, n: int, window: int, iters: int) -> float:
        """Both ranks stream ``window`` messages of ``n`` bytes at once."""

    @abstractmethod
    def fetch(self, mode: str, k: int, block: int, iters: int) -> float:
        """Requester (initiator) pulls ``k`` blocks of ``block`` bytes from the holder."""

    def exchange_offcache(self, nbytes: int, iters: int) -> float:
        """Ping-pong with cold caches (IMB's -off_cache); only the round trips are timed.

        Before each round trip both ranks write one byte per cache line of a buffer twice
        the last-level cache (dirty lines push the message buffers out), then meet at a
        barrier so neither times the other's flush.
        """
        total = 0.0
        for _ in range(iters):
            self._flush_caches()
            self.pair.comm.Barrier()
            total += self.exchange(nbytes, nbytes, 1)
        return total

    def fetch_offcache(self, mode: str, k: int, block: int, iters: int) -> float:
        """``fetch`` with cold caches, flushed as :meth:`exchange_offcache` flushes: the
        holder's pages and the requester's free pages out of cache, as a fetch that follows
        attention finds them, not as the previous fetch left them in cache, which would
        time the pages' copy far cheaper than a serving cache pays it)."""
        total = 0.0
        for _ in range(iters):
            self._flush_caches()
            self.pair.comm.Barrier()
            total += self.fetch(mode, k, block, 1)
        return total

    def _flush_caches(self) -> None:
        """Push the message buffers out of the cache in front of them: the host's last-level
        cache (one byte a line of a buffer twice its size, written), or, for buffers on a
        GPU, its L2 (a device buffer twice the L2 written, then waited for); a flush of
        the host's caches leaves a GPU's L2 as it was."""
        if self.device == "cuda":
            from xbench.fabric.gpu import torch_module

            torch = torch_module()
            if self._flush is None:
                l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
                self._flush = torch.empty(2 * max(int(l2), 1), dtype=torch.uint8, device="cuda")
            self._flush.add_(1)
            torch.cuda.synchronize()
            return
        if self._flush is None:
            from xbench.host import llc_bytes

            self._flush = self._host_buffer(2 * llc_bytes(), fill=0)
        self._flush[::64] += 1

    def empty_loop(self, iters: int) -> float:
        """The timed loop with nothing in it: the tool's own per-iteration overhead."""
        import time

        t0 = time.perf_counter()
        for _ in range(iters):
            pass
        return time.perf_counter() - t0
