"""Scenarios: named request grids for ``xbench decide --scenario FILE`` (TOML).

A scenario fixes the request shape (``[request]``) and the axes to sweep (``[grid]``), and
says where the question comes from (``[scenario]``). Example: ``scenarios/*.toml``.

    [scenario]                        # these four keys, each text
    name = "span-fanout"
    description = "..."
    source = "arXiv ..."              # where the workload comes from
    model = "deepseek-v3.2"          # optional: heads, payload, return and KV bytes
    [request]                         # optional overrides; sizes with units, times with units
    heads = 16
    payload = "1152B"
    fetch_cost = "3ms"
    [grid]                            # lists (or "all" for fabric)
    rows = [1, 8]
    chunk_tokens = [2048, 8192]
    reuse = [0, 4, 16, 64]
    fabric = "all"
"""

from __future__ import annotations

import math
from pathlib import Path

from xbench.core.costmodel import MOST_LAYERS, MOST_SHAPE, MOST_TOKENS
from xbench.core.models import DTYPE_BYTES, get_model, mla_model
from xbench.core.spans import calls as span_calls
from xbench.core.spans import check_generated, positional_and_shared
from xbench.core.spans import names as span_names
from xbench.core.spans import parse as parse_span_tree
from xbench.core.units import parse_duration, parse_rate, parse_size
from xbench.errors import XbenchError
from xbench.files import read_toml

# The most requests a replay may ask for, as MOST_SHAPE for a request: past 2^63 numpy
# cannot size the arrays (10^20 was a traceback); below 2^40, what the machine cannot hold
# is its own one-line "out of memory" (10^11: 745 GiB of arrival times alone)
MOST_REQUESTS = 2**40
REQUEST_KEYS = {"heads", "payload", "return", "kv_bytes", "fetch_cost", "segments", "probe"}
# each key: its type, its least value and, where given, its most (``_check_table``); the
# sizes and the duration of [request] are checked by their parsers
SCENARIO_KEYS = {key: (str, None) for key in ("name", "description", "source", "model")}
REQUEST_TYPES = {
    "heads": (int, 1, MOST_SHAPE),
    "segments": (int, 1, MOST_SHAPE),
    "probe": (bool, None),
}
GRID_KEYS = {"rows", "chunk_tokens", "reuse", "fabric"}


class ScenarioError(XbenchError):
    pass


def _read_toml(path: Path) -> dict:
    """A scenario file's TOML, or a one-line ScenarioError saying why it cannot be read."""
    fix = "pass a scenario file (scenarios/*.toml) or a shipped scenario's name"
    return read_toml(path, "scenario", fix, ScenarioError)


def _request_shape(req: dict, preset, path: Path) -> dict:
    """The [request]'s sizes and options, each from the table or else the model preset."""
    try:
        payload = (
            parse_size(req["payload"])
            if "payload" in req
            else (preset.query_bytes_per_row() if preset else None)
        )
        if payload is None:
            raise ScenarioError(
                f"scenario {path} sets neither model nor payload",
                "give [scenario] model or [request] payload",
            )
        return {
            "heads": int(req.get("heads", preset.q_heads if preset else 1)),
            "payload_bytes": payload,
            "return_bytes": parse_size(req["return"])
            if "return" in req
            else (preset.return_bytes_per_row() if preset and "payload" not in req else payload),
            "kv_bytes_per_token": parse_size(req["kv_bytes"])
            if "kv_bytes" in req
            else (preset.kv_bytes_per_token() if preset else 1152),
            "fetch_cost": parse_duration(req["fetch_cost"]) if "fetch_cost" in req else math.nan,
            "segments": int(req.get("segments", 1)),
            "include_probe": bool(req.get("probe", False)),
        }
    except (TypeError, ValueError) as exc:
        raise ScenarioError(
            f"scenario {path}: bad [request] value ({exc})",
            "write sizes like 1152B and times like 3ms",
        ) from None


