"""Profiles on disk: TOML with explicit units, validated strictly, loaded into frozen dataclasses.

Every coefficient is a table ``{ value, low, high, unit, prior }``: ``low``/``high`` are its
95 % interval (default: the value), ``prior = true`` marks a datasheet figure rather than a
measurement. Units are required and converted to SI on load:

- times: ``s ms us ns``; rates: ``B/s KB/s MB/s GB/s KiB/s MiB/s GiB/s Gb/s``;
- device terms: a time per what it counts, e.g. ``ns/token``, ``ps/row-token``,
  ``ns/row-partial``.

See ``profiles/h100-priors.toml`` for the format.
"""

from __future__ import annotations

import math
from pathlib import Path

from xbench.core import device_terms
from xbench.core.costmodel import Ceilings, Coef, Device, Fabric, Profile, Segment
from xbench.core.units import SIZE_UNITS
from xbench.errors import XbenchError
from xbench.files import read_toml, write_text_atomically

PROFILE_SCHEMA_VERSION = 1
FABRICS = ("shm", "nvlink", "ib", "ibgda", "roce", "tcp", "unknown")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "ps": 1e-12}
RATE_UNITS = {
    "B/s": 1.0,
    "TB/s": 1e12,
    "KB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
    "KiB/s": 2**10,
    "MiB/s": 2**20,
    "GiB/s": 2**30,
    "Gb/s": 1e9 / 8,
}
# a [device] table's terms (what each is a time per) and those a profile may leave out:
# device_terms.TERMS; [[device.spliced_saving]] (tokens, saving): what a fetch's first
# attention saves on the chunk it has just spliced, interpolated between the points and
# flat beyond them
DEVICE_TERMS = {t.name: t.per for t in device_terms.TERMS}
OPTIONAL_TERMS = {t.name for t in device_terms.TERMS if not t.required}


class ProfileError(XbenchError):
    pass


def _known(table, allowed, where: str, path: str) -> None:
    """Refuse keys a profile table does not have: a misspelt ``overhed`` would otherwise be
    dropped without a word, and the default used in its place."""
    if not isinstance(table, dict):
        return
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ProfileError(
            f"profile {path}: {where} has unknown key {', '.join(unknown)}",
            f"use {', '.join(sorted(allowed))}",
        )


