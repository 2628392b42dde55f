"""Strict parsing and formatting of byte sizes and durations.

Sizes: ``B``, decimal ``KB MB GB TB`` (powers of 1000, as OSU and IMB print bandwidth) and
binary ``KiB MiB GiB TiB`` (powers of 1024). A bare integer is a count of bytes. Anything
else (``1KX``, ``1k``, ``1kb``, ``-1B``) is rejected: a benchmark that silently reads
``1kb`` as 1000 bits or 1024 bytes measures the wrong thing.

Lists: ``8B,1KB,64KiB``; ranges: ``1B:64MiB`` doubles from the low end up to the high end
inclusive, ``1KiB:1MiB:x4`` multiplies by 4 instead.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from xbench.errors import XbenchError

SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# No message, payload or buffer of any sweep or request comes near a pebibyte; past 2^53 a
# size no longer survives the float columns it is stored in
MOST_BYTES = 2**50

_NUMBER_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_SIZE_HELP = "write sizes like 8B, 1KB (1000 B), 64KiB (1024 B), 16MiB or a range 8B:16MiB"


def parse_size(text: str) -> int:
    """Parse one size to a whole number of bytes."""
    match = _NUMBER_UNIT.match(str(text))
    if not match:
        raise XbenchError(f"bad size {text!r}", _SIZE_HELP)
    number, unit = match.groups()
    unit = unit or "B"
    if unit not in SIZE_UNITS:
        raise XbenchError(f"bad size {text!r}: unknown unit {unit!r}", _SIZE_HELP)
    # exact arithmetic: a float of 400 digits is infinite, and 1.1KB is not a float's 1100.0000x
    value = Fraction(number) * SIZE_UNITS[unit]
    if value.denominator != 1:
        raise XbenchError(f"bad size {text!r}: not a whole number of bytes", _SIZE_HELP)
    if value > MOST_BYTES:
        raise XbenchError(
            f"bad size {text!r}: beyond any size xbench handles",
            f"keep sizes at or below {format_size(MOST_BYTES)}",
        )
    return int(value)


def parse_size_list(text: str, *, allow_zero: bool = False) -> list[int]:
    """Parse ``a,b,c`` and ``lo:hi[:xF]`` items into sorted, distinct sizes."""
    sizes: set[int] = set()
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise XbenchError(f"bad size list {text!r}: empty item", _SIZE_HELP)
        if ":" in item:
            parts = item.split(":")
            if len(parts) not in (2, 3):
                raise XbenchError(f"bad size range {item!r}", _SIZE_HELP)
            lo, hi = parse_size(parts[0]), parse_size(parts[1])
            factor = 2
            if len(parts) == 3:
                m = re.fullmatch(r"x(\d+)", parts[2].strip())
                if not m or int(m.group(1)) < 2:
                    raise XbenchError(
                        f"bad range step {parts[2]!r} in {item!r}", "write a step as x2, x4, ..."
                    )
                factor = int(m.group(1))
            if lo > hi:
                raise XbenchError(f"bad size range {item!r}: low end above high end", _SIZE_HELP)
            if lo == 0:
                sizes.add(0)
                lo = 1
            value = lo
            while value <= hi:
                sizes.add(value)
                value *= factor
        else:
            sizes.add(parse_size(item))
    if not allow_zero and 0 in sizes:
        raise XbenchError(f"bad size list {text!r}: sizes must be at least 1 B", _SIZE_HELP)
    return sorted(sizes)


# The most any counted option means (rows, tokens, reuses): a 64-bit integer's range, where
# the tables' columns hold it; a longer number is refused by name before anything else
MOST_COUNT = 2**62


def parse_int_list(
    text: str, name: str, least: int = 1, most: int | None = None, what: str = ""
) -> list[int]:
    """Parse ``1,8,64`` or a doubling range ``1:64`` of integers of at least ``least``
    (rows, tokens and blocks count from 1; a reuse may be 0) and, if given, at most ``most``
    (``what`` says why, e.g. "tokens in any context")."""
    values: set[int] = set()
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise XbenchError(
                f"bad {name} {text!r}: empty item", f"write {name} as 1,8,64 or a range 1:64"
            )
        try:
            if ":" in item:
                lo, hi = (int(p) for p in item.split(":"))
                if lo < 1 or lo > hi:
                    raise ValueError
                while lo <= hi:
                    values.add(lo)
                    lo *= 2
            else:
                values.add(int(item))
        except ValueError:
            raise XbenchError(
                f"bad {name} {text!r}", f"write {name} as 1,8,64 or a doubling range 1:64"
            ) from None
    if values and max(abs(v) for v in values) > MOST_COUNT:
        digits = str(max(values, key=abs))
        shown = digits if len(digits) < 20 else f"{digits[:8]}... ({len(digits)} digits)"
        raise XbenchError(f"{name} {shown}: beyond any count", f"keep {name} within 2^62")
    if not values or min(values) < least:
        raise XbenchError(f"bad {name} {text!r}", f"{name} must be integers of {least} or more")
    if most is not None and max(values) > most:
        raise XbenchError(
            f"bad {name} {text!r}: {max(values)} is beyond {what or 'what this option takes'}",
            f"keep {name} at or below {most}",
        )
    return sorted(values)


def parse_duration_list(text: str, name: str, least: float, most: float, example: str):
    """Parse ``500us,2ms`` and doubling ranges ``10us:1ms`` into sorted, distinct seconds,
    each within [least, most]."""
    seconds: set[float] = set()
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise XbenchError(f"bad {name} {text!r}: empty item", f"write {name} as {example}")
        try:
            ends = [parse_duration(end) for end in item.split(":")]
        except XbenchError:
            raise XbenchError(
                f"bad duration {item!r} in {name}", f"write {name} as {example}"
            ) from None
        if len(ends) > 2 or (len(ends) == 2 and not 0 < ends[0] <= ends[1]):
            raise XbenchError(
                f"bad {name} range {item!r}", f"write a doubling range low:high, e.g. {example}"
            )
        for value in (ends[0], ends[-1]):
            if not least <= value <= most:
                raise XbenchError(
                    f"{name} {item} is outside {format_duration(least)}-{format_duration(most)}",
                    f"pass times like {example}",
                )
        value = ends[0]
        seconds.add(value)
        while len(ends) == 2 and value * 2 <= ends[1] * (1 + 1e-12):
            value *= 2
            seconds.add(value)
    return sorted(seconds)


def parse_name_list(text: str, name: str, choices=None, noun: str = "") -> list[str]:
    """Parse ``a,b,c``: no empty item, no item twice, each among ``choices`` if given
    (``noun`` names one item in the message: "unknown pattern x")."""
    items = [item.strip() for item in str(text).split(",")]
    if not all(items):
        raise XbenchError(f"bad {name} {text!r}: empty item", f"write {name} as a,b with no gaps")
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:
        raise XbenchError(
            f"{name} {text!r} names {', '.join(twice)} twice", f"name each once in {name}"
        )
    if choices is not None:
        bad = [item for item in items if item not in choices]
        if bad:
            raise XbenchError(
                f"unknown {noun or name} {', '.join(bad)}", f"pick from {', '.join(choices)}"
            )
    return items


def parse_duration(text: str) -> float:
    """Parse ``3ms``, ``25us``, ``1.5s`` or ``800ns`` to seconds."""
    match = _NUMBER_UNIT.match(str(text))
    if not match or match.group(2) not in DURATION_UNITS:
        raise XbenchError(f"bad duration {text!r}", "write durations like 800ns, 25us, 3ms or 1.5s")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


def parse_rate(text: str) -> float:
    """Parse ``50/s`` (or a bare ``50``) to a finite rate per second above 0."""
    try:
        per_s = float(str(text).strip().removesuffix("/s"))
    except ValueError:
        per_s = -1.0
    if not 0 < per_s < math.inf:  # refuses nan too
        raise XbenchError(f"bad rate {text!r}", "write rates like 50/s")
    return per_s


def format_size(n: int) -> str:
    """Shortest exact binary or decimal spelling: 1024 -> 1KiB, 1000 -> 1KB, 1500 -> 1500B."""
    if n == 0:
        return "0B"
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        scale = SIZE_UNITS[unit]
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def format_duration(seconds: float) -> str:
    """Human duration with three significant figures (whole seconds from 1000 s)."""
    if abs(seconds) >= 1000:
        return f"{seconds:.0f}s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g}{unit}"
    return f"{seconds / 1e-9:.3g}ns"