def _grid_axes(grid: dict, path: Path) -> dict:
    """The [grid]'s axes: rows, chunk_tokens and reuse lists, and the fabrics ([None]: all)."""
    axes = {}
    for key in ("rows", "chunk_tokens", "reuse"):
        values = grid.get(key, [1] if key == "rows" else ([2048] if key == "chunk_tokens" else [0]))
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, int) and v >= 0 for v in values)
        ):
            raise ScenarioError(
                f"scenario {path}: [grid] {key} must be a list of non-negative integers",
                f"e.g. {key} = [1, 8, 64]",
            )
        axes[key] = values
    fabric = grid.get("fabric", "all")
    if fabric != "all" and not isinstance(fabric, list):
        raise ScenarioError(
            f'scenario {path}: [grid] fabric must be "all" or a list', 'e.g. fabric = ["ib", "tcp"]'
        )
    axes["fabric"] = [None] if fabric == "all" else _fabrics(path, fabric, "[grid]")
    return axes


def _fabrics(path: Path, names: list, table: str) -> list:
    """A table's fabric list: names, at least one (an empty list decided and simulated
    nothing, and said so with exit 0)."""
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ScenarioError(
            f"scenario {path}: {table} fabric = {names!r} names no fabric"
            if not names
            else f"scenario {path}: {table} fabric = {names!r} is not a list of fabric names",
            'e.g. fabric = ["nvlink", "ib"] (xbench decide lists the profile\'s fabrics)',
        )
    return names


def load_scenario(path) -> dict:
    """Parse and check a scenario; returns {name, description, source, model, request,
    axes, workload} (``workload``: whether it has a [workload] for ``xbench simulate``)."""
    path = Path(path)
    return _parse_scenario(_read_toml(path), path)


def _parse_scenario(data: dict, path: Path) -> dict:
    """load_scenario's checks and answer, on a scenario file's tables already read."""
    for name, table in data.items():
        if name in ("scenario", "request", "grid", "workload") and not isinstance(table, dict):
            raise ScenarioError(
                f"scenario {path}: {name} = {table!r} is not a table", f"write it as [{name}]"
            )
    head = data.get("scenario", {})
    _check_table(path, head, SCENARIO_KEYS, "[scenario]")
    if not head.get("name"):
        raise ScenarioError(
            f"scenario {path} has no [scenario] name", 'add [scenario] name = "..."'
        )
    req, grid = data.get("request", {}), data.get("grid", {})
    unknown = (
        (set(req) - REQUEST_KEYS)
        | (set(grid) - GRID_KEYS)
        | (set(data) - {"scenario", "request", "grid", "workload"})
    )
    if unknown:
        raise ScenarioError(
            f"scenario {path} has unknown keys {sorted(unknown)}",
            f"[request] takes {sorted(REQUEST_KEYS)}, [grid] takes {sorted(GRID_KEYS)}",
        )
    # before they are used: int() cut heads = 2.7 to 2, bool() made probe = "no" true
    _check_table(
        path, {k: v for k, v in req.items() if k in REQUEST_TYPES}, REQUEST_TYPES, "[request]"
    )
    preset = mla_model(head["model"], f"scenario {path}: model") if head.get("model") else None
    return {
        "name": head["name"],
        "description": head.get("description", ""),
        "source": head.get("source", ""),
        "model": head.get("model"),
        "request": _request_shape(req, preset, path),
        "axes": _grid_axes(grid, path),
        "workload": "workload" in data,
    }


