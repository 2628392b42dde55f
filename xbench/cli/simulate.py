"""``xbench simulate``: a scenario's workload through the fitted model, policy by policy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbench.cli.common import (
    FormatOption,
    OutputFormat,
    console,
    emit_frame,
    emit_frames,
    handles_errors,
    warn,
)
from xbench.cli.render import num, result_table
from xbench.core.costmodel import MOST_LAYERS
from xbench.core.units import format_duration, parse_name_list, parse_rate
from xbench.errors import XbenchError


@handles_errors
def simulate(
    scenario: Annotated[
        Path,
        typer.Argument(
            help="Scenario file with a [workload] table, or the name of one xbench ships "
            "(scenarios/, e.g. agentic-codebase)."
        ),
    ],
    profile: Annotated[
        str | None, typer.Option(help="Fitted profile (default: the shipped h100-priors).")
    ] = None,
    policy: Annotated[str, typer.Option(help="route, fetch, local, predicate, or all.")] = "all",
    requests: Annotated[
        int | None, typer.Option(help="Requests to replay (default: the scenario's).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals and popularity draws.")] = 0,
    fabric: Annotated[
        str | None,
        typer.Option(
            help="Fabric(s) to simulate instead of the scenario's, comma list (e.g. shm)."
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            help="Arrival rate instead of the scenario's, e.g. 50/s (a CPU-fitted profile "
            "carries far less than the H100 rates the scenarios are written for)."
        ),
    ] = None,
    layers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MOST_LAYERS,
            help="Layers a use's decode step crosses, instead of the scenario's (default 1: "
            "one layer's times): attention, merge and move every layer, route's round trip "
            "every layer, fetch every layer's KV in one transfer, as decide --layers.",
        ),
    ] = None,
    pipeline_layers: Annotated[
        bool | None,
        typer.Option(
            "--pipeline-layers/--no-pipeline-layers",
            help="Route's round trip once a step instead of once a layer (default: the "
            "scenario's, else once a layer).",
            show_default=False,
        ),
    ] = None,
    holders: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Instances each shared chunk is spread over, a share on each, instead of "
            "the scenario's (default 1): route asks every holder and merges k + 1 partials, "
            "fetch pulls every share through the requester's link, as decide --holders.",
        ),
    ] = None,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate",
            help="Replay a short trace for real between two local ranks (route, fetch, and "
            "the predicate's simulated decisions) and print simulated against measured; "
            "needs a profile fitted here.",
        ),
    ] = False,
    replays: Annotated[
        int,
        typer.Option(
            min=1,
            help="--validate: rounds per policy, each a calibration replay then the trace's; "
            "from 2 on the table compares medians over rounds and shows how far the replays "
            "landed from theirs (the machine against itself).",
        ),
    ] = 1,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Also write the table as Parquet here, and the reports beside it "
            "(NAME.saturation.parquet, NAME.sharing-steps.parquet, ...; --validate: its "
            "replays' files go beside it, else under results/).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    fmt: FormatOption = OutputFormat.table,
) -> None:
    """Replay a workload: queueing at holders, batching, a requester cache, shared links."""
    import pandas as pd  # here, not at import: every command's start would pay for it

    from xbench.cli.progress import make_progress
    from xbench.core.profile import load_profile
    from xbench.core.scenario import MOST_REQUESTS, load_workload
    from xbench.resources import DEFAULT_PROFILE, profile_path, scenario_path
    from xbench.results.store import refuse_overwrite, report_path
    from xbench.simulate import (
        POLICIES,
        batching_gain,
        decide_beside,
        moves_on_compute,
        own_copies,
        run,
        saturated_line,
        sharing_report,
        span_hit_rates,
        span_reuse,
        span_ttft_reach,
    )
    from xbench.simulate.prefill import DEPLOYMENTS, PREFILL_POLICIES, run_prefill, saturation

    prof = load_profile(profile_path(profile or DEFAULT_PROFILE))
    scenario = scenario_path(scenario)
    spec = load_workload(scenario)
    if seed < 0:  # numpy's generators take none
        raise XbenchError(f"--seed {seed}: seeds are 0 or more", "pass e.g. --seed 0")
    if fabric is not None:
        spec["fabrics"] = parse_name_list(fabric, "--fabric")
    if rate is not None:
        try:
            spec["fields"]["rate_per_s"] = parse_rate(rate)
        except XbenchError:
            raise XbenchError(f"--rate {rate!r} is not a rate", "write e.g. --rate 50/s") from None
    if requests is not None and not 1 <= requests <= MOST_REQUESTS:
        why = "nothing to replay" if requests < 1 else "beyond what one replay holds"
        raise XbenchError(f"--requests {requests}: {why}", f"pass 1 to {MOST_REQUESTS:,}")
    _set_step(spec, layers, pipeline_layers, holders, validate)
    known = PREFILL_POLICIES if spec["kind"] == "prefill" else POLICIES
    policies = (
        list(known) if policy == "all" else parse_name_list(policy, "--policy", known, "policy")
    )
    if spec["kind"] == "prefill" and prof.device.recompute_per_token is None:
        raise XbenchError(
            f"profile {prof.name} has no prefill cost (recompute_per_token) to simulate {scenario}",
            "use the shipped h100-priors, or fit with --base h100-priors to keep its prefill terms",
        )
    if spec["kind"] == "prefill" and spec["fields"].get("output_tokens"):
        ceilings = prof.ceilings
        if ceilings is None:
            raise XbenchError(
                f"profile {prof.name} has no [ceilings] memory rate and GPU memory (hbm), "
                f"which {scenario}'s decode steps read their weights and KV at",
                "use the shipped h100-priors, or set output_tokens = 0 (prefill only)",
            )
        if not (spec["fields"].get("local_hbm_gb") or ceilings.hbm):
            raise XbenchError(
                f"profile {prof.name} gives no GPU memory ([ceilings] hbm), which holds "
                f"{scenario}'s decode batch beside the weights",
                "set local_hbm_gb in the scenario's [workload], or output_tokens = 0",
            )
    if validate:
        from xbench.fabric.launch import refuse_launched_ranks

        refuse_launched_ranks("simulate --validate", "xbench simulate --validate")
        _validate(
            prof, spec, scenario, policies, requests, seed, fabric, rate, replays, out, force, fmt
        )
        return
    if replays != 1:
        raise XbenchError("--replays counts --validate's replays", "add --validate, or drop it")
    names = {f.name for f in prof.fabrics}
    missing = [f for f in spec["fabrics"] if f not in names]
    has = ", ".join(sorted(names))
    if missing and fabric is not None:  # the user's word, not the scenario's
        raise XbenchError(
            f"--fabric {', '.join(missing)}: profile {prof.name} has no such fabric",
            f"pass one it has ({has}), or a --profile with it",
        )
    if missing:
        raise XbenchError(
            f"profile {prof.name} has no fabric {', '.join(missing)} that {scenario} simulates",
            f"use a profile with it, or change [workload] fabric (the profile has {has})",
        )
    n = requests if requests is not None else spec["requests"]
    _refuse_unresolved_times(spec, n, rate)
    prefill = spec["kind"] == "prefill"
    if out is not None:  # every file it would write, before any is
        refuse_overwrite(out, force, suffix=".parquet")
        for path in (report_path(out, name) for name in _reports(spec)):
            refuse_overwrite(path, force)
    if not prefill:
        spec["fields"]["move_on_compute"] = moves_on_compute(prof)
    steps = len(spec["fabrics"]) * (4 + len(DEPLOYMENTS) if prefill else len(policies))
    with make_progress() as progress:
        task = progress.add_task("simulate", total=steps)

        def step(label: str) -> None:
            progress.update(task, advance=1, description=f"simulate {label}", refresh=True)

        if prefill:
            frame, facts = run_prefill(prof, spec, n, seed, on_step=step)
            # the deployments at saturation, each rate found by bisection over a shorter trace
            saturated = saturation(prof, spec, min(n, SATURATION_REQUESTS), seed, on_step=step)
            frame = frame[frame.policy.isin(policies)].reset_index(drop=True)
        else:
            frame = run(prof, spec, policies, n, seed, on_step=step)
    gains = batching_gain(prof, spec, n, seed) if "batching" in spec["reports"] else []
    copies = own_copies(prof, spec, n, seed, frame) if "copies" in spec["reports"] else None
    reuse = span_reuse(prof, spec, n, seed) if spec["fields"].get("spans") else None
    hits = span_hit_rates(prof, spec) if spec.get("span_cache") else None
    reach = span_ttft_reach(prof, spec, hits) if hits is not None and "ttft_ratio" in hits else None
    sharing = sharing_report(prof, spec) if spec.get("sharing") else None
    beside = None if prefill else decide_beside(prof, spec, frame)
    if out is not None:
        made = {
            "saturation": saturated if prefill else None,
            "sharing-calls": sharing and sharing[0],
            "sharing-steps": sharing and sharing[1],
            "span-hits": hits,
            "copies": copies,
        }
        reports = {name: made[name] for name in _reports(spec)}  # those refused above
        _write(out, frame, spec, prof, seed, prefill, reports, sharing and sharing[2])
    if prefill:
        emit_frames(
            {"simulation": frame, "saturation": saturated},
            fmt,
            lambda: _prefill_table(frame, spec, prof.name, n, facts, out, saturated),
        )
        return
    tables = {
        "simulation": frame,
        "decide": beside,
        "batching": pd.DataFrame(gains),
        "span_reuse": reuse,
        "span_hits": hits,
        "span_ttft_reach": reach,
        "sharing_calls": sharing and sharing[0],
        "sharing_steps": sharing and sharing[1],
        "copies": copies,
    }
    emit_frames(
        tables,
        fmt,
        lambda: _table(
            frame, spec, prof.name, n, gains, out, reuse, beside, (hits, reach), sharing, copies
        ),
    )
    if line := saturated_line(frame):
        warn(line)


# A trace's times are floats: past this span (s) their resolution is coarser than the
# nanoseconds a latency is printed in, and latencies of microseconds read as 0
LONGEST_TRACE_S = 2**-30 / 2**-52  # 1 ns at 2**-52 of the span: about 4.2e6 s


def _refuse_unresolved_times(spec: dict, requests: int, rate: str | None) -> None:
    """Refuse a rate so low that the trace's clock cannot resolve its latencies."""
    per_s = spec["fields"]["rate_per_s"]
    span = requests / per_s
    if span > LONGEST_TRACE_S:
        least = requests / LONGEST_TRACE_S
        given = f"--rate {rate}" if rate is not None else f"the scenario's rate ({per_s:g}/s)"
        raise XbenchError(
            f"{given}: {requests:,} requests span {span:.3g} s, where the clock's resolution "
            f"({span * 2**-52:.2g} s) is coarser than the latencies",
            f"pass --rate {least:.3g}/s or more, or fewer --requests",
        )