def _tables(value, where: str, array: str, path: str) -> list:
    """An array of tables ([[array]]), or a one-line refusal: a single [array] table, or a
    plain value, was iterated as if it were one (a traceback)."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ProfileError(
            f"profile {path}: {where} is not a list of [[{array}]] tables",
            f"write each as its own [[{array}]] table",
        )
    return value


COEF_KEYS = ("value", "low", "high", "unit", "prior", "source", "bound")
FLOP_RATE_UNITS = {"FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15}
FABRIC_KEYS = (
    "name",
    "pair_class",
    "transport",
    "overhead",
    "heldout_mape",
    "block_t0",
    "block_beta",
    "segment",
)


def _coef(
    raw,
    where: str,
    kind: str,
    path: str,
    per: str | None = None,
    positive: bool = False,
    signed: bool = False,
) -> Coef:
    """Parse one coefficient table; ``kind`` is 'time' or 'rate'; ``signed``: a difference
    of two times, which may be negative."""
    if not isinstance(raw, dict) or "value" not in raw:
        raise ProfileError(
            f"profile {path}: {where} must be a table with value and unit",
            'write it as { value = 1.5, unit = "us" }',
        )
    _known(raw, COEF_KEYS, where, path)
    unit = raw.get("unit")
    scale, si = _unit_scale(unit, where, kind, path, per)
    for key in ("value", "low", "high"):
        if isinstance(raw.get(key), bool):  # TOML's true is not the number 1
            raise ProfileError(
                f"profile {path}: {where} {key} is {str(raw[key]).lower()}, not a number",
                "write the number, e.g. value = 1.5",
            )
    try:
        value = float(raw["value"]) * scale
        low = float(raw.get("low", raw["value"])) * scale
        high = float(raw.get("high", raw["value"])) * scale
    except (TypeError, ValueError):
        raise ProfileError(
            f"profile {path}: {where} value is not a number", "write numbers without quotes"
        ) from None
    for label, number in (("value", value), ("low", low), ("high", high)):
        if not math.isfinite(number):
            raise ProfileError(
                f"profile {path}: {where} {label} is {number} (not a finite number)",
                "give a finite measured or datasheet figure",
            )
    if positive and min(value, low) <= 0:
        raise ProfileError(
            f"profile {path}: {where} must be positive, got {raw['value']} {unit}",
            "a bandwidth is a positive rate",
        )
    if min(value, low) < 0 and not signed:
        raise ProfileError(
            f"profile {path}: {where} is negative ({raw['value']} {unit})",
            "times and costs are non-negative",
        )
    if not low <= value <= high:
        raise ProfileError(
            f"profile {path}: {where} interval [{raw.get('low')}, {raw.get('high')}] does not contain its value",
            "give low <= value <= high",
        )
    source = raw.get("source", "")
    if not isinstance(source, str):
        raise ProfileError(
            f"profile {path}: {where} source must be text", 'write it as source = "..."'
        )
    bound = raw.get("bound", False)
    if not isinstance(bound, bool) or not isinstance(raw.get("prior", False), bool):
        raise ProfileError(
            f"profile {path}: {where} prior and bound must be true or false",
            "write prior = true (or false) without quotes",
        )
    # a coefficient left at a fit's bound is no measurement: a prior, whatever else it says
    return Coef(value, low, high, si, bool(raw.get("prior", False)) or bound, source, bound)


def _unit_scale(unit, where: str, kind: str, path: str, per: str | None) -> tuple[float, str]:
    """(seconds or B/s in one ``unit``, the SI unit) of a coefficient's unit: a rate, or a
    time per ``per`` (a plain time where ``per`` is None)."""
    if not unit:
        hint = (
            "a rate unit such as GB/s"
            if kind == "rate"
            else (f"a time per {per} such as ns/{per}" if per else "a time unit such as us")
        )
        raise ProfileError(f"profile {path}: {where} has no unit", f"add unit = ... ({hint})")
    if kind == "rate":
        scale, si = RATE_UNITS.get(unit), "B/s"
    else:
        top, _, bottom = unit.partition("/")
        if (bottom or None) != per:
            expected = (
                f"a time per {per} (e.g. ns/{per})" if per else "a plain time (s, ms, us, ns)"
            )
            raise ProfileError(f"profile {path}: {where} has unit {unit!r}", f"use {expected}")
        scale, si = TIME_UNITS.get(top), "s" + (f"/{per}" if per else "")
    if scale is None:
        choices = ", ".join(RATE_UNITS if kind == "rate" else TIME_UNITS)
        raise ProfileError(
            f"profile {path}: {where} has unknown unit {unit!r}", f"use one of {choices}"
        )
    return scale, si


def _rate(raw, where: str, units: dict, path: str) -> float:
    """A positive rate table ``{ value, unit }`` in SI (a ceiling)."""
    _known(raw, ("value", "unit"), where, path)
    value = raw.get("value") if isinstance(raw, dict) else None
    scale = units.get(raw.get("unit")) if isinstance(raw, dict) else None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if scale is None or not number or not 0 < value < math.inf:
        raise ProfileError(
            f"profile {path}: {where} must be {{ value = <positive number>, unit = ... }}",
            f"use a unit among {', '.join(units)}",
        )
    return float(value) * scale


def _ceilings(raw, path: str) -> Ceilings | None:
    """[ceilings]: the hardware's memory bandwidth, matmul rate, link rates and HBM."""
    if raw is None:
        return None
    _known(raw, ("source", "memory", "matmul", "matmul_fp8", "links", "hbm"), "[ceilings]", path)
    for key in ("memory", "matmul"):
        if key not in raw:
            raise ProfileError(
                f"profile {path}: [ceilings] lacks {key}",
                'give memory = { value = 3.35, unit = "TB/s" } and matmul = '
                '{ value = 989, unit = "TFLOP/s" }',
            )
    links = raw.get("links", {})
    if not isinstance(links, dict):
        raise ProfileError(
            f"profile {path}: [ceilings] links must be a table by fabric",
            'write links = { ib = { value = 50, unit = "GB/s" } }',
        )
    return Ceilings(
        _rate(raw["memory"], "[ceilings] memory", RATE_UNITS, path),
        _rate(raw["matmul"], "[ceilings] matmul", FLOP_RATE_UNITS, path),
        {
            name: _rate(rate, f"[ceilings] links {name}", RATE_UNITS, path)
            for name, rate in links.items()
        },
        str(raw.get("source", "")),
        _rate(raw["matmul_fp8"], "[ceilings] matmul_fp8", FLOP_RATE_UNITS, path)
        if "matmul_fp8" in raw
        else None,
        _rate(raw["hbm"], "[ceilings] hbm", SIZE_UNITS, path) if "hbm" in raw else None,
    )


