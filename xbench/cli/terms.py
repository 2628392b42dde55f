"""A profile's terms as ``xbench fit`` and ``xbench decide --sources`` show them: one row per
coefficient in display units (value, 95 % interval, prior or measured, where it comes from),
printed as one table per fabric and per piece of the device."""

from __future__ import annotations

import math

from xbench.cli.common import console

# A rate the fit could not bound from above is stored as 1e15 B/s (1e6 GB/s): unbounded
UNBOUNDED_GB_S = 0.999e6
# A fitted time below this (in the unit shown: us, ns, ps) whose interval reaches zero is
# zero: the fit sat at its bound (1e-3 us is a nanosecond, far inside any such interval)
ZERO = 1e-3


def _at_zero(value: float, low: float) -> bool:
    """A time the fit pressed against its lower bound 0: tiny, its interval reaching 0."""
    return abs(value) < ZERO and low <= ZERO


def fitted_source(profile, device: bool) -> str:
    """Where a measured term of a fitted profile comes from, read from its provenance: the
    device and software that timed the device terms (``provenance.software``), the hosts
    that ran the probes, and the fit's date."""
    p = profile.provenance
    if p.get("kind") != "fit":
        return ""
    date = str(p.get("date", "?"))[:10]
    if not device:
        return f"fitted from probe runs on {', '.join(p.get('hosts') or ['?'])}, {date}"
    software = dict(p.get("software") or {})
    on = software.pop("device", None) or profile.device.name
    if driver := (p.get("conditions") or {}).get("driver"):
        software["driver"] = driver
    used = ", ".join(f"{k} {v}" for k, v in software.items())
    return f"fitted from kernel runs on {on}" + (f" ({used})" if used else "") + f", {date}"


def coefficient_frame(profile):
    """One row per coefficient (display units), as printed and as --format json/csv give.
    A measured term without a source of its own cites the fit (``fitted_source``)."""
    import pandas as pd

    from xbench.core import device_terms

    rows = []
    measured = {False: fitted_source(profile, False), True: fitted_source(profile, True)}

    def add(group, term, c, scale, unit, note=""):
        rows.append(
            {
                "group": group,
                "term": term,
                "value": c.value / scale,
                "low": c.low / scale,
                "high": c.high / scale,
                "unit": unit,
                "prior": c.prior,
                "note": note,
                "source": c.source or ("" if c.prior else measured[group.startswith("device")]),
            }
        )

    for f in profile.fabrics:
        group = f"fabric {f.name}"
        source = profile.provenance.get("wire_pattern", {}).get(f.name)
        note = f"{f.pair_class} {f.transport}" + (f", segments from {source}" if source else "")
        if f.heldout_mape is not None:
            note += f", held-out error {100 * f.heldout_mape:.1f}%"
        add(group, "o (per message)", f.overhead, 1e-6, "us", note)
        for s in f.segments:
            add(group, f"alpha (>= {int(s.min_bytes)} B)", s.alpha, 1e-6, "us")
            add(group, f"beta (>= {int(s.min_bytes)} B)", s.beta, 1e9, "GB/s")
        if f.block_t0 is not None:  # a fetch page by page (probe -p offgather)
            add(group, "block_t0 (fetch by pages)", f.block_t0, 1e-6, "us")
            add(group, "block_beta (fetch by pages)", f.block_beta, 1e9, "GB/s")
    d = profile.device
    group = f"device {d.name}"
    for term in device_terms.TERMS:
        c = getattr(d, term.name)
        if c is not None:
            add(group, term.name, c, term.scale, term.shown)
    for start, t0, a, k in d.compute_segments:
        piece = f"{group}, compute from {int(start)} tokens"
        add(piece, "compute_t0", t0, 1e-6, "us")
        add(piece, "compute_per_token", a, 1e-9, "ns/token")
        add(piece, "compute_per_row_token", k, 1e-12, "ps/row-token")
    for kind in ("move", "splice"):
        for start, t0, a in getattr(d, f"{kind}_segments"):
            piece = f"{group}, {kind} from {int(start)} tokens"
            add(piece, f"{kind}_t0", t0, 1e-6, "us")
            add(piece, f"{kind}_per_token", a, 1e-9, "ns/token")
    return pd.DataFrame(rows)


def shown(value: float, low: float, high: float, unit: str) -> tuple[str, str]:
    """(value, interval) as printed: to the precision the interval allows, zeros as 0, an
    end the fit could not bound as unbounded, the interval in brackets (a dash would read
    as a minus beside exponents)."""
    rate = unit.endswith("/s")
    finite = [x for x in (low, high) if not (rate and x >= UNBOUNDED_GB_S)]
    step = (max(finite) - min(finite)) if len(finite) == 2 else abs(value)
    step = step if step > 0 else abs(value) / 100

    def fmt(x: float) -> str:
        if rate and x >= UNBOUNDED_GB_S:
            return "unbounded"
        if _at_zero(x, low):
            return "0"
        if abs(x) >= 1e7 or abs(x) < 1e-3:
            return f"{x:.3g}"
        decimals = max(0, 1 - math.floor(math.log10(step))) if step > 0 else 3
        return f"{x:,.{min(decimals, 4)}f}"

    if rate and low >= UNBOUNDED_GB_S:
        return fmt(value), "unbounded"
    return fmt(value), f"[{fmt(low)}, {fmt(high)}]"


def print_terms(frame, sources: bool = False) -> None:
    """One table per fabric and per piece of the device: each group's description is its
    title, so labels stay one per row at 80 columns; ``sources``: each term's source below
    its table."""
    from xbench.cli.render import add_columns, result_table

    for group, rows in frame.groupby("group", sort=False):
        note = rows.note.iloc[0]
        table = result_table(f"{group}" + (f": {note}" if note else ""))
        add_columns(table, ("term", "value", "95% CI", "unit"), left=("term", "unit"))
        for r in rows.itertuples():
            value, interval = shown(r.value, r.low, r.high, r.unit)
            table.add_row(r.term + ("*" if r.prior else ""), value, interval, r.unit)
        console.print(table)
        if sources:
            for r in rows.itertuples():
                said = r.source or ("fitted here" if not r.prior else "no source given")
                console.print(f"  {r.term}: {said}", style="dim", highlight=False)