def _set_step(
    spec: dict, layers: int | None, pipelined: bool | None, holders: int | None, validate: bool
) -> None:
    """--layers, --pipeline-layers and --holders into a decode workload's fields (refused
    for a prefill workload, whose model sets its layers and which routes no query, and for
    --validate's replay of one layer on one holder)."""
    steps = (("--layers", layers), ("--pipeline-layers", pipelined), ("--holders", holders))
    given = [flag for flag, value in steps if value is not None]
    if given and spec["kind"] != "decode":
        raise XbenchError(
            f"{' and '.join(given)}: a prefill workload takes its layers from its model and "
            "ships whole prompts' KV",
            f"drop {' and '.join(given)}",
        )
    fields = spec["fields"]
    if layers is not None:
        fields["layers"] = layers
    if pipelined is not None:
        fields["pipeline_layers"] = pipelined
    if holders is not None:
        if holders > fields["instances"]:
            raise XbenchError(
                f"--holders {holders} is more than the workload's {fields['instances']} instances",
                f"pass at most --holders {fields['instances']}",
            )
        fields["holders"] = holders
    if validate and spec["kind"] == "decode" and fields["layers"] != 1:
        raise XbenchError(
            f"--validate replays one layer between two ranks; this workload's use is "
            f"{fields['layers']} layers",
            "pass --layers 1, or drop --validate",
        )
    if validate and spec["kind"] == "decode" and fields["topk"]:
        raise XbenchError(
            f"--validate replays one use of one chunk a request; this workload's requests "
            f"attend {fields['topk']} chunks"
            + (" and their own KV" if fields["unique_tokens"] else ""),
            "simulate it without --validate",
        )
    if validate and spec["kind"] == "decode" and fields["holders"] != 1:
        raise XbenchError(
            f"--validate replays a chunk on one holder between two ranks; this workload "
            f"spreads it over {fields['holders']}",
            "pass --holders 1, or drop --validate",
        )