# [workload]: what ``xbench simulate`` replays (``decide`` ignores it). ``kind`` picks the
# workload: "decode" (the default: decode queries over chunks held across instances) or
# "prefill" (uncached prefills here or in a remote cluster, the KV shipped over the link).
# Each key: its type, its least value and, where given, its most (decide's shape limits).
WORKLOAD_KEYS = {
    "kind": (str, None),
    "instances": (int, 1),
    "chunks": (int, 1),
    "chunk_tokens": (int, 1, MOST_TOKENS),
    "rows": (int, 1, MOST_SHAPE),
    "rate": (str, None),
    "zipf": (float, 0),
    "cache_chunks": (int, 0),
    "max_batch_rows": (int, 1),
    "fabric": ((str, list), None),
    "requests": (int, 1, MOST_REQUESTS),
    "spans": (list, None),
    # the span report's KV cache: its block (tokens) and each name's tokens (others:
    # chunk_tokens)
    "block_tokens": (int, 1, MOST_TOKENS),
    "span_tokens": (dict, None),
    # the server keeps the KV of what a gen(...) call generated (span queries' dual output)
    "dual_output": (bool, None),
    # the shared-KV batching report (MoSKA): model, KV format, contexts, batch, top-k keep
    "sharing": (dict, None),
    "reports": (list, None),
    # a use as one decode step of this many layers (default 1: one layer's times), route's
    # round trip once a step where pipelined (the cost model's step, as decide --layers)
    "layers": (int, 1, MOST_LAYERS),
    "pipeline_layers": (bool, None),
    # the routed answers queued at a requester merged in one call (MoSKA's batched merge)
    "batch_merges": (bool, None),
    # the instances each shared chunk is spread over, a share on each (decide --holders)
    "holders": (int, 1),
    # MoSKA's decode step: the shared chunks a router chooses for each request's query, and
    # the request's own unique KV (tokens), attended at its requester
    "topk": (int, 1),
    "unique_tokens": (int, 0, MOST_TOKENS),
}
# What a decode workload may ask ``xbench simulate`` to report beside its policies:
# "batching", always-route with the holder batching the queries that converge on a chunk
# against the same trace served one by one; "copies" (a top-k workload), its steps against
# each request attending its own copy of the whole context.
REPORTS = ("batching", "copies")
PREFILL_KEYS = {
    "kind": (str, None),
    "local_instances": (int, 1),
    "remote_instances": (int, 1),
    "local_speed": (float, 1e-9),
    "gpus_per_instance": (int, 1),
    "length_median": (int, 1, MOST_TOKENS),
    "length_sigma": (float, 0),
    "min_length": (int, 1, MOST_TOKENS),
    "max_length": (int, 1, MOST_TOKENS),
    "rate": (str, None),
    "fabric": ((str, list), None),
    "requests": (int, 1, MOST_REQUESTS),
    # bursts: arrivals burst_factor times faster in "on" spells than in "off" ones, each
    # spell exponential about its mean (durations), at the same mean rate
    "burst_factor": (float, 1),
    "burst_on": (str, None),
    "burst_off": (str, None),
    # the link's bandwidth over time: [[from s, share of the fabric's], ...]
    "link_trace": (list, None),
    # shared prefixes (their count, the share of requests with one, their lengths and
    # popularity) and each cluster's prefix cache, in tokens
    "prefixes": (int, 0),
    "prefix_share": (float, 0),
    "prefix_median": (int, 1, MOST_TOKENS),
    "prefix_sigma": (float, 0),
    "prefix_zipf": (float, 0),
    "local_cache_tokens": (int, 0, MOST_SHAPE),
    "remote_cache_tokens": (int, 0, MOST_SHAPE),
    # decode on this cluster: each request's output tokens (0: no decode), the most requests
    # a decode instance batches, this cluster's memory rate over the profile's [ceilings]
    # memory, and a GPU's memory here (GB)
    "output_tokens": (int, 0, MOST_TOKENS),
    "decode_batch": (int, 1, MOST_SHAPE),
    "local_memory_speed": (float, 1e-9),
    "local_hbm_gb": (float, 1e-9),
    # the model the clusters serve, where it is not the scenario's (whose the profile's
    # device terms are): its prefill priced from those terms FLOP for FLOP, its own KV
    "served_model": (str, None),
}
# the prefix keys, which say nothing without prefixes
PREFIX_KEYS = (
    "prefix_share", "prefix_median", "prefix_sigma", "prefix_zipf", "local_cache_tokens",
    "remote_cache_tokens",
)  # fmt: skip
WORKLOAD_KINDS = {"decode": WORKLOAD_KEYS, "prefill": PREFILL_KEYS}


# Span expressions (span queries, arXiv 2511.02749; grammar in core.spans): the parts outside
# braces are positional (their KV depends on where they sit: each requester computes its own,
# the simulator's prefix); the names in braces commute (position-independent: the KV of one
# serves every request that names it, wherever it sits), so their reuse counts come from the
# expressions.


