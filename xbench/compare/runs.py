"""Stored runs as ``xbench compare`` sees them: which table, which cases, and whether two
runs can be compared at all (the run metadata checked as pyperf checks its metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from xbench.core import conditions
from xbench.errors import XbenchError
from xbench.results.schema import (
    KERNEL_CASE_KEYS,
    KERNEL_SAMPLES,
    PROBE_CASE_KEYS,
    PROBE_SAMPLES,
    VALIDATE_CASE_KEYS,
    VALIDATE_SAMPLES,
)
from xbench.results.store import (
    incompleteness,
    read_run_meta,
    read_table,
    schema_metadata,
    table_files,
)

# Exit code of compare and check when nothing can be compared (documented in the README).
EXIT_NOT_COMPARABLE = 4

# Per command: its samples table and the columns that name one case.
CASE_KEYS = {
    "probe": (PROBE_SAMPLES, PROBE_CASE_KEYS),
    "kernel": (KERNEL_SAMPLES, KERNEL_CASE_KEYS),
    "validate": (VALIDATE_SAMPLES, VALIDATE_CASE_KEYS),
}
# The columns a case's label shows (the rest are usually the same across a run).
LABEL_KEYS = {
    "probe": ["pattern", "transport", "fabric", "size_bytes", "rank_a", "rank_b"],
    "kernel": [
        "kernel",
        "backend",
        "dtype",
        "rows",
        "heads",
        "chunk_tokens",
        "after_tokens",
        "idle_us",
        "wait_us",
        "after_splice_tokens",
        "sparse",
    ],
    "validate": ["option", "fabric", "rows", "chunk_tokens", "segments"],
}


@dataclass
class StoredRun:
    path: Path
    command: str
    meta: dict
    samples: pd.DataFrame  # measured samples only, with a ``launch`` column
    schema_version: int
    incomplete: str | None = None  # why the run lacks cases it planned (partial, lost files)


def load_run(path) -> StoredRun:
    """A run directory written by probe, kernel or validate; one line when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise XbenchError(
            f"{path} is not a run directory",
            "pass a directory written by xbench probe, kernel or validate",
        )
    meta = read_run_meta(path)
    command = meta.get("command")
    if command not in CASE_KEYS:
        raise XbenchError(
            f"{path} holds no probe, kernel or validate run (run.json command {command!r})",
            "pass a directory written by xbench probe, kernel or validate",
        )
    table = CASE_KEYS[command][0]
    files = table_files([path], table)
    if not files:
        raise XbenchError(f"{path} has no {table} yet", "let the run finish, or pass another run")
    version = int(schema_metadata(files[0]).get(b"xbench.schema_version", b"0"))
    samples = read_table([path], table)
    samples = samples[~samples.warmup].copy()
    if command == "probe":  # the timed loop's own overhead is a correction, not a figure
        samples = samples[samples.pattern != "overhead"]
    samples = samples[samples.value > 0]  # compared on a log scale
    samples["launch"] = samples["process_run"] if "process_run" in samples else 0
    return StoredRun(path, command, meta, samples, version, incompleteness(path))


# The metadata that must agree for two runs' figures to be compared (core.conditions'
# registry); --allow names the ones a comparison means to cross (a nightly job after a
# driver update allows "driver"). Which command made a run is not among them: a probe and a
# kernel run share no case, whatever is allowed.
COMPARED_FIELDS = conditions.COMPARED_FIELDS


def differences(base: StoredRun, cand: StoredRun) -> list[tuple[str, object, object]]:
    """(field, baseline value, candidate value) for each compared field that differs.

    Runs of different commands are refused first, in their own words: no field to allow
    would make them comparable."""
    if base.command != cand.command:
        raise XbenchError(
            f"{base.path} is a {base.command} run and {cand.path} a {cand.command} run: "
            "runs of different kinds share no case",
            f"compare {base.command} runs with {base.command} runs",
            exit_code=EXIT_NOT_COMPARABLE,
        )
    found = [
        (name, get(base.meta), get(cand.meta))
        for name, get in COMPARED_FIELDS.items()
        if get(base.meta) != get(cand.meta)
    ]
    if base.schema_version != cand.schema_version:
        found.append(("schema", base.schema_version, cand.schema_version))
    return found


def case_frame(run: StoredRun) -> pd.DataFrame:
    """The run's samples with a ``case`` label column (keys as text, in a fixed order)."""
    keys = CASE_KEYS[run.command][1]
    frame = run.samples.copy()
    frame["case_key"] = ["|".join(map(str, row)) for row in frame[keys].itertuples(index=False)]
    frame["case"] = frame.apply(lambda r: label(run.command, r), axis=1)
    return frame


def label(command: str, row) -> str:
    """A case's name for people: its distinguishing keys, shortest form."""
    from xbench.core.units import format_size

    parts = []
    for key in LABEL_KEYS[command]:
        value = row[key]
        if (
            value is None
            or (isinstance(value, float) and value != value)
            or key in ("rank_a", "rank_b")
        ):
            continue
        if key == "size_bytes":
            parts.append(format_size(int(value)))
        elif key == "sparse":
            parts.append("sparse" if value else "dense")
        elif key == "after_tokens":
            if value:
                parts.append(f"after {value}")
        elif key == "idle_us":
            if value:
                parts.append(f"after {value} us idle")
        elif key == "wait_us":
            if value:
                parts.append(f"after a {value} us wait")
        elif key == "after_splice_tokens":
            if value:
                parts.append("after its splice")
        elif key == "chunk_tokens" and command == "kernel" and not value:
            continue  # a merge has no chunk of its own
        elif key in ("rows", "heads") and command == "kernel" and not value:
            continue  # a ceiling has neither
        elif key in ("rows", "heads", "chunk_tokens", "segments"):
            parts.append(f"{key.split('_')[0]}={value}")
        else:
            parts.append(str(value))
    if command == "probe":
        parts.append(f"ranks {row['rank_a']}-{row['rank_b']}")
    return " ".join(parts)