def _step_words(fields: dict) -> str:
    """What a simulated use's times cover."""
    layers, holders = fields.get("layers", 1), fields.get("holders", 1)
    spread = f", each shared chunk on {holders} holders" if holders > 1 else ""
    if layers == 1:
        return "times per use of one layer" + spread
    words = f"times per use of a decode step of {layers} layers"
    return (
        words + (" (route's round trip once a step)" if fields["pipeline_layers"] else "") + spread
    )


def _reports(spec: dict) -> list[str]:
    """The reports this workload's simulation writes beside --out."""
    if spec["kind"] == "prefill":
        return ["saturation"]
    names = ["sharing-calls", "sharing-steps"] if spec.get("sharing") else []
    names += ["copies"] if "copies" in spec["reports"] else []
    return names + (["span-hits"] if spec.get("span_cache") else [])


def _write(out, frame, spec, prof, seed: int, prefill: bool, reports: dict, facts=None) -> None:
    """The policies' rows to --out, and each report beside it, with the run's metadata (the
    sharing report's bounds with it)."""
    from xbench.results.metadata import new_run_id, run_metadata
    from xbench.results.schema import PREFILL_SIMULATION, SIMULATION, SIMULATION_REPORTS
    from xbench.results.store import report_path, write_table

    # a decode use's step and a request's uses (a prefill workload's layers are its
    # model's, in its fields)
    shape = ("layers", "pipeline_layers", "holders", "topk", "unique_tokens")
    step = {} if prefill else {k: spec["fields"][k] for k in shape}
    meta = run_metadata(
        new_run_id("simulate"), "simulate", scenario=spec["name"], profile=prof.name, seed=seed,
        **step, **({"sharing": facts} if facts else {}),
    )  # fmt: skip
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_table(Path(out), PREFILL_SIMULATION if prefill else SIMULATION, frame, meta)
    for name, report in reports.items():
        write_table(report_path(out, name), SIMULATION_REPORTS[name], report, meta)


def _table(
    frame,
    spec,
    profile: str,
    n: int,
    gains,
    out,
    reuse=None,
    beside=None,
    span=(None, None),
    sharing=None,
    copies=None,
) -> None:
    hits, reach = span  # span_hit_rates and span_ttft_reach
    table = result_table(
        f"xbench simulate: {spec['name']} ({n:,} requests, profile {profile})",
        (f"{out}  |  " if out else "")
        + (
            "T_move runs on the compute (gather at the holder, splice here: a CPU-fitted "
            "profile);  "
            if spec["fields"].get("move_on_compute")
            else ""
        )
        + f"{_step_words(spec['fields'])};  "
        + "link, gpu: the busiest instance's egress and compute;  shares: present "
        "(home, cached or arriving) / route / fetch / local;  vs best: the predicate's mean "
        "latency against the better of always-route and always-fetch on the same trace"
        + (
            ";  span requests: present is each policy's KV-cache hit rate (a request's chunks "
            "found here, its prefix always), route and fetch the KV reused from elsewhere, "
            "local the KV prefilled again; a latency is a request's first decode step over "
            "all its chunks (its time to first token, less its question's prefill)"
            if spec["fields"].get("spans")
            else ""
        ),
    )
    for col in ("fabric", "policy", "p50", "p99", "mean", "link", "gpu", "shares %", "vs best"):
        table.add_column(
            col, justify="left" if col in ("fabric", "policy", "shares") else "right", no_wrap=True
        )
    for r in frame.itertuples():
        shares = "/".join(
            f"{100 * getattr(r, f'share_{p}'):.0f}" for p in ("present", "route", "fetch", "local")
        )
        gain = (
            "-"
            if r.gain_vs_best_static != r.gain_vs_best_static
            else f"{100 * r.gain_vs_best_static:+.1f}%"
        )
        table.add_row(
            r.fabric,
            r.policy,
            format_duration(r.p50_us * 1e-6),
            format_duration(r.p99_us * 1e-6),
            format_duration(r.mean_us * 1e-6),
            f"{100 * r.link_util_max:.0f}%",
            f"{100 * r.compute_util_max:.0f}%",
            shares,
            gain,
        )
    console.print(table)
    for g in gains:
        console.print(
            f"batching at the holder ({g['fabric']}): {g['mean_batch_rows']:.1f} rows per call on "
            f"average; throughput x{g['throughput_gain']:.2f}, mean latency x{g['mean_latency_ratio']:.2f} "
            "against serving the same queries one by one",
            highlight=False,
        )
    if beside is not None:
        for line in _decide_lines(beside):
            console.print(line, highlight=False)
    if reuse is not None and len(reuse):
        _reuse_table(reuse)
    if hits is not None and len(hits):
        _hit_table(hits, spec["span_cache"]["block"])
        if "ttft_ratio" in hits:
            _ttft_lines(hits, reach)
    if sharing is not None:
        _sharing_tables(*sharing)
    if copies is not None:
        _copies_table(copies, spec["fields"])