def parse_span(expr: str) -> tuple[str | None, tuple[str, ...]]:
    """(the positional parts joined, or None; the commuting chunks) of one span expression,
    as its outermost call reads them (an inner gen(...) call stands for its output);
    ValueError saying where it is wrong, or that it shares nothing."""
    outermost, _ = span_calls(parse_span_tree(expr))[-1]
    outside, inside = positional_and_shared(outermost)
    if not inside:
        raise ValueError("no commuting set: name the shared chunks in braces, e.g. {a, b}")
    repeated = sorted({c for c in inside if inside.count(c) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} named twice in its sets")
    return (" + ".join(outside) or None), tuple(inside)


def _spans(path, raw) -> tuple:
    """[workload] spans: a list of { expr = "...", weight = N } as (prefix, chunks, weight)."""
    fix = 'write spans = [{ expr = "system + {a, b}", weight = 4 }, ...]'
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(f"scenario {path}: [workload] spans must be a non-empty list", fix)
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - {"expr", "weight"} or "expr" not in item:
            raise ScenarioError(
                f"scenario {path}: [workload] spans[{i}] is not {{ expr, weight }}", fix
            )
        weight = item.get("weight", 1)
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not 0 < weight < math.inf
        ):
            raise ScenarioError(
                f"scenario {path}: [workload] spans[{i}] weight = {weight!r} is not a finite number > 0",
                "give weight as a number > 0 (how often this expression is asked, relatively)",
            )
        try:
            prefix, chunks = parse_span(str(item["expr"]))
        except ValueError as e:
            raise ScenarioError(
                f"scenario {path}: [workload] spans[{i}] expr = {item['expr']!r}: {e}",
                'write e.g. "system + tools + {doc1, {doc2, doc3}} + question": parts in '
                "sequence joined by +, commuting ones in braces, each shared chunk named "
                'once, a call as "gen(input -> output)"',
            ) from None
        out.append((prefix, chunks, float(weight)))
    # the simulator weighs each expression's uses (its chunks and prefix) by its weight
    if not math.isfinite(math.fsum(w * (len(c) + 1) for _, c, w in out)):
        raise ScenarioError(
            f"scenario {path}: [workload] spans' weights are too large to weigh together",
            "weights are relative: scale them down (e.g. 40, 20, 10)",
        )
    return tuple(out)


def span_chunks(spans) -> list[str]:
    """The commuting chunks the expressions name, in order of first appearance (chunk k
    lives at instance k % instances)."""
    return list(dict.fromkeys(c for _, chunks, _ in spans for c in chunks))


def _check_table(path, table: dict, keys: dict, name: str = "[workload]") -> None:
    """Each key of ``table`` (the TOML table ``name``) known, of its type, at least its
    least and, where its spec gives a third value, at most that."""
    for key, value in table.items():
        if key not in keys:
            raise ScenarioError(
                f"scenario {path}: unknown {name} field {key!r}",
                f"use {', '.join(sorted(keys))}",
            )
        kind, least, *rest = keys[key]
        most = rest[0] if rest else None
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            wanted = {
                int: "a whole number",
                float: "a number",
                bool: "true or false",
                str: "text",
                list: "a list",
                dict: "a table",
            }
            raise ScenarioError(
                f"scenario {path}: {name} {key} = {value!r} has the wrong type",
                f"give {key} as {wanted.get(kind, 'text or a list')}",
            )
        if kind is float and not math.isfinite(value):  # TOML spells nan and inf
            raise ScenarioError(
                f"scenario {path}: {name} {key} = {value} is not finite",
                f"give {key} as a finite number",
            )
        if least is not None and value < least:
            raise ScenarioError(
                f"scenario {path}: {name} {key} = {value} is out of range",
                f"give {key} {'> 0' if least == 1e-9 else f'>= {least}'}",
            )
        if most is not None and value > most:
            raise ScenarioError(
                f"scenario {path}: {name} {key} = {value} is beyond any request",
                f"keep {key} at or below {most}",
            )


def _rate(path, table: dict, default: str) -> float:
    rate_text = str(table.get("rate", default)).strip()
    try:
        return parse_rate(rate_text)
    except XbenchError:
        raise ScenarioError(
            f"scenario {path}: [workload] rate = {rate_text!r} is not a rate",
            'write e.g. rate = "2000/s"',
        ) from None


