"""``xbench fit``: probe and kernel samples -> a profile of cost-model coefficients."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    console,
    emit_frame,
    handles_errors,
    warn,
)
from xbench.errors import XbenchError


@handles_errors
def fit(
    results: Annotated[
        list[Path],
        typer.Argument(help="Results directories of xbench probe and xbench kernel runs."),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Profile to write, e.g. profiles/mycluster.toml.")
    ] = Path("profiles/fitted.toml"),
    base: Annotated[
        Path | None,
        typer.Option(
            help="Profile (a file, or the name of one xbench ships) whose terms fill what the "
            "samples lack (they stay marked as priors)."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Profile name (default: the output file's stem).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Fit fabric segments, overheads and device terms; write a TOML profile."""
    from xbench.core.profile import load_profile, save_profile
    from xbench.resources import profile_path
    from xbench.results.schema import KERNEL_SAMPLES, PROBE_SAMPLES
    from xbench.results.store import (
        incompleteness,
        read_run_meta,
        read_table,
        refuse_overwrite,
        run_dir_of,
        table_files,
    )

    for path in results:
        if not path.exists():
            raise XbenchError(
                f"results path {path} does not exist",
                "pass directories written by xbench probe / xbench kernel",
            )
    _refuse_repeats(results)
    base_path = profile_path(base) if base else None
    if base_path is not None and base_path.resolve() == out.resolve():
        raise XbenchError(
            f"--out {out} is the --base profile", "write the fit to a new file and keep the base"
        )
    refuse_overwrite(out, force)
    base_profile = load_profile(base_path) if base_path else None
    probe = read_table(results, PROBE_SAMPLES)
    kernel = read_table(results, KERNEL_SAMPLES)
    if probe.empty and kernel.empty:
        raise XbenchError(
            f"no probe or kernel samples under {', '.join(map(str, results))}",
            "pass the directories that xbench probe and xbench kernel wrote",
        )
    # only now (scipy and torch take seconds to import): a bad path is refused at once
    from xbench.fit import fit_profile

    files = table_files(results, PROBE_SAMPLES) + table_files(results, KERNEL_SAMPLES)
    metas, warnings = [], []
    for run_dir in dict.fromkeys(run_dir_of(f) for f in files):  # each run once, not per part
        meta = read_run_meta(run_dir)
        if meta and meta not in metas:
            metas.append(meta)
        why = incompleteness(run_dir)
        if why:
            warnings.append(f"{why}: fitted from the cases it holds")
    profile = fit_profile(
        probe,
        kernel,
        name=name or out.stem,
        base=base_profile,
        run_meta=metas,
        warnings=warnings,
    )
    save_profile(profile, out)
    for line in warnings:
        warn(line)
    emit_frame(coefficient_frame(profile), fmt, lambda f: _table(f, profile.name, out))


def _refuse_repeats(results: list[Path]) -> None:
    """A run given twice (by two paths, or two copies of one run) would count its samples
    twice and narrow every interval: refused, naming both."""
    from xbench.results.store import read_run_meta

    seen: dict[str, Path] = {}
    for path in results:
        meta = read_run_meta(path) if path.is_dir() else {}
        key = meta.get("run_id") or str(path.resolve())
        if key in seen:
            raise XbenchError(
                f"{seen[key]} and {path} hold the same run ({key}): its samples would count twice",
                "pass each run once",
            )
        seen[key] = path


def coefficient_frame(profile):
    """One row per coefficient (display units), as printed and as --format json/csv give."""
    import pandas as pd

    from xbench.core import device_terms

    rows = []

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


# A rate the fit could not bound from above is stored as 1e15 B/s (1e6 GB/s): unbounded
UNBOUNDED_GB_S = 0.999e6
# A fitted time below this (in the unit shown: us, ns, ps) whose interval reaches zero is
# zero: the fit sat at its bound (1e-3 us is a nanosecond, far inside any such interval)
ZERO = 1e-3
# A held-out error above this says the segments do not describe the samples
LARGE_HELDOUT = 0.25


def _at_zero(value: float, low: float) -> bool:
    """A time the fit pressed against its lower bound 0: tiny, its interval reaching 0."""
    return abs(value) < ZERO and low <= ZERO


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


def fit_warnings(frame) -> list[str]:
    """What a reader must not miss: terms at a bound of their fit, large held-out errors."""
    found = []
    for r in frame.itertuples():
        if r.prior:
            continue
        rate = r.unit.endswith("/s")
        if (rate and r.high >= UNBOUNDED_GB_S) or (not rate and _at_zero(r.value, r.low)):
            where = "has no upper bound" if rate else "sat at zero, its bound"
            found.append(f"{r.group}: {r.term} {where}; measure more sizes to pin it")
    for group, note in frame.groupby("group", sort=False).note.first().items():
        if "held-out error" in str(note):
            error = float(str(note).rsplit("held-out error ", 1)[1].rstrip("%")) / 100
            if error > LARGE_HELDOUT:
                found.append(
                    f"{group}: held-out error {100 * error:.0f}%: the segments do not describe "
                    "the samples (probe more sizes, or check the fabric label)"
                )
    return found


def _table(frame, name: str, out: Path) -> None:
    """One table per fabric and per piece of the device: each group's description is its
    title, so labels stay one per row at 80 columns."""
    from xbench.cli.render import add_columns, notes, result_table

    console.print(f"xbench fit: {name}", style="bold", highlight=False)
    for group, rows in frame.groupby("group", sort=False):
        note = rows.note.iloc[0]
        table = result_table(f"{group}" + (f": {note}" if note else ""))
        add_columns(table, ("term", "value", "95% CI", "unit"), left=("term", "unit"))
        for r in rows.itertuples():
            value, interval = shown(r.value, r.low, r.high, r.unit)
            table.add_row(r.term + ("*" if r.prior else ""), value, interval, r.unit)
        console.print(table)
    notes(f"written to {out}; intervals are 95% bootstrap; * = prior, not measured")
    for line in fit_warnings(frame):
        warn(line)