def _copies_table(copies, fields: dict) -> None:
    """A top-k workload's steps against each request attending its own copy (own_copies)."""
    shared = fields["chunks"] * fields["chunk_tokens"]
    table = result_table(
        f"top-k routing against a copy each: {fields['topk']} of {fields['chunks']} shared "
        f"chunks ({_tokens(shared)} tokens) a request, {_tokens(fields['unique_tokens'])} "
        "unique tokens here",
        "req/s: requests a second the workload's arrivals drew from the instances (its "
        "capacity where they queue), with each request attending its own dense copy of the "
        "whole context after the slash;  gain: the ratio;  q/call: queries per shared "
        "chunk's call;  closed form: core.sharing.step's gain on the same terms, at the "
        "batch whose calls hold as many queries (B after the slash);  link, gpu: the "
        "busiest instance's",
    )
    for col in ("fabric", "policy", "req/s", "gain", "q/call", "closed form", "link", "gpu"):
        table.add_column(col, justify="left" if col in ("fabric", "policy") else "right")
    for r in copies.itertuples():
        table.add_row(
            r.fabric,
            r.policy,
            f"{r.throughput_per_s:,.0f}/{r.copies_throughput_per_s:,.0f}",
            f"x{r.gain:.2f}",
            f"{r.queries_per_call:,.1f}",
            f"x{r.closed_form_gain:.2f}/{r.closed_form_batch:,.0f}",
            f"{100 * r.link_util_max:.0f}%",
            f"{100 * r.compute_util_max:.0f}%",
        )
    console.print(table)


def _sharing_tables(calls, sweep, facts: dict) -> None:
    """Shared-KV batching (MoSKA): one call against B calls, then a step's throughput over
    the shared context's size, and what bounds the gain against the paper's."""
    from xbench.core.units import format_size

    knee, ridge = facts["knee"], facts["ridge"]
    needed = facts["paper"] * facts["keep"]  # the call bound the paper's figure implies
    table = result_table(
        f"shared-KV batching ({facts['model']}, {facts['kv_format']} KV, {facts['heads']} "
        "query heads): one call of B queries over a shared chunk against B calls, one layer",
        f"the profile's device terms (fitted on {facts['reference']}) scaled by KV bytes a "
        f"token and FLOPs a row-token, at {facts['kv_format']}'s matmul rate (x"
        f"{facts['matmul_speedup']:.2g} the BF16 one they were fitted at);  knee: "
        f"B = {knee:.1f}, where a call's row term "
        "overtakes its token term (memory-bound below, compute-bound above)"
        + (f";  the [ceilings]' ridge point: B = {ridge:.1f}" if ridge else ""),
    )
    for col in ("B", "batched", "B calls", "gain", "bound"):
        table.add_column(col, justify="right")
    for r in calls.itertuples():
        table.add_row(
            f"{r.batch:,}",
            format_duration(r.batched_s),
            format_duration(r.separate_s),
            f"x{r.gain:.1f}",
            "memory" if r.batch < knee else "compute",
        )
    console.print(table)
    merge = sweep.merge_s.iloc[0]  # one batched call, whatever the context
    table = result_table(
        f"a decode step of {facts['batch']} requests, every layer: the shared context "
        f"batched, routed top-k (keep {100 * facts['keep']:.0f} % of its chunks), against "
        "each request holding its own copy",
        "context: shared tokens;  read: chunks any query kept;  shared, unique: the step's "
        "parts (unique: each request's own KV, one call each), beside the partials' merge, "
        f"{format_duration(merge)} in one batched call;  copies: the step with a copy each;  "
        "req/s: requests a second of one GPU's device time, with copies after the slash;  "
        "gain: the copies' step over this one",
    )
    columns = ("context", "read", "shared", "unique", "step", "copies", "req/s", "gain")
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for r in sweep.itertuples():
        table.add_row(
            _tokens(r.shared_tokens),
            f"{r.chunks_read:,.0f}",
            format_duration(r.shared_s),
            format_duration(r.unique_s),
            format_duration(r.step_s),
            format_duration(r.separate_step_s),
            f"{r.throughput_per_s:,.0f}/{r.separate_throughput_per_s:,.1f}",
            f"x{r.gain:.1f}",
        )
    console.print(table)
    placed = facts["hbm"] is not None
    if placed:
        _sharing_gpu_table(sweep, facts)
    else:
        console.print(f"the step is not placed on GPUs: {facts['unplaced']}", highlight=False)
    copy = format_size(int(facts["copy_bytes"]))
    if placed:
        largest = sweep.iloc[sweep.shared_tokens.idxmax()]
        copy += (
            f": {int(largest.gpus_per_copy):,} GPUs of {facts['hbm'] / 1e9:g} GB a copy, "
            f"{int(largest.copies_gpus):,} for the batch's copies against MoSKA's "
            f"{int(largest.moska_gpus):,}"
        )
    per_gpu = (
        f"per GPU the step gains x{sweep.moska_gain_per_gpu.min():.1f}-"
        f"x{sweep.moska_gain_per_gpu.max():.1f} here (x{sweep.apart_gain_per_gpu.min():.1f}-"
        f"x{sweep.apart_gain_per_gpu.max():.1f} with the unique KV on GPUs of its own); "
        if placed
        else ""
    )
    console.print(
        f"against MoSKA's x{facts['paper']}: {per_gpu}one call's gain cannot pass "
        f"x{facts['call_bound']:.1f} (B calls' launches and token reads saved, none of their "
        f"FLOPs), and routing multiplies it by 1 / keep: at most x{facts['ceiling']:.1f}, "
        "each request's unique KV, read alone, taking the rest. The paper's figure needs a "
        f"call bound near x{needed:.0f}, a matmul rate per byte read about "
        f"{needed / facts['call_bound']:.1f} times this profile's {facts['kv_format']} one, "
        "or a baseline that pays more than reading its copy at the HBM's rate (one copy of "
        f"the largest context is {copy})",
        highlight=False,
    )


