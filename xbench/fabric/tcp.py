"""Plain TCP sockets between the two ranks: the Ethernet path an MPI over InfiniBand skips.

The responder listens on the address of ``--tcp-interface`` (or loopback when both ranks
share a host, or the address its hostname resolves to), sends (address, port) to the
initiator over MPI, and the initiator connects. Nagle is off (TCP_NODELAY), as every
latency benchmark over TCP sets it.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import threading
import time

from xbench.errors import XbenchError
from xbench.fabric.transport import FETCH_MODES, Transport

SIOCGIFADDR = 0x8915
SIOCINQ, SIOCOUTQ = 0x541B, 0x5411  # bytes received and not read; sent and not acknowledged
# struct tcp_info (linux/tcp.h) up to tcpi_total_retrans: eight one-byte fields (the two
# last bit fields), then 24 u32: rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans,
# fackets, last_data_sent, last_ack_sent, last_data_recv, last_ack_recv, pmtu, rcv_ssthresh,
# rtt, rttvar, snd_ssthresh, snd_cwnd, advmss, reordering, rcv_rtt, rcv_space, total_retrans
TCP_INFO_FORMAT = "8B24I"
TCP_STATES = dict(  # linux/tcp_states.h
    enumerate(
        "established syn-sent syn-received fin-wait-1 fin-wait-2 time-wait closed close-wait "
        "last-ack listen closing".split(),
        start=1,
    )
)


def interface_address(name: str) -> str:
    """IPv4 address of a network interface, or a one-line error naming the choices."""
    names = [n for _, n in socket.if_nameindex()]
    if name not in names:
        raise XbenchError(
            f"no network interface {name!r} on {socket.gethostname()}",
            f"pick one of {', '.join(names)} for --tcp-interface",
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:
            raise XbenchError(
                f"interface {name!r} has no IPv4 address",
                "pick an interface with an address for --tcp-interface",
            ) from None
    return socket.inet_ntoa(packed[20:24])


def connection_state(sock: socket.socket) -> str:
    """What the kernel knows of a TCP connection, in one line: what a stalled transfer is
    waiting on (a retransmission timer backing off, a full window, a peer that reads
    nothing), from TCP_INFO and the socket's queues; Linux only."""
    size = struct.calcsize(TCP_INFO_FORMAT)
    info = struct.unpack(
        TCP_INFO_FORMAT, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, size)
    )
    state, _, retransmits, probes, backoff = info[:5]
    rto, _, mss, _, unacked, _, lost, retrans = info[8:16]
    last_sent, _, last_received = info[17:20]
    rtt, cwnd, total_retrans = info[23], info[26], info[31]
    queued = []
    for name, request in (("unread", SIOCINQ), ("unacknowledged", SIOCOUTQ)):
        raw = fcntl.ioctl(sock.fileno(), request, struct.pack("i", 0))
        queued.append(f"{struct.unpack('i', raw)[0]:,} B {name}")
    return (
        f"TCP {TCP_STATES.get(state, f'state {state}')}: {', '.join(queued)}; "
        f"{unacked} segments in flight ({lost} lost, {retrans} being retransmitted), "
        f"cwnd {cwnd} x {mss} B, rtt {rtt / 1e3:g} ms, rto {rto / 1e3:g} ms "
        f"(backoff {backoff}, {retransmits} timeouts in a row, {probes} window probes), "
        f"{total_retrans} retransmitted in all; last data sent {last_sent} ms ago, "
        f"received {last_received} ms ago"
    )


