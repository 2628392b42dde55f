"""``xbench decide``: the route / fetch / local predicate over a grid of request shapes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    console,
    emit_frame,
    handles_errors,
    warn_conditions,
)
from xbench.cli.render import notes, result_table
from xbench.core.costmodel import MOST_LAYERS, MOST_SHAPE, MOST_TOKENS
from xbench.errors import XbenchError

# The model whose layers a decode step crosses when no --model is named (mission.md's)
REFERENCE_MODEL = "deepseek-v3.2"


@handles_errors
def decide(
    ctx: typer.Context,
    scenario: Annotated[
        Path | None,
        typer.Option(
            help="A scenario file (scenarios/*.toml) or a shipped one's name: its request and "
            "grid replace the grid options."
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(
            help="Routed bytes per query row (S_q/row), e.g. 1KB, a list or a doubling range "
            "256B:64KB. One of the two porting coefficients."
        ),
    ] = None,
    return_: Annotated[
        str | None,
        typer.Option(
            "--return", help="Returned bytes per query row (S_o/row); default: the payload."
        ),
    ] = None,
    fetch_cost: Annotated[
        str | None,
        typer.Option(
            help="Move-the-cache cost of one layer besides the wire, e.g. 50us, a list or a "
            "doubling range 10us:10ms (default: the profile's T_move(c))."
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="Profile TOML, or the name of one xbench ships (default: h100-priors, "
            "datasheet priors)."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model preset supplying heads, payload, return and KV bytes (xbench models)."
        ),
    ] = None,
    heads: Annotated[
        int | None,
        typer.Option(help="Query rows per decode token (default: the model's heads, else 1)."),
    ] = None,
    rows: Annotated[
        str, typer.Option(help="Decode tokens routed together (b), e.g. 1,8,64.")
    ] = "1,8,64",
    chunk: Annotated[
        str, typer.Option(help="Tokens of KV on the holder (c): 64:16384 doubles, or a list.")
    ] = "64:16384",
    reuse: Annotated[
        str, typer.Option(help="Later local uses of fetched blocks (r), e.g. 0,1,10,100.")
    ] = "0",
    kv_bytes: Annotated[
        str | None,
        typer.Option(help="KV bytes per token per layer (default: the model's, else 1152B)."),
    ] = None,
    segments: Annotated[
        int,
        typer.Option(
            help="Messages per fetch: 1 = packed (T_move), k = one per block from the cache (T_splice)."
        ),
    ] = 1,
    probe_phase: Annotated[
        bool,
        typer.Option(
            "--probe/--no-probe", help="Include the probe round trip (uncached holder lookup)."
        ),
    ] = False,
    layers: Annotated[
        int | None,
        typer.Option(
            help="Layers a decode step crosses: route pays its round trip each layer, fetch "
            f"moves every layer's KV once (default: the model's, else {REFERENCE_MODEL}'s; 1: "
            "one layer's times)."
        ),
    ] = None,
    holders: Annotated[
        int,
        typer.Option(
            help="Instances the chunk is spread over (k): route asks all k and merges k + 1 "
            "partials, fetch pulls from all k."
        ),
    ] = 1,
    pipeline_layers: Annotated[
        bool,
        typer.Option(
            "--pipeline-layers",
            help="Route's round trip once a step, the other layers' hidden behind compute "
            "(micro-batches in flight); default: once a layer.",
        ),
    ] = False,
    fabric: Annotated[
        str, typer.Option(help="all (best fabric per request), or a comma list to compare.")
    ] = "all",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Decision table Parquet file (default results/<run_id>/decisions.parquet).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    sources: Annotated[
        bool,
        typer.Option(
            "--sources",
            help="Also print the profile's terms, each with where its value comes from.",
        ),
    ] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Evaluate the predicate over rows x chunk x reuse (x fabric); write the decision table."""
    from xbench.core.models import get_model, mla_model
    from xbench.core.profile import load_profile
    from xbench.core.units import parse_int_list
    from xbench.resources import DEFAULT_PROFILE, profile_path

    prof = load_profile(profile_path(profile or DEFAULT_PROFILE))
    if sources and fmt is OutputFormat.table:  # the terms the decisions rest on, sourced
        from xbench.cli.terms import coefficient_frame, print_terms

        console.print(f"profile {prof.name}: its terms", style="bold", highlight=False)
        print_terms(coefficient_frame(prof), sources=True)
    from xbench.host import host_conditions

    # A GPU profile read on a host without GPUs is planning, not use: nothing to compare.
    fitted = prof.provenance.get("conditions") or {}
    warn_conditions(prof, host_conditions(gpu="gpu" in fitted))
    if sources and payload is None and model is None and scenario is None:
        # the profile's terms and where each comes from were asked, and no request: they
        # are the whole answer (JSON and CSV hold the same frame)
        if fmt is not OutputFormat.table:
            from xbench.cli.terms import coefficient_frame

            emit_frame(coefficient_frame(prof), fmt, lambda f: None)
        return
    if scenario is not None:
        _refuse_overridden(ctx)
        _refuse_overwrite(out, force)
        return _decide_scenario(scenario, prof, out, fmt, force)
    preset = mla_model(model, "--model") if model else None
    h, pays, ret, kvb = _request_shape(preset, heads, payload, return_, kv_bytes)
    moves = _fetch_costs(fetch_cost)
    if layers is None:
        layers = (preset or get_model(REFERENCE_MODEL)).layers
    # zero or negative rows and tokens are refused below with the scenario files' shapes, by
    # name and with the bound that holds for each
    anything = -(2**62)
    chunks = parse_int_list(chunk, "--chunk", least=anything)
    reuses = parse_int_list(reuse, "--reuse", least=anything)
    row_list = parse_int_list(rows, "--rows", least=anything)
    fabrics = _fabrics(prof, fabric)
    if segments < 1:
        raise XbenchError(
            "--segments must be at least 1", "1 = packed fetch, k = one message per block"
        )
    _refuse_overwrite(out, force)
    # the grid's pandas only now: a refused option answers without it (half a second)
    from xbench.core.grid import decide_grid, expand

    axes = {
        "rows": row_list, "chunk_tokens": chunks, "reuse": reuses, "fabric": fabrics,
        "payload_bytes": pays, "fetch_cost": moves,
    }  # fmt: skip
    grid = expand(axes)
    grid["heads"], grid["kv_bytes_per_token"] = h, kvb
    grid["return_bytes"] = grid["payload_bytes"] if ret is None else ret
    grid["segments"], grid["include_probe"] = segments, probe_phase
    grid["layers"], grid["holders"], grid["pipeline_layers"] = layers, holders, pipeline_layers
    check_shapes(grid)
    table = decide_grid(prof, grid)
    settings = {
        "profile": prof.name,
        "model": preset.name if preset else None,
        "heads": h,
        "payload_bytes": pays[0] if len(pays) == 1 else pays,
        "return_bytes": ret,  # None: each row's payload
        "kv_bytes_per_token": kvb,
        "fetch_cost_s": None if math.isnan(moves[0]) else (moves[0] if len(moves) == 1 else moves),
        "segments": segments,
        "probe": probe_phase,
        "layers": layers,
        "holders": holders,
        "pipeline_layers": pipeline_layers,
    }
    path = _write(table, prof, settings, out, force)
    thresholds = _thresholds(prof, min(row_list), chunks, settings, fabrics)
    emit_frame(table, fmt, lambda f: _render(f, thresholds, prof, settings, path))