def _sharing_gpu_table(sweep, facts: dict) -> None:
    """The sharing step on GPUs (core.sharing.on_gpus): each setup's GPUs, memory used,
    compute busy and requests a second per GPU, MoSKA's gains per GPU over the copies'."""
    table = result_table(
        f"the step on GPUs of {facts['hbm'] / 1e9:g} GB, each holding the weights "
        f"({facts['weights_bytes'] / 1e9:.1f} GB) and the KV it is given",
        "GPUs, HBM, busy: MoSKA / apart (the unique KV on GPUs of its own) / copies;  HBM: "
        "the share of each GPU's memory used;  busy: compute, its device time over the "
        "GPUs' wall time (a call runs on one GPU);  req/s/GPU: MoSKA / copies;  gain, "
        "apart: requests a second per GPU over the copies'",
    )
    for col in ("context", "GPUs", "HBM", "busy", "req/s/GPU", "gain", "apart"):
        table.add_column(col, justify="right", no_wrap=True)
    setups = ("moska", "apart", "copies")
    for r in sweep.itertuples():
        table.add_row(
            _tokens(r.shared_tokens),
            "/".join(f"{getattr(r, f'{s}_gpus'):,}" for s in setups),
            "/".join(f"{100 * getattr(r, f'{s}_hbm_share'):.0f}" for s in setups) + "%",
            "/".join(f"{100 * getattr(r, f'{s}_utilisation'):.0f}" for s in setups) + "%",
            f"{r.moska_per_gpu_per_s:,.0f}/{r.copies_per_gpu_per_s:,.1f}",
            f"x{r.moska_gain_per_gpu:.1f}",
            f"x{r.apart_gain_per_gpu:.1f}",
        )
    console.print(table)


def _hit_table(hits, block: int) -> None:
    """Span workloads: each expression's KV-cache hit rate and time to first token, asked
    once in the order written, under prefix caching and position-independent caching."""
    ttft = "ttft_dependent_s" in hits
    table = result_table(
        "span hit rates: each call asked once, in the order written (a call's inner "
        "gen(...) calls first), against the KV cache the calls above it left",
        f"whole blocks of {block} tokens;  prefix: position-dependent (prefix caching);  "
        "span: position-independent (each commuting set's members cached from their own "
        "start)" + (_ttft_words(hits) if ttft else ""),
    )
    columns = ["expression", "tokens", "hit prefix", "hit span"]
    columns += ["TTFT prefix", "TTFT span"] if ttft else []
    for col in columns:
        table.add_column(col, justify="left" if col == "expression" else "right")
    for r in hits.itertuples():
        cells = [
            r.expr,
            f"{r.tokens:,}",
            f"{100 * r.hit_rate_dependent:.0f}%",
            f"{100 * r.hit_rate_independent:.0f}%",
        ]
        if ttft:
            cells += [format_duration(r.ttft_dependent_s), format_duration(r.ttft_independent_s)]
        table.add_row(*cells)
    console.print(table)


def _ttft_lines(hits, reach) -> None:
    """The calls' TTFT summed under each cache, term by term, with their ratio and the best
    call's; then where span queries' 10-20x appears on this profile (``span_ttft_reach``)."""
    from xbench.core.costmodel import RECOMPUTE_TERMS

    def said(label: str) -> str:
        terms = [hits[f"ttft_{label}_{term}_s"].sum() for term in RECOMPUTE_TERMS]
        parts = ", ".join(
            f"{format_duration(t)} {word}"
            for t, word in zip(terms, ("fixed", "matmuls", "attention"), strict=True)
        )
        return f"{format_duration(sum(terms))} ({parts})"

    best = hits.loc[hits.ttft_ratio.idxmax()]
    warm = hits[hits.hit_tokens_independent > 0]
    console.print(
        f"TTFT over the {len(hits)} calls: prefix caching {said('dependent')}; span caching "
        f"{said('independent')}: x{_summed_ratio(hits):.1f}"
        + (
            f", x{_summed_ratio(warm):.1f} without the {len(hits) - len(warm)} that found "
            "nothing cached"
            if 0 < len(warm) < len(hits)
            else ""
        )
        + f"; at best x{best.ttft_ratio:.1f} ({best.expr})",
        highlight=False,
    )
    no_fixed = not hits.ttft_independent_fixed_s.any()
    table = result_table(
        "where the paper's 10-20x lower TTFT appears",
        "C: the tokens span caching finds and prefix caching misses, before the new ones "
        "both prefill;  the ratio grows about as (C + new) / new while matmuls lead, as "
        "C / (2 new) once attention's pairs do"
        + (
            ";  this profile gives a call no fixed time (recompute_t0), which would raise "
            "the C short calls need"
            if no_fixed
            else ""
        ),
    )
    table.add_column("new tokens", justify="right")
    for r in sorted(set(reach.ratio)):
        table.add_column(f"x{r:g} from C", justify="right")
    for new, rows in reach.groupby("new_tokens", sort=True):
        cells = [
            "-" if c is None or c != c else f"{int(round(c)):,}"
            for c in rows.sort_values("ratio").context_tokens
        ]
        table.add_row(f"{int(new):,}", *cells)
    console.print(table)


def _summed_ratio(hits) -> float:
    """Prefix caching's TTFT over span caching's, each summed over the calls."""
    return hits.ttft_dependent_s.sum() / hits.ttft_independent_s.sum()


def _ttft_words(hits) -> str:
    layers, gpus = int(hits.prefill_layers.iloc[0]), int(hits.prefill_gpus.iloc[0])
    over = f" over {gpus} GPUs" if gpus > 1 else " on one GPU"
    return (
        f";  TTFT: the whole model's prefill of what missed ({layers} layers{over}), the "
        "profile's prefill terms"
    )


def _decide_lines(beside):
    """Per fabric, decide's answer for one use of this shape beside what the simulation
    found, and, where they part, why."""
    from xbench.simulate import BUSY, parted_by_fanout

    fanout = parted_by_fanout(beside).tolist()
    for r, by_fanout in zip(beside.itertuples(), fanout, strict=True):
        line = (
            f"decide on {r.fabric}, one use of this shape on idle resources: {r.decide_idle} "
            f"(a fetch pays from u* = {r.u_star:.1f} uses)"
        )
        if r.uses_per_fetch == r.uses_per_fetch:
            line += (
                f"; here a fetch served {r.uses_per_fetch:.1f} (joined or cached), at which "
                f"decide says {r.decide_at_uses}"
            )
        line += f"; the better static policy: {r.better_static}"
        if r.decide_at_uses != r.better_static and r.route_busy >= BUSY:
            line += (
                f", since always-route kept a link or compute {100 * r.route_busy:.0f} % busy "
                "(decide prices idle resources)"
            )
        elif by_fanout:
            line += (
                f", since a request attends {r.chunks_per_request:.1f} chunks on average and "
                "ends with its slowest: route runs them at once at their holders, fetch one "
                "after another here (decide prices one use)"
            )
        elif r.decide_at_uses != r.better_static:
            line += (
                ", since the simulation's batches at the holders, the uses that wait for a "
                "fetch on its way, and the queues below saturation move it (decide prices one "
                "use on idle resources)"
            )
        yield line


