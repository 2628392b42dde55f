"""MPI point-to-point with host buffers: whatever MPI mpi4py loaded (shm, UCX, OFI, ...)."""

from __future__ import annotations

import ctypes
import time

from xbench.fabric.transport import FETCH_MODES, Transport


def _ptr(arr, offset: int = 0) -> int:
    return arr.ctypes.data + offset


class MpiHostTransport(Transport):
    """MPI_Send/MPI_Recv and windows of MPI_Isend/MPI_Irecv, looped in C when possible."""

    name = "mpi"

    def __init__(self, pair, plan, *, loop: str = "auto", seed: int = 0):
        super().__init__(pair, plan, seed=seed)
        from mpi4py import MPI

        self.MPI = MPI
        self.lib = None
        if loop in ("auto", "c"):
            from xbench.fabric.cloop import LoopUnavailable, load_loops

            try:
                self.lib = load_loops()
            except (LoopUnavailable, OSError) as exc:
                if loop == "c":
                    raise
                self.fallback_reason = str(exc)
        self.loop = "c" if self.lib is not None else "python"
        nreq = max(2 * plan.window, plan.blocks, 1)
        self._reqs = (ctypes.c_byte * (MPI._sizeof(MPI.Request) * nreq))()
        self._comm_addr = MPI._addressof(pair.comm)

    def _addr(self, buf, offset: int = 0) -> int:
        """Address of a buffer for the compiled loop (host numpy here; device tensors in subclasses)."""
        return buf.ctypes.data + offset

    # -- compiled loops ---------------------------------------------------------------
    def exchange(self, send_n, recv_n, iters):
        p = self.pair
        if self.lib:
            return self.lib.xb_mpi_exchange(
                self._comm_addr,
                p.peer,
                int(p.initiator),
                self._addr(self.sbuf),
                send_n,
                self._addr(self.rbuf),
                recv_n,
                iters,
            )
        comm, peer = p.comm, p.peer
        sb, rb = memoryview(self.sbuf), memoryview(self.rbuf)
        t0 = time.perf_counter()
        for _ in range(iters):
            if p.initiator:
                comm.Send(sb[:send_n], peer, 11)
                comm.Recv(rb[:recv_n], peer, 11)
            else:
                comm.Recv(rb[:send_n], peer, 11)
                comm.Send(sb[:recv_n], peer, 11)
        return time.perf_counter() - t0

    def window(self, n, window, iters):
        p = self.pair
        if self.lib:
            return self.lib.xb_mpi_window(
                self._comm_addr,
                p.peer,
                int(p.initiator),
                self._addr(self.sbuf if p.initiator else self.rbuf),
                n,
                window,
                iters,
                ctypes.addressof(self._reqs),
            )
        comm, peer, MPI = p.comm, p.peer, self.MPI
        buf = memoryview(self.sbuf if p.initiator else self.rbuf)[:n]
        ack = bytearray(4)
        t0 = time.perf_counter()
        for _ in range(iters):
            if p.initiator:
                MPI.Request.Waitall([comm.Isend(buf, peer, 11) for _ in range(window)])
                comm.Recv(ack, peer, 12)
            else:
                MPI.Request.Waitall([comm.Irecv(buf, peer, 11) for _ in range(window)])
                comm.Send(ack, peer, 12)
        return time.perf_counter() - t0

    def biwindow(self, n, window, iters):
        p = self.pair
        if self.lib:
            return self.lib.xb_mpi_biwindow(
                self._comm_addr,
                p.peer,
                self._addr(self.sbuf),
                self._addr(self.rbuf),
                n,
                window,
                iters,
                ctypes.addressof(self._reqs),
            )
        comm, peer, MPI = p.comm, p.peer, self.MPI
        sb, rb = memoryview(self.sbuf)[:n], memoryview(self.rbuf)[:n]
        t0 = time.perf_counter()
        for _ in range(iters):
            reqs = [comm.Irecv(rb, peer, 11) for _ in range(window)]
            reqs += [comm.Isend(sb, peer, 11) for _ in range(window)]
            MPI.Request.Waitall(reqs)
        return time.perf_counter() - t0

    def fetch(self, mode, k, block, iters):
        p = self.pair
        m = FETCH_MODES.index(mode)
        if self.lib:
            return self.lib.xb_mpi_fetch(
                self._comm_addr,
                p.peer,
                int(p.initiator),
                m,
                self._addr(self.cache),
                _ptr(self.offsets),
                k,
                block,
                self._addr(self.staging),
                iters,
                ctypes.addressof(self._reqs),
            )
        comm, peer, MPI = p.comm, p.peer, self.MPI
        cache, staging = memoryview(self.cache), memoryview(self.staging)
        offs = [int(o) for o in self.offsets[:k]]
        req = bytearray(1)
        t0 = time.perf_counter()
        for _ in range(iters):
            if p.initiator:
                comm.Send(req, peer, 12)
                if m == 0:
                    MPI.Request.Waitall([comm.Irecv(cache[o : o + block], peer, 11) for o in offs])
                else:
                    comm.Recv(staging[: k * block], peer, 11)
                    if m == 1:
                        for j, o in enumerate(offs):
                            cache[o : o + block] = staging[j * block : (j + 1) * block]
            else:
                comm.Recv(req, peer, 12)
                if m == 0:
                    MPI.Request.Waitall([comm.Isend(cache[o : o + block], peer, 11) for o in offs])
                else:
                    if m == 1:
                        for j, o in enumerate(offs):
                            staging[j * block : (j + 1) * block] = cache[o : o + block]
                    comm.Send(staging[: k * block], peer, 11)
        return time.perf_counter() - t0

    def empty_loop(self, iters):
        if self.lib:
            return self.lib.xb_empty(iters)
        return super().empty_loop(iters)
