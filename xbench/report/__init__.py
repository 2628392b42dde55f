"""``xbench report``: PNG figures and one self-contained HTML page from stored results.

What it reads, by what each path holds: a probe run (fabric curves with the fitted segments
and residuals; its batched round trips against the model where it ran ``rtt``), a kernel run (the roofline), a validate run (predicted against measured), a
comparison Parquet from ``xbench compare --out`` (ratios per case), a profile TOML (the
decision map, and the porting coefficients' break-even points). A probe run without a
profile is fitted on the spot for its curves.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import itertools
from dataclasses import dataclass
from pathlib import Path

from xbench.errors import XbenchError
from xbench.files import write_text_atomically

# The first word of each figure's file name (fabrics-1-run.png): what a report writes
FIGURE_KINDS = (
    "fabrics",
    "roundtrips",
    "roofline",
    "validate",
    "compare",
    "simulate",
    "validation",
    "prefill",
    "saturation",
    "sharing",
    "spanhits",
    "copies",
    "decisions",
    "breakeven",
)


@dataclass
class Figure:
    name: str
    title: str
    path: Path


def _kind(path: Path) -> str:
    from xbench.results.schema import SIMULATION_REPORTS
    from xbench.results.store import read_run_meta

    if path.is_dir():
        command = read_run_meta(path).get("command")
        if command in ("probe", "kernel", "validate"):
            return command
    elif path.suffix == ".toml":
        return "profile"
    elif path.suffix == ".parquet":
        from xbench.results.store import schema_metadata

        table = schema_metadata(path).get(b"xbench.table", b"").decode()
        if table in ("comparison", "simulation", "prefill_simulation", "simulation_validation"):
            return table
        if table in SIMULATION_REPORTS.values():
            return "simulation_report"
    raise XbenchError(
        f"{path} is not something xbench report draws",
        "pass probe, kernel or validate run directories, a profile .toml, or a comparison or "
        "simulation .parquet (xbench simulate --out, with or without --validate, or a report "
        "it wrote beside it)",
    )


# Why a run that holds samples can still give no figure, by its kind
_NOTHING_FROM = {
    "kernel": "a kernel run is drawn as a roofline: its partial_attention samples against the "
    "ceilings it measured (run xbench kernel with partial_attention, without --no-ceilings)",
    "validate": "a validate run is drawn from its validate_summary.parquet, which a run "
    "stopped early lacks",
}


def build(paths, out_dir: Path, heads: int = 16) -> list[Figure]:
    """Render every figure the inputs allow into ``out_dir`` (PNG) and return them."""
    import shutil
    import tempfile

    from xbench.core.profile import load_profile
    from xbench.results.store import ensure_writable_dir

    inputs = [(Path(p), _kind(Path(p))) for p in paths]
    profiles = [load_profile(p) for p, kind in inputs if kind == "profile"]
    # only once the inputs are known good: a refused report leaves no empty folder behind
    made_dir = not Path(out_dir).exists()
    out_dir = ensure_writable_dir(Path(out_dir))
    # drawn into a folder of their own first: a report that draws nothing, or fails half
    # way, leaves the one already in out_dir as it was (and no empty out_dir)
    staging = Path(tempfile.mkdtemp(prefix=".drawing-", dir=out_dir))
    try:
        # drawn one at a time, each saved and closed before the next is drawn
        drawn = itertools.chain(
            (
                drawing
                for i, (path, kind) in enumerate(inputs)
                for drawing in _run_figures(path, kind, f"{i + 1}-{path.stem}", profiles)
            ),
            _profile_figures(profiles, heads),
        )
        made = [_save(fig, staging, name, title) for fig, name, title in drawn if fig is not None]
        if not made:
            kinds = dict.fromkeys(kind for _, kind in inputs)  # in order, once each
            why = [_NOTHING_FROM[kind] for kind in kinds if kind in _NOTHING_FROM]
            raise XbenchError(
                "nothing to draw in the given results",
                "; ".join(why) if why else "pass runs that hold samples",
            )
        for old in out_dir.glob("*.png"):  # an earlier report's figures, not left beside these
            if old.name.split("-")[0] in FIGURE_KINDS:
                old.unlink()
        placed = [Figure(f.name, f.title, f.path.replace(out_dir / f.path.name)) for f in made]
        write_html(placed, out_dir / "index.html")
        return placed
    except BaseException:
        if made_dir:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _profile_figures(profiles: list, heads: int):
    """(figure or None, file name, title) for each figure the profiles give."""
    from xbench.report import figures

    for k, prof in enumerate(profiles):
        yield figures.decision_map(prof, heads), f"decisions-{k + 1}", f"Decision map ({prof.name})"
        yield (
            figures.break_even_figure(prof, heads),
            f"breakeven-{k + 1}",
            f"Break-even points of the porting coefficients ({prof.name})",
        )


def _save(fig, out_dir: Path, name: str, title: str) -> Figure:
    import matplotlib.pyplot as plt

    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Figure(name, title, path)


def _run_figures(path: Path, kind: str, tag: str, profiles: list):
    """(figure or None, file name, title) for each figure one run (or table) gives."""
    from xbench.report import figures
    from xbench.results.schema import (
        COMPARISON,
        KERNEL_SAMPLES,
        PREFILL_SIMULATION,
        PROBE_SAMPLES,
        SIMULATION,
        SIMULATION_VALIDATION,
        VALIDATE_SUMMARY,
    )
    from xbench.results.store import read_table

    if kind == "probe":
        from xbench.fit.profile_fit import RTT_TARGET, rtt_errors, rtt_points, warm_refits

        samples = read_table(path, PROBE_SAMPLES)
        fabrics = list(profiles[0].fabrics) if profiles else _fit_fabrics(samples)
        yield figures.probe_figure(samples, fabrics), f"fabrics-{tag}", f"Fabrics ({path})"
        points = rtt_points(samples, fabrics)
        warm = rtt_points(samples, warm_refits(samples))
        yield (
            figures.round_trip_figure(points, RTT_TARGET, warm, rtt_errors(samples, fabrics)),
            f"roundtrips-{tag}",
            f"Batched round trips ({path})",
        )
    elif kind == "kernel":
        from xbench.kernels.summary import ceilings_from, summarize_kernels

        samples = read_table(path, KERNEL_SAMPLES)
        yield (
            figures.roofline_figure(summarize_kernels(samples), ceilings_from(samples)),
            f"roofline-{tag}",
            f"Kernels against the ceilings ({path})",
        )
    elif kind == "validate":
        summary_file = path / "validate_summary.parquet"
        if summary_file.exists():
            summary = read_table([summary_file], VALIDATE_SUMMARY)
            yield figures.validate_figure(summary), f"validate-{tag}", f"Validate ({path})"
    elif kind == "comparison":
        cases = read_table([path], COMPARISON)
        yield figures.comparison_figure(cases), f"compare-{tag}", f"Comparison ({path})"
    elif kind == "simulation":
        frame = read_table([path], SIMULATION)
        yield figures.simulation_figure(frame), f"simulate-{tag}", f"Simulation ({path})"
        yield from _report_figures(path, tag)
    elif kind == "simulation_validation":
        frame = read_table([path], SIMULATION_VALIDATION)
        yield (
            figures.simulation_validation_figure(frame),
            f"validation-{tag}",
            f"Simulated against replayed ({path})",
        )
    elif kind == "prefill_simulation":
        frame = read_table([path], PREFILL_SIMULATION)
        yield figures.prefill_figure(frame), f"prefill-{tag}", f"Prefill offload ({path})"
        yield from _report_figures(path, tag)
    elif kind == "simulation_report":  # NAME.<report>.parquet given alone
        name, report = path.stem.rsplit(".", 1)
        yield from _report_figures(path.with_name(name + path.suffix), tag, only=report)


def _report_figures(table_path: Path, tag: str, only: str | None = None):
    """(figure, file name, title) for each report ``xbench simulate --out`` wrote beside a
    simulation's table (``only``: that one): the deployments at saturation, shared-KV
    batching (its calls and steps together), the span expressions' hit rates, a top-k
    workload against a copy each."""
    from xbench.report import figures
    from xbench.results.schema import SIMULATION_REPORTS
    from xbench.results.store import read_table, report_path, table_run_meta

    def have(report: str):
        path = report_path(table_path, report)
        wanted = only is None or only == report or {only, report} == SHARING
        return path if wanted and path.exists() else None

    if path := have("saturation"):
        frame = read_table([path], SIMULATION_REPORTS["saturation"])
        yield figures.saturation_figure(frame), f"saturation-{tag}", f"At saturation ({path})"
    steps, calls = have("sharing-steps"), have("sharing-calls")
    if steps or calls:
        frames = [
            read_table([p] if p else [], SIMULATION_REPORTS[r])
            for p, r in ((calls, "sharing-calls"), (steps, "sharing-steps"))
        ]
        facts = table_run_meta(steps or calls).get("sharing", {})
        yield (
            figures.sharing_figure(*frames, facts),
            f"sharing-{tag}",
            f"Shared-KV batching ({steps or calls})",
        )
    if path := have("span-hits"):
        frame = read_table([path], SIMULATION_REPORTS["span-hits"])
        yield figures.span_hits_figure(frame), f"spanhits-{tag}", f"Span hit rates ({path})"
    if path := have("copies"):
        frame = read_table([path], SIMULATION_REPORTS["copies"])
        yield (
            figures.copies_figure(frame),
            f"copies-{tag}",
            f"Top-k routing against a copy each ({path})",
        )


SHARING = {"sharing-calls", "sharing-steps"}


def _fit_fabrics(samples):
    from xbench.fit.profile_fit import fit_fabrics

    try:
        return fit_fabrics(samples, None, [])
    except XbenchError:
        return []


def write_html(figs: list[Figure], path: Path) -> Path:
    """One page, every figure embedded (data: URIs): it opens with no network and no files
    beside it."""
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>xbench report</title>',
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "img{max-width:100%;border:1px solid #ddd}h2{font-size:1.1em}</style></head><body>",
        f"<h1>xbench report</h1><p>{html.escape(stamp)}</p>",
    ]
    for fig in figs:
        data = base64.b64encode(fig.path.read_bytes()).decode()
        parts.append(f"<h2>{html.escape(fig.title)}</h2>")
        parts.append(f'<img alt="{html.escape(fig.title)}" src="data:image/png;base64,{data}">')
    parts.append("</body></html>")
    write_text_atomically(path, "\n".join(parts))
    return path