def _reuse_table(reuse) -> None:
    """Span workloads: each commuting chunk's reuse against u*, and what the predicate did."""
    table = result_table(
        "span reuse: uses of each chunk per requester that does not hold it, and the share "
        "of them the predicate routed, per fabric",
        "u*: the model's reuse past which a fetch pays, per use on idle resources; a "
        "fetched chunk is attended here behind its request's other uses, so past u* the "
        "predicate still routes where the fabric is fast",
    )
    fabrics = list(dict.fromkeys(reuse.fabric))
    table.add_column("chunk", no_wrap=True)
    table.add_column("uses", justify="right")
    for f in fabrics:
        u_star = reuse[reuse.fabric == f].u_star.iloc[0]
        table.add_column(f"{f} (u* {u_star:,.0f})", justify="right", no_wrap=True)
    for name, rows in reuse.groupby("chunk", sort=False):
        routed = dict(zip(rows.fabric, rows.routed, strict=True))
        table.add_row(
            name,
            f"{rows.uses_per_requester.iloc[0]:,.0f}",
            *(f"{100 * routed[f]:.0f}%" for f in fabrics),
        )
    console.print(table)


def _idle_line(fact: dict) -> str:
    """Where offloading starts to win on idle resources, and why at that length: both
    options' times with what a remote prefill pays besides the prefill."""
    idle, parts = fact["idle_threshold"], fact.get("idle_parts")
    if idle == float("inf"):
        return "on idle resources offloading never wins"
    if parts is None:
        return "on idle resources offloading wins at every length"
    d = format_duration
    return (
        f"on idle resources offloading wins from {_tokens(idle)} tokens: there, prefilling "
        f"here takes {d(parts['local'])} (at {parts['local_speed']:g} of the remote's "
        f"speed), shipping {d(parts['offload'])}: the prompt sent {d(parts['prompt'])}, "
        f"remote prefill {d(parts['remote_prefill'])}, the KV over {fact['fabric']} "
        f"{d(parts['transfer'])}, spliced here {d(parts['splice'])}, the last three "
        "overlapped layer by layer"
    )


def _tokens(n: float) -> str:
    """4K for 4096 (a power-of-two length), 16M for 2^24, 16.5K for 16503, 128 below a
    thousand."""
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n / 2**20:.0f}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n / 1024:.0f}K"
    return f"{n / 1000:.1f}K" if n >= 1000 else f"{n:.0f}"


SATURATION_REQUESTS = 2000  # per bisection step: enough that 2 % of them is the run's tail


def _saturation_table(saturated, n: int) -> None:
    """The deployments' highest sustainable rates, and the study's comparison beside them."""
    decodes = bool(saturated.output_tokens.any())
    table = result_table(
        "deployments at saturation: the highest arrival rate each keeps up with",
        f"bisection on the arrival rate ({n:,} requests a step, to 1 %): keeps up where "
        "98 % of the requests are done by the last arrival;  homogeneous: this cluster "
        "alone;  same GPUs: as many GPUs as both clusters, all of this cluster's kind (the "
        "study's baseline);  naive heterogeneous: every prefill offloaded;  PrfaaS: offload "
        "above t (the best t on a grid, at saturation) or the predicate;  "
        + (
            "P/D: this cluster's instances prefilling / decoding, the split that keeps up "
            "with the most;  "
            if decodes
            else ""
        )
        + "vs: the rate over homogeneous's / same GPUs' / naive's",
    )
    columns = ("fabric", "deployment", "t") + (("P/D",) if decodes else ()) + ("requests/s", "vs")
    for col in columns:
        table.add_column(col, justify="left" if col in ("fabric", "deployment") else "right")
    for r in saturated.itertuples():
        table.add_row(
            r.fabric,
            r.deployment,
            _tokens(r.threshold_tokens) if r.threshold_tokens == r.threshold_tokens else "-",
            *((f"{r.prefill_instances}/{r.decode_instances}",) if decodes else ()),
            f"{r.max_rate_per_s:.2f}",
            " / ".join(
                f"{100 * vs:+.0f}%" if vs == vs else "-"  # nan: the base kept up with none
                for vs in (r.vs_homogeneous, r.vs_same_gpus, r.vs_naive)
            ),
        )
    console.print(table)
    if decodes:
        for fabric, rows in saturated.groupby("fabric", sort=False):
            console.print(_decode_line(fabric, rows.iloc[0]), highlight=False)
    console.print(
        "the study reports PrfaaS +54 % over a homogeneous prefill-decode deployment of the "
        "same GPU count and +32 % over a naive heterogeneous one; against as many GPUs of "
        "this cluster's kind what counts is the remote GPUs' speed (the same cost would buy "
        "fewer of them: not modelled), against the naive one the routing alone: short "
        "prompts' KV kept off the link. "
        + (
            "Serving at saturation: a request ends when its KV is here and its output "
            "tokens are decoded, decode at full batch"
            if decodes
            else "Prefill only: a request ends when its KV is here, no decode shares the GPUs"
        ),
        highlight=False,
    )


