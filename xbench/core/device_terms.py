"""The catalogue of a device's terms, spelled once.

Each term: the field of :class:`xbench.core.costmodel.Device` and its key in a profile's
``[device]`` table, what one unit of it counts, the unit it prints in, which option's time
it enters, the terms it comes with, and whether a profile may leave it out. ``Device``'s
checks, the profile's reader and writer, the fit's required terms and ``xbench fit``'s
table read it; a new term is one line here (and its formula in ``costmodel``).
"""

from __future__ import annotations

from typing import NamedTuple


class DeviceTerm(NamedTuple):
    name: str
    per: str | None  # a time per this (token, row-token, row-partial, token^2); None: a time
    scale: float  # seconds in the unit it prints in
    shown: str  # that unit
    # the option whose device time it enters: "all" (compute and merge: every option),
    # "fetch" (the move), "local" (the recompute), "route" (a merge after a wait), or ""
    # (a call after idle: a load effect the simulator charges, not an option's time)
    enters: str
    together: str  # terms sharing a label come together or not at all ("": alone)
    required: bool


TERMS: tuple[DeviceTerm, ...] = (
    DeviceTerm("compute_t0", None, 1e-6, "us", "all", "", True),
    DeviceTerm("compute_per_token", "token", 1e-9, "ns/token", "all", "", True),
    DeviceTerm("compute_per_row_token", "row-token", 1e-12, "ps/row-token", "all", "", True),
    DeviceTerm("merge_t0", None, 1e-6, "us", "all", "", True),
    DeviceTerm("merge_per_row_partial", "row-partial", 1e-12, "ps/row-partial", "all", "", True),
    # what a merge pays for following an attention over the chunk (0 if absent)
    DeviceTerm("merge_per_token", "token", 1e-9, "ns/token", "all", "", False),
    DeviceTerm("move_t0", None, 1e-6, "us", "fetch", "", True),
    DeviceTerm("move_per_token", "token", 1e-9, "ns/token", "fetch", "", True),
    # T_move of a fetch sent block by block from the holder's cache (no gather)
    DeviceTerm("splice_t0", None, 1e-6, "us", "fetch", "splice", False),
    DeviceTerm("splice_per_token", "token", 1e-9, "ns/token", "fetch", "splice", False),
    # a layer's prefill call's fixed time, however few its tokens (0 if absent)
    DeviceTerm("recompute_t0", None, 1e-6, "us", "local", "", False),
    DeviceTerm("recompute_per_token", "token", 1e-6, "us/token", "local", "", False),
    # attention's quadratic term of a prefill (0 if absent)
    DeviceTerm("recompute_per_token2", "token^2", 1e-12, "ps/token^2", "local", "", False),
    # a call after g idle adds idle_extra (1 - exp(-g / idle_tau))
    DeviceTerm("idle_extra", None, 1e-6, "us", "", "idle", False),
    DeviceTerm("idle_tau", None, 1e-3, "ms", "", "idle", False),
    # a merge after a wait of g for a routed answer adds
    # (merge_wait_t0 + R p merge_wait_per_row_partial) (1 - exp(-g / merge_wait_tau))
    DeviceTerm("merge_wait_t0", None, 1e-6, "us", "route", "merge_wait", False),
    DeviceTerm(
        "merge_wait_per_row_partial",
        "row-partial",
        1e-12,
        "ps/row-partial",
        "route",
        "merge_wait",
        False,
    ),  # fmt: skip
    DeviceTerm("merge_wait_tau", None, 1e-3, "ms", "route", "merge_wait", False),
)
BY_NAME = {t.name: t for t in TERMS}
REQUIRED = tuple(t.name for t in TERMS if t.required)
# the terms that come together, by label
TOGETHER = {
    label: tuple(t.name for t in TERMS if t.together == label)
    for label in dict.fromkeys(t.together for t in TERMS if t.together)
}


def entering(option: str) -> tuple[str, ...]:
    """The flat terms whose value enters ``option``'s device time ("all", "fetch", ...)."""
    return tuple(t.name for t in TERMS if t.enters == option)