def _refuse_overwrite(out: Path | None, force: bool) -> None:
    if out is not None:
        from xbench.results.store import refuse_overwrite

        refuse_overwrite(out, force, suffix=".parquet")


def _request_shape(preset, heads, payload, return_, kv_bytes) -> tuple:
    """(heads, payloads, return (None: each payload), KV bytes a token) from the options,
    else the model's."""
    from xbench.core.units import parse_size, parse_size_list

    if preset is None and payload is None:
        raise XbenchError(
            "give --payload (routed bytes per query row) or --model",
            "e.g. xbench decide --payload 1KB, or --model deepseek-v3.2",
        )
    # (zero is refused below with the other shapes, by name)
    pays = parse_size_list(payload, allow_zero=True) if payload else [preset.query_bytes_per_row()]
    ret = (
        parse_size(return_)
        if return_
        else (preset.return_bytes_per_row() if preset and not payload else None)
    )
    kvb = parse_size(kv_bytes) if kv_bytes else (preset.kv_bytes_per_token() if preset else 1152)
    h = heads if heads is not None else (preset.q_heads if preset else 1)
    return h, pays, ret, kvb


def _fetch_costs(fetch_cost: str | None) -> list[float]:
    """--fetch-cost: the move costs in seconds, or [NaN] (the profile's T_move)."""
    from xbench.core.units import parse_duration_list

    if not fetch_cost:
        return [math.nan]
    return parse_duration_list(fetch_cost, "--fetch-cost", 0.0, 3600.0, "50us,1ms or 10us:10ms")