def _min_tokens(seg, where: str, path: str) -> float:
    value = seg.get("min_tokens")  # seg: one of _tables' tables
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise ProfileError(
            f"profile {path}: {where} needs min_tokens > 0",
            "the flat device terms are the piece from 0 tokens",
        )
    return float(value)


def _pieces(dev: dict, kind: str, names: tuple, path: str) -> tuple:
    """Further pieces of a device term: [[device.<kind>_segment]] tables, from min_tokens on."""
    array = f"device.{kind}_segment"
    segments = _tables(dev.get(f"{kind}_segment", []), f"device {kind}_segment", array, path)
    for i, seg in enumerate(segments):
        _known(seg, ("min_tokens", *names), f"device {kind}_segment {i + 1}", path)
    return tuple(
        (
            _min_tokens(seg, f"device {kind}_segment {i + 1}", path),
            *(
                _coef(
                    seg.get(t),
                    f"device {kind}_segment {i + 1} {t}",
                    "time",
                    path,
                    per=DEVICE_TERMS[f"{kind}_{t}"],
                )
                for t in names
            ),
        )
        for i, seg in enumerate(segments)
    )


def _spliced_saving(dev: dict, path: str) -> tuple:
    """[[device.spliced_saving]] points: what a fetch's first attention saves by attending
    the chunk it has just spliced, at ``tokens`` (interpolated between, flat beyond)."""
    points = []
    raw = _tables(
        dev.get("spliced_saving", []), "device spliced_saving", "device.spliced_saving", path
    )
    for i, point in enumerate(raw):
        where = f"device spliced_saving {i + 1}"
        _known(point, ("tokens", "saving"), where, path)
        tokens = point.get("tokens")
        number = isinstance(tokens, (int, float)) and not isinstance(tokens, bool)
        if not number or not math.isfinite(tokens) or tokens <= 0:
            raise ProfileError(
                f"profile {path}: {where} needs tokens > 0", "the chunk size it was measured at"
            )
        points.append(
            (
                float(tokens),
                _coef(point.get("saving"), f"{where} saving", "time", path, signed=True),
            )
        )
    if len({t for t, _ in points}) < len(points):
        raise ProfileError(
            f"profile {path}: device spliced_saving has two points at one chunk size",
            "keep one point per tokens value",
        )
    return tuple(points)


def _segments(raw: dict, name: str, path: str) -> tuple[Segment, ...]:
    """A fabric's [[fabric.segment]]s: one from min_bytes 0, each from its own size."""
    segs = _tables(raw.get("segment", []), f"fabric {name} segment", "fabric.segment", path)
    if not segs:
        raise ProfileError(
            f"profile {path}: fabric {name} has no [[fabric.segment]]",
            "give at least one segment with alpha and beta",
        )
    segments = []
    for j, seg in enumerate(segs):
        where = f"fabric {name} segment {j + 1}"
        _known(seg, ("min_bytes", "alpha", "beta"), where, path)
        min_bytes = seg.get("min_bytes", 0)
        number = isinstance(min_bytes, (int, float)) and not isinstance(min_bytes, bool)
        if not number or not math.isfinite(min_bytes) or min_bytes < 0:
            raise ProfileError(
                f"profile {path}: {where} min_bytes must be a non-negative number",
                "give min_bytes in bytes",
            )
        segments.append(
            Segment(
                float(min_bytes),
                _coef(seg.get("alpha"), f"{where} alpha", "time", path),
                _coef(seg.get("beta"), f"{where} beta", "rate", path, positive=True),
            )
        )
    starts = [s.min_bytes for s in segments]
    if len(set(starts)) < len(starts):
        raise ProfileError(
            f"profile {path}: fabric {name} has two segments from one min_bytes",
            "give each segment its own min_bytes",
        )
    if sorted(starts)[0] != 0:
        raise ProfileError(
            f"profile {path}: fabric {name} has no segment starting at min_bytes = 0",
            "the first segment must cover the smallest messages",
        )
    return tuple(segments)