def _prefill_fields(path: Path, table: dict, scenario: dict) -> dict:
    """A prefill workload's ``PrefillWorkload`` fields."""
    if not scenario["model"]:
        raise ScenarioError(
            f"scenario {path}: a prefill workload needs the model (its layers and KV)",
            'add [scenario] model = "deepseek-v3.2" (xbench models lists them)',
        )
    lengths = (table.get("min_length", 128), table.get("max_length", 131072))
    if lengths[0] > lengths[1]:
        raise ScenarioError(
            f"scenario {path}: [workload] min_length {lengths[0]} > max_length {lengths[1]}",
            "give min_length <= max_length",
        )
    return {
        "local_instances": table.get("local_instances", 8),
        "remote_instances": table.get("remote_instances", 4),
        "local_speed": float(table.get("local_speed", 1.0)),
        "gpus_per_instance": table.get("gpus_per_instance", 8),
        "layers": get_model(scenario["model"]).layers,
        "kv_bytes_per_token": scenario["request"]["kv_bytes_per_token"],
        "length_median": table.get("length_median", 8192),
        "length_sigma": float(table.get("length_sigma", 1.0)),
        "min_length": lengths[0],
        "max_length": lengths[1],
        "rate_per_s": _rate(path, table, "2/s"),
        **_bursts(path, table),
        "link_trace": _link_trace(path, table.get("link_trace", [])),
        **_prefixes(path, table),
        **_decode(path, table, get_model(scenario["model"])),
        **_served(path, table, get_model(scenario["model"]), scenario["request"]),
    }


def _served(path: Path, table: dict, reference, request: dict) -> dict:
    """A prefill workload's served model (``served_model``), where it is not the scenario's:
    its layers and KV, its prefill's FLOPs over the scenario model's (refused where either
    publishes no active parameters, and with decode, which prices the scenario model's
    attention kernel)."""
    if "served_model" not in table:
        return {}
    try:
        served = get_model(table["served_model"])
    except XbenchError as e:
        raise ScenarioError(f"scenario {path}: served_model: {e.problem}", e.fix) from None
    for model in (served, reference):
        if not model.active_params:
            raise ScenarioError(
                f"scenario {path}: served_model {served.name} is priced from "
                f"{reference.name}'s prefill FLOP for FLOP, and {model.name} publishes no "
                "active parameters",
                "pick models xbench models lists with parameter counts",
            )
    if table.get("output_tokens"):
        raise ScenarioError(
            f"scenario {path}: served_model {served.name} with output_tokens: decode prices "
            f"the profile's attention kernel, {reference.name}'s, not {served.name}'s",
            "set output_tokens = 0 (prefill only), or drop served_model",
        )
    own = served.name == reference.name  # its KV as [request] gives it (kv_bytes)
    return {
        "model": reference.name,
        "served_model": served.name,
        "layers": served.layers,
        "kv_bytes_per_token": request["kv_bytes_per_token"] if own else served.kv_bytes_per_token(),
        "reference_kv_bytes": request["kv_bytes_per_token"],
    }


def _decode(path: Path, table: dict, model) -> dict:
    """A prefill workload's decode fields: the keys given, and the model's decode shape
    (refused where decode is asked of a model whose parameters are not published)."""
    out = {
        key: table[key]
        for key in ("output_tokens", "decode_batch", "local_memory_speed", "local_hbm_gb")
        if key in table
    }
    if out.get("output_tokens") and table.get("local_instances", 8) < 2:
        raise ScenarioError(
            f"scenario {path}: output_tokens with local_instances = 1: this cluster's one "
            "instance cannot both prefill and decode",
            "give local_instances = 2 or more, or output_tokens = 0 (prefill only)",
        )
    if out.get("output_tokens") and not (model.active_params and model.total_params):
        raise ScenarioError(
            f"scenario {path}: model {model.name} publishes no parameter counts, which a "
            "decode step reads",
            "set output_tokens = 0 (prefill only) or use a model xbench models lists with them",
        )
    return {
        **{
            k: float(v) if k in ("local_memory_speed", "local_hbm_gb") else v
            for k, v in out.items()
        },
        "decode_rows": model.q_heads,
        "attended_tokens": float(model.index_topk) if model.index_topk else math.inf,
        "active_params": float(model.active_params or 0.0),
        "total_params": float(model.total_params or 0.0),
        "weight_bytes": float(DTYPE_BYTES[model.matmul_dtype]),
        "matmul_dtype": model.matmul_dtype,
    }