def _fabrics(prof, fabric: str) -> list:
    """--fabric: [None] for all (the best per request), else the profile's fabrics named."""
    from xbench.core.units import parse_name_list

    if fabric == "all":
        return [None]
    fabrics = parse_name_list(fabric, "--fabric")
    names = [f.name for f in prof.fabrics]
    bad = [x for x in fabrics if x not in names]
    if bad:
        raise XbenchError(
            f"profile {prof.name} has no fabric {', '.join(bad)}",
            f"pick from {', '.join(names)} or all",
        )
    return fabrics


# What a scenario file sets in place of the grid options (its request and its axes)
_SCENARIO_SETS = (
    "payload",
    "return_",
    "fetch_cost",
    "model",
    "heads",
    "rows",
    "chunk",
    "reuse",
    "kv_bytes",
    "segments",
    "probe_phase",
    "fabric",
    "layers",
    "holders",
    "pipeline_layers",
)


def _refuse_overridden(ctx) -> None:
    """A grid option given with --scenario would be silently replaced by the scenario's
    value: refused, naming it."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    given = [
        flags[name]
        for name in _SCENARIO_SETS
        if getattr(ctx.get_parameter_source(name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")
    ]
    if given:
        raise XbenchError(
            f"--scenario sets the request and the grid itself; {', '.join(given)} would be ignored",
            "drop " + ", ".join(given) + ", or edit a copy of the scenario file",
        )


def _scenario_step(path: Path, given, sc: dict) -> tuple[int, bool, int]:
    """(layers, pipelined, holders) of the scenario's decode [workload]; one layer on one
    holder without one. A prefill workload is refused."""
    from xbench.core.scenario import load_workload

    if not sc["workload"]:
        return 1, False, 1
    spec = load_workload(path)
    if spec["kind"] != "decode":
        # a prefill workload asks where to prefill, not where a decode query attends
        raise XbenchError(
            f"scenario {spec['name']} is a {spec['kind']} workload: decide answers a decode "
            "query's route, fetch or local, a question its system never asks",
            f"run xbench simulate {given} (where to prefill, the offload threshold)",
        )
    fields = spec["fields"]
    return fields["layers"], fields["pipeline_layers"], fields["holders"]


def _decide_scenario(path: Path, prof, out, fmt, force: bool = False) -> None:
    from xbench.core.grid import decide_grid, expand
    from xbench.core.scenario import load_scenario
    from xbench.resources import scenario_path

    given, path = path, scenario_path(path)
    sc = load_scenario(path)
    # a scenario's times cover what its simulated use covers: one layer, or the decode step
    # its [workload] names (layers, pipeline_layers, holders), so decide and simulate answer
    # alike
    layers, pipelined, holders = _scenario_step(path, given, sc)
    names = [f.name for f in prof.fabrics]
    bad = [f for f in sc["axes"]["fabric"] if f is not None and f not in names]
    if bad:
        raise XbenchError(
            f"scenario {sc['name']} asks for fabric {', '.join(bad)}, which profile {prof.name} lacks",
            f"use a profile with {', '.join(bad)}, or edit the scenario",
        )
    grid = expand(sc["axes"])
    for key, value in sc["request"].items():
        grid[key] = value
    grid["layers"], grid["pipeline_layers"], grid["holders"] = layers, pipelined, holders
    check_shapes(grid, f"scenario {path}")
    table = decide_grid(prof, grid)
    req = sc["request"]
    settings = {
        "profile": prof.name,
        "scenario": sc["name"],
        "source": sc["source"],
        "model": sc["model"],
        "heads": req["heads"],
        "payload_bytes": req["payload_bytes"],
        "return_bytes": req["return_bytes"],
        "kv_bytes_per_token": req["kv_bytes_per_token"],
        "fetch_cost_s": None if math.isnan(req["fetch_cost"]) else req["fetch_cost"],
        "segments": req["segments"],
        "probe": req["include_probe"],
        "layers": layers,
        "holders": holders,
        "pipeline_layers": pipelined,
    }
    written = _write(table, prof, settings, out, force)
    thresholds = _thresholds(
        prof, min(sc["axes"]["rows"]), sc["axes"]["chunk_tokens"], settings, sc["axes"]["fabric"]
    )
    if fmt == OutputFormat.table:
        console.print(
            Text.assemble(
                (f"scenario {sc['name']}", "bold"), f" ({sc['source']}): {sc['description']}"
            ),
            highlight=False,
        )
    emit_frame(table, fmt, lambda f: _render(f, thresholds, prof, settings, written))


# Each request field, the option that sets it, and the least and most values that mean
# something.
_SHAPES = (
    ("rows", "--rows", 1, MOST_SHAPE),
    ("heads", "--heads", 1, MOST_SHAPE),
    ("chunk_tokens", "--chunk", 1, MOST_TOKENS),
    ("payload_bytes", "--payload", 1, MOST_SHAPE),
    ("return_bytes", "--return", 1, MOST_SHAPE),
    ("kv_bytes_per_token", "--kv-bytes", 1, MOST_SHAPE),
    ("segments", "--segments", 1, MOST_SHAPE),
    ("reuse", "--reuse", 0, MOST_SHAPE),
    ("layers", "--layers", 1, MOST_LAYERS),
    ("holders", "--holders", 1, MOST_SHAPE),
)


def _shown(value, show) -> str:
    """A request field as an option writes it; a number of many digits by its first."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if abs(value) > 2**62:
        digits = str(int(value))
        return f"{digits[:8]}... ({len(digits)} digits)"
    return show(value)