def _fabric(raw: dict, i: int, path: str) -> Fabric:
    """The i-th [[fabric]] table (from 0)."""
    _known(raw, FABRIC_KEYS, f"fabric {i + 1}", path)
    name = raw.get("name")
    if name not in FABRICS:
        raise ProfileError(
            f"profile {path}: fabric {i + 1} has unknown name {name!r}",
            f"use one of {', '.join(FABRICS)}",
        )
    segments = _segments(raw, name, path)
    overhead = _coef(
        raw.get("overhead", {"value": 0, "unit": "s"}), f"fabric {name} overhead", "time", path
    )
    if ("block_t0" in raw) != ("block_beta" in raw):
        raise ProfileError(
            f"profile {path}: fabric {name} has one of block_t0 and block_beta",
            "give both (a fetch page by page, from xbench probe -p offgather) or neither",
        )
    pages = {}
    if "block_t0" in raw:
        pages = {
            "block_t0": _coef(raw["block_t0"], f"fabric {name} block_t0", "time", path),
            "block_beta": _coef(
                raw["block_beta"], f"fabric {name} block_beta", "rate", path, positive=True
            ),
        }
    return Fabric(
        name,
        segments,
        overhead,
        raw.get("pair_class", "inter-node"),
        raw.get("transport", "mpi"),
        raw.get("heldout_mape"),
        **pages,
    )


def _device(dev, path: str) -> Device:
    """The [device] table: every required term, the optional ones in their groups."""
    if not isinstance(dev, dict):
        raise ProfileError(
            f"profile {path} has no [device] table",
            "add the compute, merge and move terms (see profiles/h100-priors.toml)",
        )
    device_keys = ["name", *DEVICE_TERMS]
    device_keys += ["compute_segment", "move_segment", "splice_segment", "spliced_saving"]
    _known(dev, device_keys, "[device]", path)
    terms = {}
    for term, per in DEVICE_TERMS.items():
        if term not in dev:
            if term in OPTIONAL_TERMS:
                terms[term] = None
                continue
            raise ProfileError(
                f"profile {path}: [device] lacks {term}",
                "fit it from kernel samples (xbench fit) or give a prior",
            )
        terms[term] = _coef(dev[term], f"device {term}", "time", path, per=per)
    terms["compute_segments"] = _pieces(dev, "compute", ("t0", "per_token", "per_row_token"), path)
    terms["move_segments"] = _pieces(dev, "move", ("t0", "per_token"), path)
    terms["splice_segments"] = _pieces(dev, "splice", ("t0", "per_token"), path)
    terms["spliced_saving"] = _spliced_saving(dev, path)
    if (terms["splice_t0"] is None) != (terms["splice_per_token"] is None) or (
        terms["splice_segments"] and terms["splice_t0"] is None
    ):
        raise ProfileError(
            f"profile {path}: [device] has part of the splice term",
            "give splice_t0 and splice_per_token together (or neither, with no splice_segment)",
        )
    if (terms["idle_extra"] is None) != (terms["idle_tau"] is None):
        raise ProfileError(
            f"profile {path}: [device] has one of idle_extra and idle_tau",
            "give both (xbench kernel --idle, then fit) or neither",
        )
    waits = ("merge_wait_t0", "merge_wait_per_row_partial", "merge_wait_tau")
    if len({terms[t] is None for t in waits}) > 1:
        raise ProfileError(
            f"profile {path}: [device] has part of the merge-wait term",
            "give merge_wait_t0, merge_wait_per_row_partial and merge_wait_tau together "
            "(xbench kernel --merge-wait, then fit) or none of them",
        )
    return Device(dev.get("name", "device"), **terms)


def parse_profile(data: dict, path: str = "<profile>") -> Profile:
    """Build a Profile from parsed TOML, or raise a one-line ProfileError."""
    _known(data, ("profile", "provenance", "ceilings", "fabric", "device"), "the top level", path)
    head = data.get("profile", {})
    _known(head, ("name", "schema_version"), "[profile]", path)
    version = head.get("schema_version", PROFILE_SCHEMA_VERSION)
    if version != PROFILE_SCHEMA_VERSION:
        raise ProfileError(
            f"profile {path} has schema_version {version!r}, this xbench reads {PROFILE_SCHEMA_VERSION}",
            "refit it with this xbench",
        )
    raw_fabrics = _tables(data.get("fabric", []), "fabric", "fabric", path)
    if not raw_fabrics:
        raise ProfileError(
            f"profile {path} has no [[fabric]] tables",
            "add at least one fabric, or fit one with xbench fit",
        )
    fabrics = tuple(_fabric(raw, i, path) for i, raw in enumerate(raw_fabrics))
    device = _device(data.get("device"), path)
    provenance = dict(data.get("provenance", {}))
    provenance.setdefault("name", head.get("name", Path(path).stem))
    return Profile(
        head.get("name", Path(path).stem),
        fabrics,
        device,
        provenance,
        _ceilings(data.get("ceilings"), path),
    )


