"""Scenarios: named request grids for ``xbench decide --scenario FILE`` (TOML).

A scenario fixes the request shape (``[request]``) and the axes to sweep (``[grid]``), and
says where the question comes from (``[scenario]``). Example: ``scenarios/*.toml``.

    [scenario]
    name = "span-query-fanout"
    description = "..."
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
import sys
from pathlib import Path

from xbench.core.models import get_model
from xbench.core.units import parse_duration, parse_size
from xbench.errors import XbenchError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REQUEST_KEYS = {"heads", "payload", "return", "kv_bytes", "fetch_cost", "segments", "probe"}
GRID_KEYS = {"rows", "chunk_tokens", "reuse", "fabric"}


class ScenarioError(XbenchError):
    pass


def load_scenario(path) -> dict:
    """Parse and check a scenario; returns {name, description, source, request, axes}."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(
            f"scenario {path} does not exist", "pass --scenario with a file from scenarios/"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(
            f"scenario {path} is not valid TOML ({exc})", "fix the syntax at that line"
        ) from None
    head = data.get("scenario", {})
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
    preset = get_model(head["model"]) if head.get("model") else None
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
        request = {
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
    axes["fabric"] = [None] if fabric == "all" else (fabric if isinstance(fabric, list) else None)
    if axes["fabric"] is None:
        raise ScenarioError(
            f'scenario {path}: [grid] fabric must be "all" or a list', 'e.g. fabric = ["ib", "tcp"]'
        )
    return {
        "name": head["name"],
        "description": head.get("description", ""),
        "source": head.get("source", ""),
        "model": head.get("model"),
        "request": request,
        "axes": axes,
    }


# [workload]: what ``xbench simulate`` replays (``decide`` ignores it).
WORKLOAD_KEYS = {
    "instances": int,
    "chunks": int,
    "chunk_tokens": int,
    "rows": int,
    "rate": str,
    "zipf": float,
    "cache_chunks": int,
    "max_batch_rows": int,
    "fabric": (str, list),
    "requests": int,
}


def load_workload(path) -> dict:
    """The scenario's [workload] as Workload fields plus ``fabrics`` and ``requests``; the
    request shape (heads, bytes) comes from its [scenario] model and [request]."""
    path = Path(path)
    scenario = load_scenario(path)
    table = tomllib.loads(path.read_text()).get("workload")
    if not table:
        raise ScenarioError(
            f"scenario {path} has no [workload] to simulate",
            "add a [workload] table (instances, chunks, chunk_tokens, rate, zipf, cache_chunks, fabric)",
        )
    for key, value in table.items():
        kind = WORKLOAD_KEYS.get(key)
        if kind is None:
            raise ScenarioError(
                f"scenario {path}: unknown [workload] field {key!r}",
                f"use {', '.join(sorted(WORKLOAD_KEYS))}",
            )
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise ScenarioError(
                f"scenario {path}: [workload] {key} = {value!r} has the wrong type",
                f"give {key} as {'a number' if kind in (int, float) else 'text or a list'}",
            )
        if kind in (int, float) and value < (0 if key in ("zipf", "cache_chunks") else 1):
            raise ScenarioError(
                f"scenario {path}: [workload] {key} = {value} is out of range",
                f"give {key} {'>= 0' if key in ('zipf', 'cache_chunks') else '>= 1'}",
            )
    rate_text = str(table.get("rate", "1000/s")).strip()
    try:
        rate = float(rate_text.removesuffix("/s"))
        if rate <= 0:
            raise ValueError(rate_text)
    except ValueError:
        raise ScenarioError(
            f"scenario {path}: [workload] rate = {rate_text!r} is not a rate",
            'write e.g. rate = "2000/s"',
        ) from None
    fabric = table.get("fabric", "nvlink")
    req = scenario["request"]
    fields = {
        "instances": table.get("instances", 8),
        "chunks": table.get("chunks", 256),
        "chunk_tokens": table.get("chunk_tokens", 2048),
        "rows": table.get("rows", 1),
        "heads": req["heads"],
        "payload_bytes": req["payload_bytes"],
        "return_bytes": req["return_bytes"],
        "kv_bytes_per_token": req["kv_bytes_per_token"],
        "segments": req["segments"],
        "rate_per_s": rate,
        "zipf": float(table.get("zipf", 1.0)),
        "cache_chunks": table.get("cache_chunks", 16),
        "max_batch_rows": table.get("max_batch_rows", 1024),
    }
    return {
        "name": scenario["name"],
        "description": scenario["description"],
        "fields": fields,
        "fabrics": fabric if isinstance(fabric, list) else [fabric],
        "requests": table.get("requests", 20000),
    }