def _recv_into_all(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionError("peer closed the TCP connection")
        view = view[got:]


class TcpTransport(Transport):
    name = "tcp"

    def __init__(
        self, pair, plan, *, loop: str = "auto", interface: str | None = None, seed: int = 0
    ):
        super().__init__(pair, plan, seed=seed)
        self.interface = interface
        self.lib = None
        if loop in ("auto", "c"):
            from xbench.fabric.cloop import LoopUnavailable, load_loops

            try:
                self.lib = load_loops()
            except (LoopUnavailable, OSError):
                if loop == "c":
                    raise
        self.loop = "c" if self.lib is not None else "python"
        self.sock: socket.socket | None = None
        self.address: str | None = None

    def _listen_address(self) -> str:
        if self.interface:
            return interface_address(self.interface)
        if self.pair.same_host:
            return "127.0.0.1"
        return socket.gethostbyname(socket.gethostname())

    def connect(self) -> None:
        comm = self.pair.comm
        if not self.pair.initiator:
            error, listener = None, None
            try:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((self._listen_address(), 0))
                listener.listen(1)
                endpoint = listener.getsockname()
            except (OSError, XbenchError) as exc:
                error, endpoint = str(exc), None
            # ssend: back only once rank 0 has the message. accept() below blocks outside
            # MPI, and a plain send may still wait for this rank's progress to leave (MPICH
            # over OFI's tcp provider does): rank 0 would never learn where to connect.
            comm.ssend((endpoint, error), dest=0, tag=21)
            if error:
                raise XbenchError(
                    f"TCP listener failed on rank {self.pair.world_ranks[1]}: {error}",
                    "check --tcp-interface",
                )
            listener.settimeout(60)
            try:
                self.sock, _ = listener.accept()
            except OSError as exc:
                raise XbenchError(
                    f"rank {self.pair.world_ranks[1]}: no connection from rank "
                    f"{self.pair.world_ranks[0]} on {endpoint[0]}:{endpoint[1]} ({exc})",
                    "check --tcp-interface: the ranks' hosts must reach that address",
                ) from None
            finally:
                listener.close()
        else:
            endpoint, error = comm.recv(source=1, tag=21)
            if error:
                raise XbenchError(
                    f"TCP listener failed on rank {self.pair.world_ranks[1]}: {error}",
                    "check --tcp-interface",
                )
            try:
                self.sock = socket.create_connection(tuple(endpoint), timeout=60)
            except OSError as exc:
                raise XbenchError(
                    f"rank {self.pair.world_ranks[0]}: cannot connect to rank "
                    f"{self.pair.world_ranks[1]} at {endpoint[0]}:{endpoint[1]} ({exc})",
                    "check --tcp-interface: the ranks' hosts must reach that address",
                ) from None
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.address = f"{endpoint[0]}:{endpoint[1]}"

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def state(self) -> str:
        if self.sock is None:
            return "TCP: not connected"
        try:
            return connection_state(self.sock)
        except OSError as exc:
            return f"TCP: the kernel's state could not be read ({exc})"

    @staticmethod
    def _check(elapsed: float) -> float:
        if elapsed < 0:
            raise ConnectionError("TCP peer closed the connection or the socket failed")
        return elapsed

    def exchange(self, send_n, recv_n, iters):
        me = self.pair.initiator
        if self.lib:
            return self._check(
                self.lib.xb_tcp_exchange(
                    self.sock.fileno(),
                    int(me),
                    self.sbuf.ctypes.data,
                    send_n,
                    self.rbuf.ctypes.data,
                    recv_n,
                    iters,
                )
            )
        sb, rb, s = memoryview(self.sbuf), memoryview(self.rbuf), self.sock
        t0 = time.perf_counter()
        for _ in range(iters):
            if me:
                s.sendall(sb[:send_n])
                _recv_into_all(s, rb[:recv_n])
            else:
                _recv_into_all(s, rb[:send_n])
                s.sendall(sb[:recv_n])
        return time.perf_counter() - t0

    def window(self, n, window, iters):
        me = self.pair.initiator
        buf = self.sbuf if me else self.rbuf
        if self.lib:
            return self._check(
                self.lib.xb_tcp_window(
                    self.sock.fileno(), int(me), buf.ctypes.data, n, window, iters
                )
            )
        view, s, ack = memoryview(buf)[:n], self.sock, bytearray(1)
        t0 = time.perf_counter()
        for _ in range(iters):
            if me:
                for _ in range(window):
                    s.sendall(view)
                _recv_into_all(s, memoryview(ack))
            else:
                for _ in range(window):
                    _recv_into_all(s, view)
                s.sendall(ack)
        return time.perf_counter() - t0

    def biwindow(self, n, window, iters):
        if self.lib:
            return self._check(
                self.lib.xb_tcp_duplex(
                    self.sock.fileno(),
                    self.sbuf.ctypes.data,
                    self.rbuf.ctypes.data,
                    n,
                    window,
                    iters,
                )
            )
        sb, rb, s = memoryview(self.sbuf)[:n], memoryview(self.rbuf)[:n], self.sock

        def send_all():
            for _ in range(window):
                s.sendall(sb)

        t0 = time.perf_counter()
        for _ in range(iters):
            sender = threading.Thread(target=send_all)
            sender.start()
            for _ in range(window):
                _recv_into_all(s, rb)
            sender.join()
        return time.perf_counter() - t0

    def fetch(self, mode, k, block, iters):
        me, m = self.pair.initiator, FETCH_MODES.index(mode)
        if self.lib:
            return self._check(
                self.lib.xb_tcp_fetch(
                    self.sock.fileno(),
                    int(me),
                    m,
                    self.cache.ctypes.data,
                    self.offsets.ctypes.data,
                    k,
                    block,
                    self.staging.ctypes.data,
                    iters,
                )
            )
        s, cache, staging = self.sock, memoryview(self.cache), memoryview(self.staging)
        offs = [int(o) for o in self.offsets[:k]]
        t0 = time.perf_counter()
        for _ in range(iters):
            if me:
                s.sendall(b"\x01")
                if m == 0:
                    for o in offs:
                        _recv_into_all(s, cache[o : o + block])
                else:
                    _recv_into_all(s, staging[: k * block])
                    if m == 1:
                        for j, o in enumerate(offs):
                            cache[o : o + block] = staging[j * block : (j + 1) * block]
            else:
                _recv_into_all(s, memoryview(bytearray(1)))
                if m == 0:
                    for o in offs:
                        s.sendall(cache[o : o + block])
                else:
                    if m == 1:
                        for j, o in enumerate(offs):
                            staging[j * block : (j + 1) * block] = cache[o : o + block]
                    s.sendall(staging[: k * block])
        return time.perf_counter() - t0

    def empty_loop(self, iters):
        if self.lib:
            return self.lib.xb_empty(iters)
        return super().empty_loop(iters)
