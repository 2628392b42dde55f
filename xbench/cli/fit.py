"""``xbench fit``: probe and kernel samples -> a profile of cost-model coefficients."""

from __future__ import annotations

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
from xbench.cli.terms import UNBOUNDED_GB_S, _at_zero, coefficient_frame, print_terms, shown
from xbench.errors import XbenchError

__all__ = ["fit", "fit_warnings", "shown"]


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
    sources: Annotated[
        bool,
        typer.Option(
            "--sources", help="Print under each table where each term's value comes from."
        ),
    ] = False,
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
        refuse_repeats,
        run_dir_of,
        table_files,
    )

    for path in results:
        if not path.exists():
            raise XbenchError(
                f"results path {path} does not exist",
                "pass directories written by xbench probe / xbench kernel",
            )
    refuse_repeats(results, "its samples would count twice")
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
    save_profile(profile, out, replace=force)  # one written meanwhile is kept, this refused
    for line in warnings:
        warn(line)
    emit_frame(
        coefficient_frame(profile),
        fmt,
        lambda f: _table(f, profile, out, sources),
    )


# A held-out error above this says the segments do not describe the samples
LARGE_HELDOUT = 0.25


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


def _table(frame, profile, out: Path, sources: bool) -> None:
    from xbench.cli.render import notes
    from xbench.fit.profile_fit import RTT_TARGET, rtt_line

    console.print(f"xbench fit: {profile.name}", style="bold", highlight=False)
    print_terms(frame, sources)
    notes(
        f"written to {out}; intervals are 95% bootstrap; * = prior, or a term the fit left "
        "at its bound: not measured"
    )
    for line in fit_warnings(frame):
        warn(line)
    # the study's metric where it is met (a fabric beyond it was warned of above)
    patterns = profile.provenance.get("wire_pattern", {})
    for name, e in profile.provenance.get("rtt_error", {}).items():
        if e.get("mape", float("inf")) <= RTT_TARGET:
            console.print(rtt_line(name, e, patterns.get(name, "latency")), highlight=False)
