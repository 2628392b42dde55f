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
        | (set(data) - {"scenario", "request", "grid"})
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