def _decode_line(fabric: str, r) -> str:
    """One decode instance of this cluster at full batch, term by term."""
    if not r.decode_batch >= 1:
        return (
            f"decode ({fabric}): no request fits beside the weights in a decode instance's "
            "memory, so no deployment keeps up with any rate"
        )
    bound = "its GPUs' memory" if r.decode_batch_bound == "memory" else "decode_batch"
    return (
        f"decode ({fabric}): one instance of this cluster batches {r.decode_batch:.0f} "
        f"requests (as many as {bound} allows); a step takes "
        f"{format_duration(r.decode_step_s)} (linear layers "
        f"{format_duration(r.decode_linear_s)}, attention "
        f"{format_duration(r.decode_attention_s)}): {r.decode_per_instance_per_s:.2f} "
        f"requests/s of {r.output_tokens:,} output tokens"
    )


def _prefill_table(frame, spec, profile: str, n: int, facts, out, saturated=None) -> None:
    table = result_table(
        f"xbench simulate: {spec['name']} ({n:,} requests, profile {profile})",
        (f"{out}  |  " if out else "")
        + "latency: arrival to the KV being here (prefill, and the transfer when offloaded); "
        "threshold: offload above t tokens, t from a grid search over the trace's lengths "
        "(least mean latency; every t is in the Parquet);  off: share of requests offloaded;  "
        "link: busy share;  here, there: the mean instance's busy share in each cluster"
        + (
            ";  hit: prompt tokens found in the prefix cache of the cluster that prefilled "
            "them (a threshold offloads when more than t tokens are uncached here)"
            if spec["fields"].get("prefixes")
            else ""
        ),
    )
    hits = bool(spec["fields"].get("prefixes"))
    columns = ("fabric", "policy", "t", "p50", "p99", "mean", "off", "link", "here", "there")
    for col in columns + (("hit",) if hits else ()):
        table.add_column(
            col, justify="left" if col in ("fabric", "policy") else "right", no_wrap=True
        )
    shown = frame[(frame.policy != "threshold") | frame.best]
    for r in shown.itertuples():
        table.add_row(
            r.fabric,
            r.policy,
            _tokens(r.threshold_tokens) if r.policy == "threshold" else "-",
            format_duration(r.p50_ms * 1e-3),
            format_duration(r.p99_ms * 1e-3),
            format_duration(r.mean_ms * 1e-3),
            f"{100 * r.share_offloaded:.0f}%",
            f"{100 * r.link_util:.0f}%",
            f"{100 * r.local_util:.0f}%",
            f"{100 * r.remote_util:.0f}%",
            *((f"{100 * r.hit_rate:.0f}%",) if hits else ()),
        )
    console.print(table)
    for fact in facts:
        best = frame[(frame.fabric == fact["fabric"]) & frame.best]
        if len(best):
            b = best.iloc[0]
            console.print(
                f"offload threshold ({fact['fabric']}): {_tokens(b.threshold_tokens)} tokens, "
                f"{100 * b.share_offloaded:.0f}% of requests offloaded; the link "
                f"{100 * b.link_util:.0f}% busy ({b.link_gbps:.1f} of "
                f"{fact['link_gbps']:.0f} Gb/s)",
                highlight=False,
            )
        console.print(_idle_line(fact), highlight=False)
        rates = ", ".join(f"{g:.1f} at {_tokens(t)}" for t, g in fact["kv_gbps"].items())
        console.print(
            f"KV one remote instance produces while it prefills, Gb/s: {rates} tokens",
            highlight=False,
        )
        if study := fact.get("study"):
            console.print(
                f"the study measured {study['model']} at {study['kv_gbps']:.2f} Gb/s at "
                f"{_tokens(study['tokens'])} on 8 H200: its {study['kv_bytes'] / 1e9:.2f} GB "
                f"of KV in {format_duration(study['implied_prefill_s'])}, against "
                f"{format_duration(study['prefill_s'])} here on 8 GPUs, its FLOPs at the "
                f"profile's prefill rates (x{study['implied_prefill_s'] / study['prefill_s']:.1f})",
                highlight=False,
            )
    if saturated is not None:
        _saturation_table(saturated, min(n, SATURATION_REQUESTS))


def _validate(
    prof, spec, scenario, policies, requests, seed, fabric, rate, replays, out, force, fmt
):
    """simulate --validate: the simulation of a two-instance trace against its replay."""
    from xbench.cli.progress import EventProgress, make_progress
    from xbench.errors import require_installed
    from xbench.fabric.launch import require_mpiexec, run_ranks
    from xbench.results.metadata import new_run_id, run_metadata
    from xbench.results.schema import SIMULATION_VALIDATION
    from xbench.results.store import refuse_overwrite, write_table
    from xbench.simulate.validation import REPLAYED, replay_workload, validate_by_replay

    if spec["kind"] != "decode" or spec["fields"].get("spans"):
        raise XbenchError(
            f"--validate replays decode workloads of one chunk per request; {scenario} is not one",
            "use agentic-codebase, decode-route-vs-fetch or moska-shared-chunk",
        )
    names = [f.name for f in prof.fabrics]
    fab = fabric.split(",")[0].strip() if fabric else ("shm" if "shm" in names else None)
    if fab is None:
        raise XbenchError(
            f"profile {prof.name} has no local fabric (shm) to replay over",
            "fit a profile on this machine (make demo writes results/demo/profile.toml)",
        )
    if not prof.provenance.get("conditions", {}).get("cpu_attention"):
        warn(
            f"profile {prof.name} was not fitted on CPU kernels: the replay runs CPU kernels, "
            "so simulated and measured describe different machines"
        )
    replayed = [p for p in policies if p in REPLAYED]
    if len(replayed) < len(policies):
        warn("the local policy is not replayed (recomputing a chunk is not timed here)")
    if not replayed:
        raise XbenchError("no policy to replay", "pass --policy route, fetch or predicate")
    if out is not None:
        refuse_overwrite(out, force, suffix=".parquet")
    w = replay_workload(spec, fab, spec["fields"]["rate_per_s"] if rate else None, prof)
    n = requests if requests is not None else 2000
    run_id = new_run_id("simulate-validate")
    # the replays' files (configs, latencies, compute jobs): beside --out, else in results/
    out_dir = (Path(out).parent if out is not None else Path("results")) / run_id
    require_installed("torch")  # the replay's ranks compute with it
    require_mpiexec()  # before the replays' folder is made
    out_dir.mkdir(parents=True, exist_ok=True)
    with make_progress() as progress:

        def launch(config_path, label):
            stall = 120 + 20 * n * w.chunk_tokens / 2048 / 1000
            run_ranks(
                2,
                "xbench.simulate.replay",
                config_path,
                EventProgress(progress, f"replay {label}"),
                stall,
            )

        frame, calibration = validate_by_replay(
            prof, w, replayed, n, seed, out_dir, launch, warn=warn, replays=replays
        )
    meta = run_metadata(
        run_id,
        "simulate",
        scenario=spec["name"],
        profile=prof.name,
        seed=seed,
        calibration=calibration,
    )
    write_table(out_dir / "simulation_validation.parquet", SIMULATION_VALIDATION, frame, meta)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_table(Path(out), SIMULATION_VALIDATION, frame, meta)
    idle = prof.device.idle_extra
    emit_frame(
        frame,
        fmt,
        lambda f: _validation_table(f, spec, w, n, out_dir, calibration, idle),
    )


