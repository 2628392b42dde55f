"""``xbench compare`` (two stored runs) and ``xbench check`` (a nightly job: re-run a
baseline's sweep, compare, write Markdown and JUnit, fail on a regression or on cases lost).

Exit codes: 0 nothing regressed; 1 a case is slower; 2 bad input; 3 the ranks failed;
4 nothing can be compared (one run as both sides, runs of different kinds, metadata that
differs on a field not ``--allow``-ed, or no case in common); 5 the candidate lacks cases
of the baseline or is not a whole run (partial, interrupted, a part file lost), unless
``--allow-missing``.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    RunDirOption,
    coloured,
    console,
    csv_text,
    err_console,
    handles_errors,
    strict_json,
    warn,
)
from xbench.errors import XbenchError
from xbench.files import read_toml, write_text_atomically


class CompareFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"
    junit = "junit"


CompareFormatOption = Annotated[
    CompareFormat, typer.Option("--format", help="table, json, csv, markdown or junit.")
]
ThresholdOption = Annotated[
    str,
    typer.Option(
        help="Smallest change that counts: a percent (5%, the default) or a fraction below 1 "
        "(0.05)."
    ),
]
AllowMissingOption = Annotated[
    bool,
    typer.Option(
        "--allow-missing",
        help="Pass the gate although the candidate lacks cases of the baseline or is a "
        "partial run (they are still reported).",
    ),
]
AlphaOption = Annotated[
    float,
    typer.Option(help="False discovery rate over the cases compared (Benjamini-Hochberg)."),
]
AllowOption = Annotated[
    str,
    typer.Option(
        help="Metadata fields allowed to differ, comma list: host, cpu_model, mpi_library, "
        "mpi_thread_level, gpu, driver, torch, backend, cpu_attention, schema."
    ),
]
COLOURS = {
    "slower": "red",
    "faster": "green",
    "unchanged": "",
    "inconclusive": "yellow",
    "missing": "red",
}


def _gates(
    threshold: str,
    alpha: float,
    confidence: float = 0.95,
    names: tuple[str, str] = ("--threshold", "--alpha"),
):
    """The two gates; ``names`` say where the values came from (options or a config file)."""
    from xbench.compare import Gates

    text = threshold.strip()
    percent = text.endswith("%")
    try:
        value = float(text[:-1]) / 100 if percent else float(text)
    except ValueError:
        raise XbenchError(f"{names[0]} {threshold!r} is not a ratio", "e.g. 5% or 0.05") from None
    # "5" is 500 % read literally, and 5 % meant: ask (150 or inf has no such reading)
    if not percent and 1 <= value < 100:
        raise XbenchError(
            f"{names[0]} {threshold}: a fraction must lie below 1 ({threshold} would be "
            f"{100 * value:g}%)",
            f"write a percent ({threshold}%) or a fraction (e.g. 0.05)",
        )
    if not 0 < value < 1:
        raise XbenchError(
            f"{names[0]} {threshold}: must lie above 0% and below 100%", "e.g. 5% or 0.05"
        )
    if not 0 < alpha < 1:
        raise XbenchError(f"{names[1]} {alpha}: must lie between 0 and 1", "e.g. 0.05")
    return Gates(threshold=value, alpha=alpha, confidence=confidence)


def _allowed(text: str, name: str = "--allow") -> list[str]:
    from xbench.compare.runs import COMPARED_FIELDS
    from xbench.core.units import parse_name_list

    if not text.strip():
        return []
    names = parse_name_list(text, name)
    bad = [a for a in names if a not in COMPARED_FIELDS and a != "schema"]
    if bad:
        raise XbenchError(
            f"{name} {', '.join(bad)}: no such metadata field",
            f"pick from {', '.join([*COMPARED_FIELDS, 'schema'])}",
        )
    return names


def _header(comparison, gates) -> list[str]:
    base, cand = comparison.baseline, comparison.candidate
    lines = [
        f"baseline `{base.path}` ({base.meta.get('run_id')}, {base.meta.get('created_utc')}), "
        f"candidate `{cand.path}` ({cand.meta.get('run_id')}, {cand.meta.get('created_utc')})",
        f"slower or faster: Benjamini-Hochberg q < {gates.alpha:g} and a median ratio beyond "
        f"{100 * gates.threshold:g}%",
    ]
    lines += [f"allowed to differ: {k} {b} -> {c}" for k, b, c in comparison.allowed]
    from xbench.compare.verdicts import sensitivity

    caught = sensitivity(comparison.cases, gates)
    return lines + ([caught] if caught else [])


def _report(comparison, gates, title: str, fmt: CompareFormat) -> str:
    """The comparison as Markdown or JUnit XML, with why the gate failed if it did."""
    from xbench.compare import formats

    if fmt == CompareFormat.markdown:
        write, head = formats.markdown, _header(comparison, gates)
    else:
        write, head = formats.junit, _properties(comparison, gates)
    failed = not comparison.allow_missing
    return write(comparison.cases, title, head, comparison.problems, failed=failed)


def emit(comparison, gates, fmt: CompareFormat, title: str) -> None:
    cases = comparison.cases
    shown = cases.drop(columns=["case_key"])
    for line in comparison.warnings:
        warn(line)
    if fmt == CompareFormat.json:
        sys.stdout.write(strict_json(shown.to_dict(orient="records")) + "\n")
    elif fmt == CompareFormat.csv:
        sys.stdout.write(csv_text(shown))
    elif fmt in (CompareFormat.markdown, CompareFormat.junit):
        sys.stdout.write(_report(comparison, gates, title, fmt))
    else:
        _table(comparison, gates, title)
    _say_gate(comparison)


def _say_gate(comparison) -> None:
    """Why the gate fails for want of cases, one line each on stderr (said once, by compare
    and check alike)."""
    for line in [] if comparison.allow_missing else comparison.problems:
        err_console.print(f"xbench: gate failed: {line}", style="red", highlight=False)


def _properties(comparison, gates) -> dict:
    return {
        "baseline": comparison.baseline.path,
        "candidate": comparison.candidate.path,
        "threshold": gates.threshold,
        "alpha": gates.alpha,
        **{f"allowed.{k}": f"{b} -> {c}" for k, b, c in comparison.allowed},
    }


def shared_words(labels) -> list[str]:
    """The words every label holds (transport, fabric, ranks...), in the first label's order:
    said once in the title instead of on every row."""
    words = [str(label).split() for label in labels]
    if len(words) < 2:
        return []
    common = set(words[0]).intersection(*map(set, words[1:]))
    shared = [w for w in dict.fromkeys(words[0]) if w in common]
    if any(not [w for w in ws if w not in common] for ws in words):  # a label would vanish
        return []
    return shared


def _short(label: str, shared: list[str]) -> str:
    return " ".join(w for w in str(label).split() if w not in shared)


def _table(comparison, gates, title: str) -> None:
    from xbench.cli.render import add_columns, notes, result_table
    from xbench.compare.formats import counts

    cases = comparison.cases
    coverage = cases.ci_coverage.dropna()
    label = f"{100 * coverage.iloc[0]:.0f}% CI" if len(coverage) else "CI"
    shared = shared_words(cases.case)
    if shared:
        title += ": " + " ".join(shared)
    units = list(dict.fromkeys(cases.unit))
    if len(units) == 1:  # one unit for every case: said once
        title += f" ({units[0]})"
    table = result_table(title)
    detects = bool(cases.detectable.notna().any())
    columns = ["case", *(["unit"] if len(units) > 1 else []), "base", "new", "ratio", label, "q"]
    add_columns(
        table,
        [*columns, *(["detects"] if detects else []), "verdict"],
        left=("case", "unit", "verdict"),
        wraps=("case",),  # a long label wraps between its words; the numbers never do
    )
    reasons = {}
    for r in cases.itertuples():
        name = _short(r.case, shared)
        if r.reason:
            reasons.setdefault(r.reason, []).append(name)
        row = [
            name,
            *([r.unit] if len(units) > 1 else []),
            "-" if r.baseline != r.baseline else f"{r.baseline:,.4g}",
            "-" if r.candidate != r.candidate else f"{r.candidate:,.4g}",
            "-" if r.ratio != r.ratio else f"{r.ratio:.3f}",
            "-" if r.ratio != r.ratio else f"{r.ratio_low:.3f}-{r.ratio_high:.3f}",
            "-" if r.q_value != r.q_value else f"{r.q_value:.2g}",
        ]
        if detects:
            row.append("-" if r.detectable != r.detectable else f"{100 * r.detectable:.0f}%")
        table.add_row(*row, coloured(r.verdict, COLOURS.get(r.verdict, "dim")))
    console.print(table)
    console.print(", ".join(f"{n} {v}" for v, n in counts(cases).items()), highlight=False)
    lines = [f"{reason}: {', '.join(names)}" for reason, names in reasons.items()]
    lines += _header(comparison, gates)
    lines.append(
        f"ratio: candidate / baseline medians, {label}: its interval; unchanged only when the "
        "interval lies within the threshold"
        + ("; detects: the least change the case could catch (80% power)" if detects else "")
    )
    if "mann-whitney on samples" in set(cases.test.dropna()):
        lines.append(
            "one launch or two: samples were tested as independent, so launch-to-launch drift "
            "is not accounted for; make runs with --runs 3 or more"
        )
    notes(*lines)


def _exit(comparison) -> None:
    if comparison.exit_code:
        raise typer.Exit(comparison.exit_code)


@handles_errors
def compare(
    baseline: Annotated[Path, typer.Argument(help="Run directory to compare against.")],
    candidate: Annotated[Path, typer.Argument(help="Run directory to judge.")],
    threshold: ThresholdOption = "5%",
    alpha: AlphaOption = 0.05,
    allow: AllowOption = "",
    allow_missing: AllowMissingOption = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also write the verdicts as Parquet here.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    fmt: CompareFormatOption = CompareFormat.table,
) -> None:
    """Compare two stored runs case by case: slower, faster, unchanged, inconclusive, missing."""
    from xbench.compare import compare_runs
    from xbench.results.store import refuse_overwrite

    gates = _gates(threshold, alpha)
    allowed = _allowed(allow)
    if out is not None:  # before the comparison, not after it
        refuse_overwrite(out, force, suffix=".parquet")
    try:
        comparison = compare_runs(baseline, candidate, gates, allowed, allow_missing)
    except XbenchError as exc:
        # a report that a CI job publishes says why, never comes out empty
        _error_report(
            fmt, "xbench compare", str(exc), {"baseline": baseline, "candidate": candidate}
        )
        raise
    if out is not None:
        _write(comparison, out, force)
    emit(comparison, gates, fmt, f"xbench compare ({comparison.baseline.command})")
    _exit(comparison)


def _error_report(fmt: CompareFormat, title: str, message: str, properties: dict) -> None:
    from xbench.compare.formats import junit_error, markdown_error

    if fmt == CompareFormat.markdown:
        sys.stdout.write(markdown_error(title, message))
    elif fmt == CompareFormat.junit:
        sys.stdout.write(junit_error(title, {k: str(v) for k, v in properties.items()}, message))


def _write(comparison, out: Path, force: bool) -> None:
    from xbench.results.metadata import new_run_id, run_metadata
    from xbench.results.schema import COMPARISON
    from xbench.results.store import refuse_overwrite, write_table

    refuse_overwrite(out, force, suffix=".parquet")
    meta = run_metadata(
        new_run_id("compare"),
        "compare",
        baseline=str(comparison.baseline.path),
        candidate=str(comparison.candidate.path),
        baseline_run=comparison.baseline.meta.get("run_id"),
        candidate_run=comparison.candidate.meta.get("run_id"),
        table=comparison.baseline.command,
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_table(Path(out), COMPARISON, comparison.cases, meta)


@handles_errors
def check(
    baseline: Annotated[Path, typer.Option(help="Baseline run directory (a probe or kernel run).")],
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML with a [check] table: threshold, alpha, allow (list), runs (launches)."
        ),
    ] = None,
    update_baseline: Annotated[
        bool,
        typer.Option(
            "--update-baseline",
            help="Promote this run to be the baseline (the old one is kept beside it).",
        ),
    ] = False,
    threshold: ThresholdOption = "5%",
    alpha: AlphaOption = 0.05,
    allow: AllowOption = "",
    allow_missing: AllowMissingOption = False,
    out: RunDirOption = None,
    report_dir: Annotated[
        Path | None,
        typer.Option(help="Where compare.md and compare.junit.xml go (default: the new run's)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the reports already in --report-dir.")
    ] = False,
    fmt: CompareFormatOption = CompareFormat.table,
) -> None:
    """Re-run the sweep BASELINE was made with, compare, write Markdown and JUnit XML."""
    from xbench.cli.progress import bars
    from xbench.compare import EXIT_INCOMPLETE, compare_runs, load_run
    from xbench.fabric.launch import refuse_launched_ranks
    from xbench.launches import rerun
    from xbench.results.store import read_run_meta, refuse_overwrite

    settings = _check_settings(config)
    gates = _gates(
        str(settings.get("threshold", threshold)),
        float(settings.get("alpha", alpha)),
        names=tuple(
            f"{config}: [check] {key} =" if key in settings else f"--{key}"
            for key in ("threshold", "alpha")
        ),
    )
    allowed = (
        _allowed(",".join(settings["allow"]), f"{config}: [check] allow has")
        if "allow" in settings
        else _allowed(allow)
    )
    meta = read_run_meta(baseline) if Path(baseline).is_dir() else {}
    if meta.get("command") not in ("probe", "kernel"):
        raise XbenchError(
            f"{baseline} is not a probe or kernel run",
            "make the baseline with xbench probe or xbench kernel (then xbench check --baseline it)",
        )
    if report_dir is not None:  # refused before the sweep runs, not after
        for name in ("compare.md", "compare.junit.xml", "comparison.parquet"):
            refuse_overwrite(Path(report_dir) / name, force, "--report-dir")
    refuse_launched_ranks("check", "xbench check, from a shell on the baseline's node")
    title = f"xbench check ({meta['command']})"
    run_id, new_dir = _new_run(meta["command"], out)
    try:
        stored = load_run(baseline)  # a damaged baseline refused before the sweep, not after it
        rerun(
            Path(baseline),
            meta["command"],
            run_id,
            new_dir,
            settings.get("runs"),
            progress=bars,
            warn=warn,
        )
        comparison = compare_runs(stored, new_dir, gates, allowed, allow_missing)
    except (XbenchError, KeyboardInterrupt) as exc:
        # the nightly job publishes these reports: they say why the run or the comparison
        # failed, whatever stopped it
        why = str(exc) if isinstance(exc, XbenchError) else "interrupted"
        _write_error_reports(Path(report_dir or new_dir), title, why, {"baseline": baseline})
        raise
    reports = Path(report_dir or new_dir)
    reports.mkdir(parents=True, exist_ok=True)
    write_text_atomically(
        reports / "compare.md", _report(comparison, gates, title, CompareFormat.markdown)
    )
    write_text_atomically(
        reports / "compare.junit.xml", _report(comparison, gates, title, CompareFormat.junit)
    )
    _write(comparison, reports / "comparison.parquet", force=True)
    emit(comparison, gates, fmt, title)
    # (on stderr where stdout carries the verdicts for a program to read)
    said = console if fmt == CompareFormat.table else err_console
    said.print(f"reports: {reports}/compare.md, {reports}/compare.junit.xml", highlight=False)
    if update_baseline:
        if comparison.problems:
            raise XbenchError(
                f"{new_dir} is not promoted: {comparison.problems[0]}",
                "promote a whole run (run check again), or copy it by hand",
                exit_code=comparison.exit_code or EXIT_INCOMPLETE,
            )
        kept = _promote(new_dir, Path(baseline))
        warn(f"{new_dir} is now the baseline {baseline}; the previous one is in {kept}")
        return
    _exit(comparison)


def _write_error_reports(reports: Path, title: str, why: str, properties: dict) -> None:
    from xbench.compare.formats import junit_error, markdown_error

    try:
        reports.mkdir(parents=True, exist_ok=True)
        write_text_atomically(reports / "compare.md", markdown_error(title, why))
        write_text_atomically(
            reports / "compare.junit.xml",
            junit_error(title, {k: str(v) for k, v in properties.items()}, why),
        )
    except OSError:
        pass  # the error being reported is the one that counts


def _check_settings(path: Path | None) -> dict:
    if path is None:
        return {}
    data = read_toml(path, "--config", "pass a TOML file with a [check] table")
    if not isinstance(data.get("check"), dict):
        raise XbenchError(
            f"{path} has no [check] table",
            'put the settings under [check], e.g. [check] threshold = "5%"',
        )
    settings = data["check"]
    unknown = set(settings) - {"threshold", "alpha", "allow", "runs"}
    if unknown:
        raise XbenchError(
            f"{path}: unknown [check] field {', '.join(sorted(unknown))}",
            "use threshold, alpha, allow and runs",
        )
    # TOML gives each value its own type: check them here, not as a traceback further on
    allow = settings.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise XbenchError(
            f"{path}: [check] allow must be a list of field names", 'e.g. allow = ["driver"]'
        )
    if not isinstance(settings.get("threshold", ""), (str, int, float)):
        raise XbenchError(f"{path}: [check] threshold is not a ratio", 'e.g. threshold = "5%"')
    alpha = settings.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise XbenchError(f"{path}: [check] alpha is not a number", "e.g. alpha = 0.05")
    runs = settings.get("runs", 1)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise XbenchError(
            f"{path}: [check] runs = {runs!r} is not a count of launches", "e.g. runs = 5"
        )
    return settings


def _new_run(command: str, out: Path | None) -> tuple[str, Path]:
    """A run id and a fresh run directory for the re-run (refused if it holds a run)."""
    from xbench.results.metadata import new_run_id
    from xbench.results.store import claim_run_dir

    run_id = new_run_id(command)
    return run_id, claim_run_dir(out or Path("results") / run_id)


def _promote(new_dir: Path, baseline: Path) -> Path:
    """Copy the new run into the baseline's place; the old baseline moves beside it."""
    import shutil

    from xbench.results.store import read_run_meta

    old_id = read_run_meta(baseline).get("run_id", "previous")
    kept = baseline.with_name(f"{baseline.name}.replaced-{old_id}")
    staging = baseline.with_name(f".{baseline.name}.incoming")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(new_dir, staging)
    baseline.rename(kept)
    staging.rename(baseline)
    return kept