def check_shapes(grid, where: str = "") -> None:
    """Refuse request shapes the model cannot mean: no rows, no tokens, no bytes, or more
    than any request holds."""
    for column, option, least, most in _SHAPES:
        if column not in grid.columns or not len(grid):
            continue
        source = f"{where}: {column}" if where else option
        # compared as they are: an integer of hundreds of digits is no float
        low, high = grid[column].min(), grid[column].max()
        if low < least:
            raise XbenchError(
                f"{source} {_shown(low, lambda v: f'{v:g}')} is not a request shape (at least {least})",
                f"give {option} of {least} or more",
            )
        if high > most:
            from xbench.core.units import format_size

            show = format_size if column.endswith(("bytes", "per_token")) else str
            raise XbenchError(
                f"{source} {_shown(high, lambda v, show=show: show(int(v)))} is beyond any request",
                f"keep {option} at or below {show(most)}",
            )
    # a message of a fetch carries at least one token of each holder's share
    if {"segments", "chunk_tokens"} <= set(grid.columns) and len(grid):
        holders = grid["holders"] if "holders" in grid.columns else 1
        share = grid["chunk_tokens"] // holders
        over = grid[grid["segments"] > share]
        if len(over):
            row = over.iloc[0]
            source = f"{where}: segments" if where else "--segments"
            raise XbenchError(
                f"{source} {int(row.segments):,} for a chunk of {int(row.chunk_tokens):,} "
                "tokens: a fetch sends more messages than the tokens it moves",
                f"pass at most {int(share.min()):,} (one a page: the chunk over the page's "
                "tokens, 16 for 1,024 tokens in 64-token pages)",
            )


