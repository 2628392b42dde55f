"""``xbench fit``: probe and kernel samples -> a profile of cost-model coefficients."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from xbench.cli.common import console, handles_errors
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
            help="Profile whose terms fill what the samples lack (they stay marked as priors)."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Profile name (default: the output file's stem).")
    ] = None,
) -> None:
    """Fit fabric segments, overheads and device terms; write a TOML profile."""
    from xbench.core.profile import load_profile, save_profile
    from xbench.fit import fit_profile
    from xbench.results.schema import KERNEL_SAMPLES, PROBE_SAMPLES
    from xbench.results.store import read_run_meta, read_table, table_files

    for path in results:
        if not path.exists():
            raise XbenchError(
                f"results path {path} does not exist",
                "pass directories written by xbench probe / xbench kernel",
            )
    probe = read_table(results, PROBE_SAMPLES)
    kernel = read_table(results, KERNEL_SAMPLES)
    if probe.empty and kernel.empty:
        raise XbenchError(
            f"no probe or kernel samples under {', '.join(map(str, results))}",
            "pass the directories that xbench probe and xbench kernel wrote",
        )
    metas = []
    for f in table_files(results, PROBE_SAMPLES) + table_files(results, KERNEL_SAMPLES):
        meta = read_run_meta(f)
        if meta and meta not in metas:
            metas.append(meta)
    profile = fit_profile(
        probe,
        kernel,
        name=name or out.stem,
        base=load_profile(base) if base else None,
        run_meta=metas,
    )
    save_profile(profile, out)
    _table(profile, out)


def _table(profile, out: Path) -> None:
    table = Table(
        title=f"xbench fit: {profile.name}",
        caption=f"written to {out}; [95% CI]; * = prior, not measured",
    )
    for col in ("term", "value", "95% CI", "unit"):
        table.add_column(col, justify="left" if col in ("term", "unit") else "right")

    def row(label, c, scale, unit):
        mark = "*" if c.prior else ""
        table.add_row(
            label + mark,
            f"{c.value / scale:.4g}",
            f"{c.low / scale:.4g}-{c.high / scale:.4g}",
            unit,
        )

    for f in profile.fabrics:
        held = f" held-out error {100 * f.heldout_mape:.1f}%" if f.heldout_mape is not None else ""
        source = profile.provenance.get("wire_pattern", {}).get(f.name)
        held += f", segments from {source}" if source else ""
        table.add_row(f"[bold]{f.name}[/bold] {f.pair_class} {f.transport}{held}", "", "", "")
        row("  o (per message)", f.overhead, 1e-6, "us")
        for s in f.segments:
            row(f"  alpha (>= {int(s.min_bytes)} B)", s.alpha, 1e-6, "us")
            row(f"  beta  (>= {int(s.min_bytes)} B)", s.beta, 1e9, "GB/s")
        table.add_row(f"  n1/2 = alpha*beta = {f.half_performance_bytes():,.0f} B", "", "", "")
    d = profile.device
    table.add_row(f"[bold]device[/bold] {d.name}", "", "", "")
    for term, scale, unit in (
        ("compute_t0", 1e-6, "us"),
        ("compute_per_token", 1e-9, "ns/token"),
        ("compute_per_row_token", 1e-12, "ps/row-token"),
        ("merge_t0", 1e-6, "us"),
        ("merge_per_row_partial", 1e-12, "ps/row-partial"),
        ("move_t0", 1e-6, "us"),
        ("move_per_token", 1e-9, "ns/token"),
        ("splice_t0", 1e-6, "us"),
        ("splice_per_token", 1e-9, "ns/token"),
        ("recompute_per_token", 1e-6, "us/token"),
    ):
        c = getattr(d, term)
        if c is not None:
            row(f"  {term}", c, scale, unit)
    for start, t0, a, k in d.compute_segments:
        row(f"  compute from {int(start)} tokens: t0", t0, 1e-6, "us")
        row("    per_token", a, 1e-9, "ns/token")
        row("    per_row_token", k, 1e-12, "ps/row-token")
    for kind in ("move", "splice"):
        for start, t0, a in getattr(d, f"{kind}_segments"):
            row(f"  {kind} from {int(start)} tokens: t0", t0, 1e-6, "us")
            row("    per_token", a, 1e-9, "ns/token")
    console.print(table)