def _prefixes(path: Path, table: dict) -> dict:
    """The prefix keys given, as the PrefillWorkload's fields (refused without prefixes, and
    a share above 1)."""
    given = [key for key in PREFIX_KEYS if key in table]
    if given and not table.get("prefixes"):
        raise ScenarioError(
            f"scenario {path}: [workload] gives {', '.join(given)} without prefixes",
            "they describe shared prefixes and their caches: add prefixes = N, or drop them",
        )
    if table.get("prefix_share", 0) > 1:
        raise ScenarioError(
            f"scenario {path}: [workload] prefix_share = {table['prefix_share']} is out of range",
            "give prefix_share between 0 and 1 (the share of requests with a shared prefix)",
        )
    floats = {"prefix_share", "prefix_sigma", "prefix_zipf"}
    return {
        key: float(table[key]) if key in floats else table[key]
        for key in ("prefixes", *PREFIX_KEYS)
        if key in table
    }


def _link_trace(path: Path, raw: list) -> tuple:
    """[[from s, share], ...]: times from 0, increasing; shares > 0 (1: the fabric's)."""
    fix = "write e.g. link_trace = [[0, 1.0], [300, 0.5], [600, 1.0]] (seconds, share > 0)"
    out = []
    for i, item in enumerate(raw):
        ok = (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in item)
            and 0 <= item[0] < math.inf
            and 0 < item[1] < math.inf
            and (not out or item[0] > out[-1][0])
        )
        if not ok:
            raise ScenarioError(
                f"scenario {path}: [workload] link_trace[{i}] = {item!r} is not "
                "[seconds after the last, share > 0]",
                fix,
            )
        out.append((float(item[0]), float(item[1])))
    return tuple(out)


def _bursts(path: Path, table: dict) -> dict:
    """The burst keys given, as the PrefillWorkload's fields (durations in seconds; those
    not given keep the workload's defaults)."""
    out = {"burst_factor": float(table["burst_factor"])} if "burst_factor" in table else {}
    for key in ("burst_on", "burst_off"):
        if key not in table:
            continue
        try:
            seconds = parse_duration(table[key])
        except XbenchError:
            seconds = -1.0
        if not 0 < seconds < math.inf:
            raise ScenarioError(
                f"scenario {path}: [workload] {key} = {table[key]!r} is not a duration",
                f'write e.g. {key} = "2s" (a spell\'s mean length)',
            )
        out[f"{key}_s"] = seconds
    return out


def _decode_fields(path: Path, table: dict, req: dict) -> dict:
    """A decode workload's ``Workload`` fields (its chunks from the spans where it has
    them: the commuting chunks, and each requester's own copy of every prefix)."""
    unknown = [r for r in table.get("reports", ()) if r not in REPORTS]
    if unknown:
        raise ScenarioError(
            f"scenario {path}: [workload] reports {unknown} are not reports",
            f"use {', '.join(REPORTS)}, or drop reports",
        )
    cache_keys = sorted({"block_tokens", "span_tokens", "dual_output"} & set(table))
    if cache_keys and "spans" not in table:
        raise ScenarioError(
            f"scenario {path}: [workload] gives {' and '.join(cache_keys)} without spans",
            "they describe the span report's KV cache: add spans, or drop them",
        )
    spans = _spans(path, table["spans"]) if "spans" in table else ()
    if spans and {"chunks", "zipf"} & set(table):
        raise ScenarioError(
            f"scenario {path}: [workload] gives spans and {' and '.join(sorted({'chunks', 'zipf'} & set(table)))}",
            "with spans, the chunks and how often each is used come from the expressions: drop chunks and zipf",
        )
    instances = table.get("instances", 8)
    prefixes = {prefix for prefix, _, _ in spans if prefix}
    chunks = (
        len(span_chunks(spans)) + len(prefixes) * instances if spans else table.get("chunks", 256)
    )
    _check_topk(path, table, spans, chunks)
    return {
        "instances": instances,
        "chunks": chunks,
        "chunk_tokens": table.get("chunk_tokens", 2048),
        "rows": table.get("rows", 1),
        "heads": req["heads"],
        "payload_bytes": req["payload_bytes"],
        "return_bytes": req["return_bytes"],
        "kv_bytes_per_token": req["kv_bytes_per_token"],
        "segments": req["segments"],
        "rate_per_s": _rate(path, table, "1000/s"),
        "zipf": float(table.get("zipf", 1.0)),
        "cache_chunks": table.get("cache_chunks", 16),
        "max_batch_rows": table.get("max_batch_rows", 1024),
        "spans": spans,
        "layers": table.get("layers", 1),
        "pipeline_layers": table.get("pipeline_layers", False),
        "batch_merges": table.get("batch_merges", False),
        "holders": _holders(path, table.get("holders", 1), instances),
        "topk": table.get("topk", 0),
        "unique_tokens": table.get("unique_tokens", 0),
    }