def _write(table, prof, settings, out: Path | None, force: bool = False) -> Path:
    from xbench.results.metadata import new_run_id, run_metadata
    from xbench.results.schema import DECISIONS
    from xbench.results.store import ensure_writable_dir, write_table

    run_id = new_run_id("decide")
    path = out or Path("results") / run_id / "decisions.parquet"
    ensure_writable_dir(path.parent)
    meta = run_metadata(
        run_id,
        "decide",
        settings=settings,
        profile_provenance=prof.provenance,
        rests_on_priors=prof.rests_on_priors,
    )
    frame = table.copy()
    if "fabric" not in frame.columns:
        frame["fabric"] = None
    frame["fetch_cost"] = frame.get("fetch_cost", float("nan"))
    for column, value in (
        ("layers", settings["layers"]),
        ("holders", settings["holders"]),
        ("pipeline_layers", settings["pipeline_layers"]),
    ):
        frame[column] = frame.get(column, value)
    frame["fetch_cost"] = frame["fetch_cost"].where(frame["fetch_cost"].notna(), None)
    for column in ("decision", "fabric_chosen", "ranked_by"):
        frame[column] = frame[column].astype(str)
    # without --force a file another command wrote meanwhile is kept, and this one refused
    return write_table(path, DECISIONS, frame, meta, replace=force)


def _first(value):
    """A setting's value, or its first where it holds a list."""
    return value[0] if isinstance(value, list) else value


def _thresholds(prof, rows: int, chunks, settings: dict, fabrics) -> list:
    """(fabric, chunk, b*, u*, P*, F*, n_1/2) at the fewest rows, the first payload and
    fetch cost, per fabric and chunk."""
    from xbench.core.costmodel import Request, break_evens, thresholds

    out = []
    chosen = prof.fabrics if fabrics == [None] else [prof.fabric(n) for n in fabrics]
    payload = _first(settings["payload_bytes"])
    for f in chosen:
        for c in chunks:
            req = Request(
                rows=rows,
                heads=settings["heads"],
                chunk_tokens=c,
                payload_bytes=payload,
                return_bytes=settings["return_bytes"] or payload,
                kv_bytes_per_token=settings["kv_bytes_per_token"],
                segments=settings["segments"],
                fetch_cost=_first(settings["fetch_cost_s"]),
                layers=settings["layers"],
                holders=settings["holders"],
                pipeline_layers=settings["pipeline_layers"],
            )
            forms = (*thresholds(f, prof.device, req), *break_evens(f, prof.device, req))
            out.append((f.name, c, *forms, f.half_performance_bytes()))
    return out


def _time(x: float, per_second: float) -> str:
    from xbench.cli.render import num

    return "-" if x == math.inf else num(x * per_second)


def _time_unit(f) -> tuple[float, str]:
    """us, or ms where a time reaches 100 ms (a step over many layers): the table keeps
    every digit in 80 columns."""
    import numpy as np

    times = f[["t_route", "t_fetch", "t_local"]].to_numpy()
    finite = times[np.isfinite(times)] if len(times) else times
    return (1e3, "ms") if len(finite) and finite.max() >= 0.1 else (1e6, "us")


def _step_words(settings: dict) -> str:
    """What the times cover: one layer, or a decode step of L layers (k holders, pipelined)."""
    layers, holders = settings["layers"], settings["holders"]
    words = "a layer" if layers == 1 else f"a decode step of {layers} layers"
    if holders > 1:
        words += f", the chunk on {holders} holders"
    if settings["pipeline_layers"] and layers > 1:
        words += ", route's round trip once a step"
    return words


def _sizes_words(settings: dict) -> str:
    payload, back = settings["payload_bytes"], settings["return_bytes"]
    out = f"{min(payload)}-{max(payload)} B" if isinstance(payload, list) else f"{payload} B"
    return f"{out} out and {'as much' if back is None else f'{back} B'} back a row"


