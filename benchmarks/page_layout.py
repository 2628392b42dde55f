"""Physical page layout of a running process's large anonymous buffers (Linux, as root).

    python benchmarks/page_layout.py PID [PID ...] [--min-size 4MiB]

For each private anonymous mapping of at least ``--min-size`` (probe and OSU buffers are
such mappings), reads ``/proc/PID/pagemap`` and prints how much of it is resident, how
long the runs of physically consecutive pages are, and the span of guest-physical memory
its pages come from. Used to compare where osu_bw's and xbench's buffers live while both
stream the same sizes (issue 2: TLB reach and cache sets depend on this layout, not on
the benchmark loop). Without CAP_SYS_ADMIN the kernel hides page frame numbers and the
script says so.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys

from xbench.core.units import parse_size

PAGE = 4096
PRESENT = 1 << 63
PFN_MASK = (1 << 55) - 1


def anonymous_mappings(pid: int, min_bytes: int):
    """(start, end) of private anonymous read-write mappings of at least ``min_bytes``."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if len(fields) == 5 and fields[1].startswith("rw") and end - start >= min_bytes:
                yield start, end


def frames(pid: int, start: int, end: int) -> list[int | None]:
    """Page frame number of each page of [start, end), None where not resident."""
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(start // PAGE * 8)
        raw = pagemap.read((end - start) // PAGE * 8)
    return [e & PFN_MASK if e & PRESENT else None for (e,) in struct.iter_unpack("Q", raw)]


def runs(pfns: list[int | None]) -> list[int]:
    """Lengths of the runs of physically consecutive resident pages."""
    out, length, prev = [], 0, None
    for pfn in pfns:
        if pfn is not None and prev is not None and pfn == prev + 1:
            length += 1
        else:
            if length:
                out.append(length)
            length = 1 if pfn is not None else 0
        prev = pfn
    if length:
        out.append(length)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pids", type=int, nargs="+")
    ap.add_argument("--min-size", default="4MiB", help="smallest mapping to report")
    args = ap.parse_args()
    min_bytes = parse_size(args.min_size)
    for pid in args.pids:
        for start, end in anonymous_mappings(pid, min_bytes):
            pfns = frames(pid, start, end)
            resident = [p for p in pfns if p is not None]
            if not resident:
                continue
            if not any(resident):
                sys.exit("page frame numbers are hidden: run as root (CAP_SYS_ADMIN)")
            lengths = runs(pfns)
            in_fours = sum(n for n in lengths if n >= 4) / len(resident)
            print(
                f"pid {pid} mapping {(end - start) >> 20} MiB: resident {len(resident) * PAGE >> 20} MiB, "
                f"runs of consecutive frames mean {statistics.mean(lengths):.1f} pages "
                f"(max {max(lengths)}), {100 * in_fours:.0f} % in runs >= 4, "
                f"frames span {min(resident) * PAGE / 2**30:.2f}-{max(resident) * PAGE / 2**30:.2f} GiB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