COSTS_LABELS = {"calibrated": "calibrated", "replayed": "own costs"}


def _interval(low: float, high: float) -> str:
    """An error's interval, e.g. -12/+20%; "-" where there is none."""
    if not (low == low and high == high):
        return "-"
    return f"{100 * low:+.0f}/{100 * high:+.0f}%"


def _interval_table(frame, replays: int) -> None:
    """Each err's interval over the paired rounds, beside the table of medians (80 columns
    hold one or the other)."""
    coverage = 100 * frame.error_coverage.iloc[0]
    table = result_table(
        f"err's interval over the {replays} rounds ({coverage:.0f} % nominal)",
        "Student's t on the rounds' paired log errors: one that holds 0 says the rounds "
        "cannot tell the simulation from the machine's drift between replays (wide with few "
        "rounds); one that does not, that the simulation is off",
    )
    stats = (
        ("p50", "p50_us"),
        ("p99", "p99_us"),
        ("mean", "mean_us"),
        ("req/s", "throughput_per_s"),
    )
    for col in ("policy", *(name for name, _ in stats)):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in frame.itertuples():
        table.add_row(
            r.policy if r.costs == "profile" else f"  {COSTS_LABELS[r.costs]}",
            *(
                _interval(getattr(r, f"error_low_{stat}"), getattr(r, f"error_high_{stat}"))
                for _, stat in stats
            ),
        )
    console.print(table)


def _validation_table(frame, spec, w, n: int, out_dir, calibration: dict, idle) -> None:
    """The simulated against the measured, then the measured costs against the profile's
    (``idle``: its idle extra, a Coef or None)."""
    replays = int(frame.replays.iloc[0])
    table = result_table(
        f"xbench simulate --validate: {spec['name']} on 2 instances ({n:,} requests, "
        f"{w.chunks} chunks, {w.rate_per_s:,.0f}/s)",
        f"{out_dir}  |  p50, p99: the simulation of the trace, with the profile's costs, "
        "those a replay of the policy on another trace measured just before (calibrated), "
        "or those this replay "
        "measured (own costs: the simulator's own error); real: the trace replayed "
        "between two local ranks; err: p50 / real - 1, and so on (req/s: throughput's)"
        + (
            f"; over {replays} rounds (a calibration replay, then the trace's) both "
            "are medians, and each err's interval is in the table below"
            if replays > 1
            else ""
        ),
    )
    columns = ["policy", "p50", "real", "err", "p99", "real ", "err ", "req/s"]
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for r in frame.itertuples():
        p50 = [
            format_duration(r.simulated_p50_us * 1e-6),
            format_duration(r.measured_p50_us * 1e-6),
            f"{100 * r.error_p50_us:+.0f}%",
        ]
        p99 = [
            format_duration(r.simulated_p99_us * 1e-6),
            format_duration(r.measured_p99_us * 1e-6),
            f"{100 * r.error_p99_us:+.0f}%",
        ]
        table.add_row(
            r.policy if r.costs == "profile" else f"  {COSTS_LABELS[r.costs]}",
            *p50,
            *p99,
            f"{100 * r.error_throughput_per_s:+.0f}%",
        )
    console.print(table)
    if replays > 1:
        _interval_table(frame, replays)
    _costs_table(calibration, replays, idle)


def _costs_table(calibration: dict, replays: int, idle) -> None:
    """The measured costs (calibrated and own) against the profile's, per policy."""
    by_policy = calibration.get("by_policy", {})
    if not any(both.get(k) for both in by_policy.values() for k in ("calibrated", "replayed")):
        return
    costs = result_table(
        "measured costs against the profile's",
        f"calibrated: a replay of the same policy on another trace ({calibration['requests']:,} "
        "requests) just before; own: the validated replay's"
        + ("; medians over rounds" if replays > 1 else "")
        + "; attention: back-to-back calls "
        "(their spread: robust sd); after idle: what a call adds after a long idle (the "
        f"profile's {'-' if idle is None else f'{num(idle.value * 1e6)} us'})"
        "; gather: the splice is scaled alike (assumed, not measured)"
        "; per item: core time to take an arrival or message in",
    )
    for col in (
        "policy",
        "costs",
        "attention",
        "spread",
        "after idle",
        "merge",
        "gather",
        "per item",
    ):
        costs.add_column(col, justify="left" if col in ("policy", "costs") else "right")
    for policy, both in by_policy.items():
        for kind in ("calibrated", "replayed"):
            c = both.get(kind)
            if c is None:
                continue
            costs.add_row(
                policy,
                "calibrated" if kind == "calibrated" else "own",
                f"x{c['attention']:.2f}",
                f"{100 * c['attention_spread']:.0f}%",
                _us(c, "idle_extra_us"),
                f"x{c['merge']:.2f}",
                f"x{c['gather']:.2f}",
                _us(c, "message_us"),
            )
    console.print(costs)


def _us(factors: dict | None, key: str) -> str:
    value = (factors or {}).get(key)
    return "-" if value is None else f"{num(value)} us"
