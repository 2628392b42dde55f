"""Measurement patterns: which loop a case runs and how its elapsed time becomes a metric.

- ``latency``: ping-pong; one-way latency = half the round trip (osu_latency).
- ``bandwidth``: ``window`` messages in flight, then an ack (osu_bw); MB = 10^6 B.
- ``bibw``: both directions at once (osu_bibw); counts the bytes of both directions.
- ``rtt``: batched round trip, the wire part of routing a query: b rows of P bytes out,
  b rows of R bytes back, one message each way.
- ``gather``: the wire part of fetching a selection: k blocks of s bytes as k messages,
  packed into one message (pack + unpack included), and as one contiguous message.
- ``offcache``: ping-pong with cold caches (Intel IMB's ``-off_cache``): before every round
  trip both ranks write a buffer twice the last-level cache, untimed, so each message starts
  as one sent after attention has streamed the KV cache through the CPU; one-way = half
  the round trip.
- ``offgather``: the gather pattern's fetch of k blocks as k messages with caches flushed
  as ``offcache`` flushes them, as a fetch that follows attention finds its pages: the
  per-block wire the model charges a fetch sent page by page (``n_seg`` > 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xbench.core.units import format_size
from xbench.errors import XbenchError
from xbench.fabric.transport import FETCH_MODES, BufferPlan

PATTERNS = ("latency", "bandwidth", "bibw", "rtt", "gather", "offcache", "offgather")
OFFCACHE_MAX_ITERS = 16  # round trips per sample: each costs an untimed cache flush
OFFCACHE_PATTERNS = ("offcache", "offgather")
DEFAULT_PATTERNS = ("latency", "bandwidth")


@dataclass(frozen=True)
class Case:
    pattern: str
    size_bytes: int
    metric: str
    unit: str
    rows: int | None = None
    return_bytes: int | None = None
    window: int | None = None
    blocks: int | None = None
    block_bytes: int | None = None
    mode: str | None = None

    @property
    def label(self) -> str:
        if self.pattern == "rtt":
            return f"rtt {self.rows}x{format_size(self.size_bytes // self.rows)}"
        if self.pattern == "gather":
            return f"gather {self.mode} {self.blocks}x{format_size(self.block_bytes)}"
        if self.pattern == "offgather":
            return f"offgather {self.blocks}x{format_size(self.block_bytes)}"
        return f"{self.pattern} {format_size(self.size_bytes)}"

    def run(self, transport, iters: int) -> float:
        """Run the case's loop ``iters`` times; elapsed seconds on this rank."""
        if self.pattern == "latency":
            return transport.exchange(self.size_bytes, self.size_bytes, iters)
        if self.pattern == "rtt":
            return transport.exchange(self.size_bytes, self.return_bytes, iters)
        if self.pattern == "bandwidth":
            return transport.window(self.size_bytes, self.window, iters)
        if self.pattern == "bibw":
            return transport.biwindow(self.size_bytes, self.window, iters)
        if self.pattern == "gather":
            return transport.fetch(self.mode, self.blocks, self.block_bytes, iters)
        if self.pattern == "offcache":
            return transport.exchange_offcache(self.size_bytes, iters)
        if self.pattern == "offgather":
            return transport.fetch_offcache(self.mode, self.blocks, self.block_bytes, iters)
        raise ValueError(self.pattern)

    def value(self, elapsed: float, iters: int) -> float:
        """Per-iteration figure in ``unit`` from the elapsed seconds of ``iters``."""
        if self.pattern in ("latency", "offcache"):
            return elapsed / (2 * iters) * 1e6
        if self.pattern in ("rtt", "gather", "offgather"):
            return elapsed / iters * 1e6
        if self.pattern == "bandwidth":
            return self.size_bytes * self.window * iters / elapsed / 1e6
        if self.pattern == "bibw":
            return 2 * self.size_bytes * self.window * iters / elapsed / 1e6
        raise ValueError(self.pattern)

    def first_iters(self) -> int:
        """Iterations of the calibration sample: about a millisecond at 1 GB/s."""
        if self.pattern in OFFCACHE_PATTERNS:
            return 1
        moved = (
            self.size_bytes * (self.window or 1) * (2 if self.pattern in ("latency", "bibw") else 1)
        )
        return max(1, min(1000, 10**6 // max(moved, 1)))

    @property
    def max_iters(self) -> int | None:
        """A cap on iterations per sample where untimed work surrounds each one."""
        return OFFCACHE_MAX_ITERS if self.pattern in OFFCACHE_PATTERNS else None


# OSU micro-benchmarks' own counts (osu_util.h, 5.x-7.x): (iterations, skipped iterations)
# for messages up to LARGE_MESSAGE_SIZE and above it; a bandwidth iteration is one window.
OSU_LARGE_MESSAGE = 8192
OSU_COUNTS = {
    "latency": ((10_000, 100), (1_000, 10)),  # osu_latency: LAT_LOOP_*, LAT_SKIP_*
    "bandwidth": ((100, 10), (20, 2)),  # osu_bw: BW_LOOP_*, BW_SKIP_*
    "bibw": ((100, 10), (20, 2)),  # osu_bibw
}


def osu_counts(case: Case) -> tuple[int, int]:
    """(iterations, skip) that OSU's benchmark of this pattern uses at this size."""
    small, large = OSU_COUNTS[case.pattern]
    return small if case.size_bytes <= OSU_LARGE_MESSAGE else large


# The most messages a bandwidth window posts before its ack: OSU's MAX_REQ_NUM, the size
# of the request arrays its window fills (osu_util.h).
MOST_IN_FLIGHT = 1000


@dataclass(frozen=True)
class SweepSpec:
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    sizes: tuple[int, ...] = ()
    window: int = 64
    rows: tuple[int, ...] = (1, 8, 64)
    payload: int = 1152
    return_bytes: int = 1028
    blocks: tuple[int, ...] = (1, 4, 16, 64)
    block_bytes: int = 73728  # one 64-token page of bf16 MLA cache
    fetch_modes: tuple[str, ...] = field(default=FETCH_MODES)

    def __post_init__(self):
        """The sweep's rules, wherever it comes from (the command line, a stored run)."""
        largest = max(max(self.sizes, default=0), self.payload * max(self.rows, default=0))
        if largest >= 2**31:
            raise XbenchError(
                "messages of 2 GiB or more are not supported", "keep sizes below 2GiB"
            )
        if self.window < 1:
            raise XbenchError(
                f"--window {self.window}: a window holds messages", "pass e.g. --window 64"
            )
        if self.window > MOST_IN_FLIGHT:
            raise XbenchError(
                f"--window {self.window:,}: at most {MOST_IN_FLIGHT:,} messages in flight (OSU's "
                "request arrays hold as many; each posted message holds MPI's memory)",
                "pass e.g. --window 64, OSU's default",
            )

    @classmethod
    def from_dict(cls, data: dict) -> SweepSpec:
        """The inverse of ``dataclasses.asdict`` after a JSON round trip (lists back to tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def plan_cases(spec: SweepSpec) -> list[Case]:
    """Every case of a sweep, in the order they run (pattern by pattern, small to large)."""
    cases: list[Case] = []
    for pattern in spec.patterns:
        if pattern == "latency":
            cases += [Case("latency", n, "latency_oneway", "us") for n in spec.sizes]
        elif pattern == "offcache":
            cases += [Case("offcache", n, "latency_oneway_offcache", "us") for n in spec.sizes]
        elif pattern == "bandwidth":
            cases += [
                Case("bandwidth", n, "bandwidth_window", "MB/s", window=spec.window)
                for n in spec.sizes
            ]
        elif pattern == "bibw":
            cases += [
                Case("bibw", n, "bandwidth_bidir", "MB/s", window=spec.window) for n in spec.sizes
            ]
        elif pattern == "rtt":
            cases += [
                Case(
                    "rtt", b * spec.payload, "rtt", "us", rows=b, return_bytes=b * spec.return_bytes
                )
                for b in spec.rows
            ]
        elif pattern == "gather":
            cases += [
                Case(
                    "gather",
                    k * spec.block_bytes,
                    f"fetch_{mode}",
                    "us",
                    blocks=k,
                    block_bytes=spec.block_bytes,
                    mode=mode,
                )
                for k in spec.blocks
                for mode in spec.fetch_modes
            ]
        elif pattern == "offgather":  # the page-by-page fetch the model charges n_seg > 1
            cases += [
                Case(
                    "offgather",
                    k * spec.block_bytes,
                    "fetch_messages_offcache",
                    "us",
                    blocks=k,
                    block_bytes=spec.block_bytes,
                    mode="messages",
                )
                for k in spec.blocks
            ]
        else:
            raise ValueError(f"unknown pattern {pattern}")
    return cases


def buffer_plan(spec: SweepSpec) -> BufferPlan:
    """The buffers a transport allocates for this sweep."""
    message, window, blocks, block = buffer_needs(plan_cases(spec))
    return BufferPlan(message_bytes=message, window=window, blocks=blocks, block_bytes=block)


def buffer_needs(cases: list[Case]) -> tuple[int, int, int, int]:
    """(largest message, largest window, most blocks, block bytes) over the cases."""
    message = max(
        [c.size_bytes for c in cases if c.blocks is None]
        + [c.return_bytes or 0 for c in cases]
        + [1]
    )
    window = max([c.window or 1 for c in cases] + [1])
    blocks = max([c.blocks or 1 for c in cases] + [1])
    block = max([c.block_bytes or 1 for c in cases] + [1])
    return message, window, blocks, block