def load_profile(path) -> Profile:
    """Read and validate a profile file."""
    path = Path(path)
    data = read_toml(
        path,
        "profile",
        "pass a profile file (profiles/*.toml or one xbench fit wrote) or a shipped one's name",
        ProfileError,
    )
    return parse_profile(data, str(path))


def _coef_table(c: Coef, unit: str, scale: float) -> dict:
    out = {"value": c.value / scale, "low": c.low / scale, "high": c.high / scale, "unit": unit}
    if c.prior:
        out["prior"] = True
    if c.bound:
        out["bound"] = True
    if c.source:
        out["source"] = c.source
    return out


def profile_to_toml_dict(profile: Profile) -> dict:
    """The TOML structure of a profile (times in us / ns, rates in GB/s)."""
    fabrics = []
    for f in profile.fabrics:
        entry = {
            "name": f.name,
            "pair_class": f.pair_class,
            "transport": f.transport,
            "overhead": _coef_table(f.overhead, "us", 1e-6),
        }
        if f.heldout_mape is not None:
            entry["heldout_mape"] = f.heldout_mape
        if f.block_t0 is not None:
            entry["block_t0"] = _coef_table(f.block_t0, "us", 1e-6)
            entry["block_beta"] = _coef_table(f.block_beta, "GB/s", 1e9)
        entry["segment"] = [
            {
                "min_bytes": int(s.min_bytes),
                "alpha": _coef_table(s.alpha, "us", 1e-6),
                "beta": _coef_table(s.beta, "GB/s", 1e9),
            }
            for s in f.segments
        ]
        fabrics.append(entry)
    d = profile.device
    device = {"name": d.name}
    for term in device_terms.TERMS:
        c = getattr(d, term.name)
        if c is not None:
            device[term.name] = _coef_table(c, term.shown, term.scale)
    if d.compute_segments:
        device["compute_segment"] = [
            {
                "min_tokens": int(m),
                "t0": _coef_table(t0, "us", 1e-6),
                "per_token": _coef_table(a, "ns/token", 1e-9),
                "per_row_token": _coef_table(k, "ns/row-token", 1e-9),
            }
            for m, t0, a, k in d.compute_segments
        ]
    for kind in ("move", "splice"):
        if getattr(d, f"{kind}_segments"):
            device[f"{kind}_segment"] = [
                {
                    "min_tokens": int(m),
                    "t0": _coef_table(t0, "us", 1e-6),
                    "per_token": _coef_table(a, "ns/token", 1e-9),
                }
                for m, t0, a in getattr(d, f"{kind}_segments")
            ]
    if d.spliced_saving:
        device["spliced_saving"] = [
            {"tokens": int(t), "saving": _coef_table(c, "us", 1e-6)} for t, c in d.spliced_saving
        ]
    return {
        "profile": {"name": profile.name, "schema_version": PROFILE_SCHEMA_VERSION},
        "provenance": profile.provenance,
        **({"ceilings": _ceilings_table(profile.ceilings)} if profile.ceilings else {}),
        "fabric": fabrics,
        "device": device,
    }


def _ceilings_table(c: Ceilings) -> dict:
    table = {"source": c.source} if c.source else {}
    table["memory"] = {"value": c.memory / 1e12, "unit": "TB/s"}
    table["matmul"] = {"value": c.matmul / 1e12, "unit": "TFLOP/s"}
    if c.matmul_fp8:
        table["matmul_fp8"] = {"value": c.matmul_fp8 / 1e12, "unit": "TFLOP/s"}
    if c.hbm:
        table["hbm"] = {"value": c.hbm / 1e9, "unit": "GB"}
    if c.links:
        table["links"] = {n: {"value": r / 1e9, "unit": "GB/s"} for n, r in c.links.items()}
    return table


def save_profile(profile: Profile, path, replace: bool = True) -> Path:
    import tomli_w

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all: a --force onto a full disk keeps the profile that was there
        write_text_atomically(path, tomli_w.dumps(profile_to_toml_dict(profile)), replace)
    except OSError as exc:
        raise XbenchError(
            f"cannot write profile {path} ({exc.strerror})", "pass --out with a writable path"
        ) from None
    return path
