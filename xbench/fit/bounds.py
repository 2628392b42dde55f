"""Coefficients a fit could not measure: pinned at one of its own bounds, or beyond what
the hardware can do.

A least-squares fit held to non-negative terms puts a term at 0 where the data cannot show
it (a time per token a sweep's rows hide, an intercept below the overhead), and a rate at
its cap where the time per byte fell to 0 (pages whose times did not grow with their
bytes). Such a value is the fit's bound, not a measurement; one faster than the profile's
``[ceilings]`` (``core.implied``) is impossible. Either is kept as the fit gave it, marked
``bound`` and ``prior`` (so every decision that rests on it says so, as on a datasheet
prior) with a ``source`` that says why, and reported in one line.
"""

from __future__ import annotations

from dataclasses import replace

from xbench.core import device_terms
from xbench.core.costmodel import Coef, Profile
from xbench.core.implied import beyond_ceilings
from xbench.core.models import ModelPreset

# The fastest time per byte a fit admits (a rate's cap is its inverse, 1e15 B/s): a fitted
# slope at this floor means the times did not grow with the bytes.
FASTEST_SECONDS_PER_BYTE = 1e-15
RATE_CAP = 1.0 / FASTEST_SECONDS_PER_BYTE
# A fitted value this small against its own interval's high end sits at the bound 0.
AT_ZERO = 1e-9
# The pieces of a device's piecewise terms, after their start: what each coefficient is.
PIECES = {
    "compute_segments": ("compute_t0", "compute_per_token", "compute_per_row_token"),
    "move_segments": ("move_t0", "move_per_token"),
    "splice_segments": ("splice_t0", "splice_per_token"),
}


def _pinned(c: Coef | None, rate: bool) -> str:
    """Why ``c``, fitted here, is at one of the fit's bounds ("" where it is not)."""
    if c is None or c.prior:
        return ""
    if rate:
        return "at the fit's cap, 1e15 B/s: the times did not grow with the bytes" * (
            c.value >= RATE_CAP * (1 - 1e-9)
        )
    return "at the fit's bound 0: the data could not show it" * (c.value <= AT_ZERO * c.high)


def _marked(c: Coef, why: str) -> Coef:
    return replace(c, prior=True, bound=True, source=f"not measured: {why}")


class _Marker:
    """Marks coefficients of one profile by where they sit; keeps a line for each."""

    def __init__(self, profile: Profile):
        self.fabrics = {f.name: f for f in profile.fabrics}
        self.device = profile.device
        self.lines: list[str] = []
        self.seen: set = set()

    def _first(self, key: tuple) -> bool:
        """Whether ``key`` is not marked yet (a term at 0 also implies an infinite rate)."""
        first = key not in self.seen
        self.seen.add(key)
        return first

    def fabric(self, name: str, field: str, start, why: str) -> None:
        if not self._first((name, field, start)):
            return
        f = self.fabrics[name]
        label = f"fabric {name}: {field}" + ("" if start is None else f" from {int(start)} B")
        self.lines.append(f"{label} {why}; marked bound")
        if field in ("alpha", "beta"):
            segments = tuple(
                replace(s, **{field: _marked(getattr(s, field), why)})
                if s.min_bytes == start
                else s
                for s in f.segments
            )
            self.fabrics[name] = replace(f, segments=segments)
        else:
            self.fabrics[name] = replace(f, **{field: _marked(getattr(f, field), why)})

    def device_term(self, field: str, start, why: str) -> None:
        if not self._first(("device", field, start)):
            return
        d = self.device
        label = f"device {field}" + ("" if start is None else f" from {int(start)} tokens")
        self.lines.append(f"{label} {why}; marked bound")
        if start is None:
            self.device = replace(d, **{field: _marked(getattr(d, field), why)})
            return
        kind = field.split("_")[0] + "_segments"
        at = PIECES[kind].index(field) + 1
        pieces = tuple(
            (*p[:at], _marked(p[at], why), *p[at + 1 :]) if p[0] == start else p
            for p in getattr(d, kind)
        )
        self.device = replace(d, **{kind: pieces})

    def profile(self, profile: Profile) -> Profile:
        fabrics = tuple(self.fabrics[f.name] for f in profile.fabrics)
        return replace(profile, fabrics=fabrics, device=self.device)


def mark_bounds(
    profile: Profile,
    fitted_device_terms,
    fitted_fabrics=None,
    model: ModelPreset | None = None,
) -> tuple[Profile, list[str]]:
    """The profile with each coefficient its fit left at a bound (alpha or a per-unit
    device term at 0, a rate at its cap), or beyond the profile's ceilings for ``model``'s
    shapes, marked; and a line for each. ``fitted_device_terms``: the device terms this fit
    measured (flat terms by name; a piecewise term's pieces with its flat term);
    ``fitted_fabrics``: the fabrics it measured (None: all). What came from its base is left
    as it is."""
    marker = _Marker(profile)
    fitted = {f.name for f in profile.fabrics} if fitted_fabrics is None else set(fitted_fabrics)
    for f in profile.fabrics:
        if f.name not in fitted:
            continue
        for s in f.segments:
            for field, rate in (("alpha", False), ("beta", True)):
                if why := _pinned(getattr(s, field), rate):
                    marker.fabric(f.name, field, s.min_bytes, why)
        for field, rate in (("block_t0", False), ("block_beta", True)):
            if why := _pinned(getattr(f, field), rate):
                marker.fabric(f.name, field, None, why)
    d = profile.device
    for term in device_terms.TERMS:
        if term.per is not None and term.name in fitted_device_terms:
            if why := _pinned(getattr(d, term.name), False):
                marker.device_term(term.name, None, why)
    for kind, names in PIECES.items():
        if names[1] not in fitted_device_terms:  # the pieces came with the base's flat term
            continue
        for start, *coefs in getattr(d, kind):
            for name, c in zip(names[1:], coefs[1:], strict=True):
                if why := _pinned(c, False):
                    marker.device_term(name, start, why)
    for rate in beyond_ceilings(marker.profile(profile), model):
        owner, field, start = rate.coef
        measured = field in fitted_device_terms if owner == "device" else owner in fitted
        if not measured:  # the base's: its own source answers for it
            continue
        why = f"implies {rate.line().split(' implies ', 1)[1]}: impossible"
        if owner == "device":
            marker.device_term(field, start, why)
        else:
            marker.fabric(owner, field, start, why)
    return marker.profile(profile), marker.lines