def _request_columns(f, caption: str) -> tuple[list, str]:
    """The request's columns of the table, (name, frame column, how shown), and the caption.
    The porting coefficients get a column where the run swept them; then the axes that hold
    one value go to the caption, so the table keeps 80 columns."""
    from xbench.core.units import format_duration, format_size

    swept = [
        (name, column, show)
        for name, column, show in (
            ("payload", "payload_bytes", lambda v: format_size(int(v))),
            ("move", "fetch_cost", format_duration),
        )
        if column in f.columns and f[column].nunique() > 1
    ]
    axes = [("rows", "rows", str), ("chunk", "chunk_tokens", str), ("reuse", "reuse", str)]
    if swept:
        fixed = [(name, column) for name, column, _ in axes if f[column].nunique() == 1]
        caption += "".join(f", {name} {f[column].iloc[0]}" for name, column in fixed)
        axes = [axis for axis in axes if axis[:2] not in fixed]
    return axes + swept, caption


def _render(f, thresholds, prof, settings, path) -> None:
    heads = settings["heads"]
    per_second, unit = _time_unit(f)
    title = f"xbench decide on profile '{prof.name}': times in {unit} {_step_words(settings)}"
    shapes = (
        f"{heads} {'row' if heads == 1 else 'rows'} a token, {_sizes_words(settings)}, "
        f"{settings['kv_bytes_per_token']} B of KV a token a layer"
    )
    any_prior = bool(f["prior"].any())
    shown, shapes = _request_columns(f, shapes)
    table = result_table(title, shapes)
    columns = [name for name, _, _ in shown]
    for col in (*columns, "decision", "fabric", "by", "route", "fetch", "local", "margin"):
        table.add_column(
            col,
            justify="left" if col in ("decision", "fabric", "by") else "right",
            no_wrap=True,
            min_width=max(len(col), 3),
        )
    for r in f.itertuples():
        flags = ("?" if r.uncertain else "") + ("*" if r.prior else "")
        style = {"route": "green", "fetch": "yellow", "local": "cyan"}[r.decision]
        table.add_row(
            *(show(getattr(r, column)) for _, column, show in shown),
            Text.assemble((r.decision, style), flags),
            str(r.fabric_chosen),
            _BY[r.ranked_by],
            *(_time(t, per_second) for t in (r.t_route, r.t_fetch, r.t_local, r.margin)),
        )
    console.print(table)
    notes(
        f"written to {path}",
        "? = uncertain (the coefficients' 95% intervals allow another answer); by: the wire "
        "term (lat: alpha, bw: bytes/beta, ovh: o) the next fabric pays most over the chosen "
        "one (with one fabric, the largest of its own; - where local wins)"
        + (
            "; * rests on a datasheet prior or a term a fit left at its bound: measure and "
            "xbench fit to replace them"
            if any_prior
            else ""
        ),
    )
    th = result_table("closed-form thresholds (at the smallest batch)")
    for col in ("fabric", "chunk", "b* (route if b <)", "u* (fetch if 1+r >)", "n1/2 (B)"):
        th.add_column(col, justify="left" if col == "fabric" else "right")
    for name, c, b_star, u_star, _, _, n_half in thresholds:
        th.add_row(
            name,
            str(c),
            f"{b_star:,.1f}" if b_star > 0 else "never",
            f"{u_star:,.2f}",
            f"{n_half:,.0f}",
        )
    console.print(th)
    even = result_table("where route and fetch trade places (at the smallest batch)")
    for col in ("fabric", "chunk", "P* (route if B/row <)", "F* (fetch if move <, us)"):
        even.add_column(col, justify="left" if col == "fabric" else "right")
    for name, c, _, _, payload_star, move_star, _ in thresholds:
        even.add_row(
            name,
            str(c),
            _break_even(payload_star, "{:,.0f}"),
            _break_even(move_star * 1e6, "{:,.1f}"),
        )
    console.print(even)
    notes(
        "P*: routed bytes a row, out and back; F*: a layer's move cost besides the wire; "
        "never: the other option wins at any value"
    )


# The by column's short names for what ranked the fabric (Decision.ranked_by)
_BY = {"latency": "lat", "bandwidth": "bw", "overhead": "ovh", "none": "-"}


def _break_even(value: float, form: str) -> str:
    """A break-even point, or where nothing flips along it: never (the other option wins
    at any value) or - (no crossing)."""
    if value == math.inf:
        return "-"
    return form.format(value) if value > 0 else "never"