def _check_topk(path: Path, table: dict, spans, chunks: int) -> None:
    """topk (at most the chunks, not with spans), unique_tokens (a top-k request's own)
    and the copies report (of a top-k workload)."""
    given = sorted({"topk", "unique_tokens"} & set(table))
    if spans and given:
        raise ScenarioError(
            f"scenario {path}: [workload] gives spans and {' and '.join(given)}",
            "a span request's chunks come from its expression: drop " + " and ".join(given),
        )
    topk = table.get("topk", 0)
    if "unique_tokens" in table and not topk:
        raise ScenarioError(
            f"scenario {path}: [workload] gives unique_tokens without topk",
            "the unique KV is a top-k request's own: add topk, or drop unique_tokens",
        )
    if "copies" in table.get("reports", ()) and not topk:
        raise ScenarioError(
            f"scenario {path}: [workload] reports copies without topk",
            "copies sets a top-k workload's steps against copies of its context: add topk",
        )
    if topk > chunks:
        raise ScenarioError(
            f"scenario {path}: [workload] topk = {topk} is more than its {chunks} chunks",
            f"route each request to at most {chunks} chunks, or add chunks",
        )


def _holders(path: Path, holders: int, instances: int) -> int:
    """k holders of a shared chunk: at most every instance."""
    if holders > instances:
        raise ScenarioError(
            f"scenario {path}: [workload] holders = {holders} is more than its {instances} instances",
            f"spread a chunk over at most {instances} holders, or add instances",
        )
    return holders


def load_workload(path) -> dict:
    """The scenario's [workload]: ``kind``, the workload's fields (``Workload`` or
    ``PrefillWorkload``), ``fabrics`` and ``requests``; the request shape (heads, bytes,
    layers) comes from its [scenario] model and [request]."""
    path = Path(path)
    data = _read_toml(path)
    scenario = _parse_scenario(data, path)
    table = data.get("workload")
    if not table:
        raise ScenarioError(
            f"scenario {path} has no [workload] to simulate",
            "add a [workload] table (instances, chunks, chunk_tokens, rate, zipf, cache_chunks, fabric)",
        )
    kind = table.get("kind", "decode")
    if kind not in WORKLOAD_KINDS:
        raise ScenarioError(
            f"scenario {path}: [workload] kind = {kind!r} is not a workload",
            f"use {' or '.join(repr(k) for k in WORKLOAD_KINDS)}",
        )
    _check_table(path, table, WORKLOAD_KINDS[kind])
    fabric = table.get("fabric", "nvlink" if kind == "decode" else "tcp")
    if kind == "prefill":
        fields = _prefill_fields(path, table, scenario)
    else:
        fields = _decode_fields(path, table, scenario["request"])
    return {
        "name": scenario["name"],
        "description": scenario["description"],
        "kind": kind,
        "fields": fields,
        "fabrics": _fabrics(path, fabric if isinstance(fabric, list) else [fabric], "[workload]"),
        "requests": table.get("requests", 20000),
        "reports": tuple(table.get("reports", ())),
        "span_cache": (
            _span_cache(path, table, fields["chunk_tokens"])
            if kind == "decode" and "spans" in table
            else None
        ),
        "sharing": _sharing(path, table["sharing"], scenario) if "sharing" in table else None,
        "model": scenario["model"],
    }


# [workload] sharing: each key's type and least value (as WORKLOAD_KEYS), and the defaults:
# MoSKA's setup, Llama-3.1-8B with FP8 KV, 1M-16M shared tokens beside 64K unique, 75 %
# sparsity
SHARING_KEYS = {
    "model": (str, None),
    "kv_format": (str, None),
    "heads": (int, 1),  # query rows a decode token (default: the model's heads)
    "shared_tokens": (list, None),
    "unique_tokens": (int, 1, MOST_TOKENS),
    "chunk_tokens": (int, 1, MOST_TOKENS),  # the router's unit over the shared context
    "keep": (float, 1e-9),  # the fraction of shared chunks a query's router keeps
    "batch": (int, 1),  # concurrent requests a step
    "batches": (list, None),
}
SHARING_DEFAULTS = {
    "model": "llama-3.1-8b",
    "kv_format": "fp8",
    "heads": None,
    "shared_tokens": [2**20, 2**21, 2**22, 2**23, 2**24],
    "unique_tokens": 65536,
    "chunk_tokens": 65536,
    "keep": 0.25,
    "batch": 256,
    "batches": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
}


def _sharing(path, raw: dict, scenario: dict) -> dict:
    """[workload] sharing = { ... }: SHARING_KEYS, checked, defaults filled."""
    where = f"scenario {path}: [workload] sharing"
    if not scenario["model"]:
        raise ScenarioError(
            f"{where} needs the [scenario] model the profile's device terms were fitted on",
            'add model = "deepseek-v3.2" (or the MLA preset the profile measured) to [scenario]',
        )
    _check_table(path, raw, SHARING_KEYS, "[workload] sharing")
    out = {**SHARING_DEFAULTS, **raw}
    for key in ("shared_tokens", "batches"):
        value = out[key]
        if not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value
        ):
            raise ScenarioError(
                f"{where} {key} = {value!r} is not a list of whole numbers >= 1",
                f"write e.g. {key} = {SHARING_DEFAULTS[key]!r}",
            )
    if out["keep"] > 1:
        raise ScenarioError(
            f"{where} keep = {out['keep']} is more than every chunk",
            "give the fraction of shared chunks a query keeps, in (0, 1]",
        )
    try:
        preset = get_model(out["model"])
        preset.kv_bytes_per_token(out["kv_format"])  # refuses a format the model lacks
    except XbenchError as e:
        raise ScenarioError(f"{where}: {e.problem}", e.fix) from None
    if preset.full_layers != preset.layers:
        raise ScenarioError(
            f"{where}: model {preset.name} is a hybrid ({preset.full_layers} of its "
            f"{preset.layers} layers attend the whole context), which shared-KV batching "
            "does not model",
            "pick a model whose every layer attends the whole context (xbench models)",
        )
    out["heads"] = out["heads"] or preset.q_heads
    return out


def _span_cache(path, table: dict, chunk_tokens: int) -> dict:
    """What the span report's KV cache reads: the expressions in the order written, its
    block, and each name's tokens (``chunk_tokens`` where span_tokens does not say)."""
    exprs = tuple(str(item["expr"]) for item in table["spans"])
    trees = [parse_span_tree(e) for e in exprs]
    try:
        check_generated(trees)
    except ValueError as e:
        raise ScenarioError(
            f"scenario {path}: [workload] spans: {e}",
            "a later call may read an output by name; one that generates it again must be "
            "the same call",
        ) from None
    named = {n for tree in trees for n in span_names(tree)}
    lengths = table.get("span_tokens", {})
    for name, tokens in lengths.items():
        if name not in named:
            raise ScenarioError(
                f"scenario {path}: [workload] span_tokens names {name!r}, which no span does",
                f"name one of {', '.join(sorted(named))}",
            )
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ScenarioError(
                f"scenario {path}: [workload] span_tokens.{name} = {tokens!r} is not a token count",
                "give each name's tokens as a whole number >= 1",
            )
    return {
        "exprs": exprs,
        "block": table.get("block_tokens", 16),
        "lengths": dict(lengths),
        "default_tokens": chunk_tokens,
        "dual_output": table.get("dual_output", True),
    }
