"""The results directory: one folder per run, Parquet part files written as cases finish.

Layout of ``<out>/``::

    run.json                     run metadata (also embedded in every Parquet file)
    probe_samples/part-00000.parquet, part-00001.parquet, ...   one file per finished case
    kernel_samples/part-*.parquet
    summary.parquet / decisions.parquet   written by the commands that produce them

Part files are written to a temporary name and renamed, so a crash or a killed rank
never leaves a half-written file, and every finished case stays readable.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from xbench.errors import XbenchError
from xbench.files import write_atomically
from xbench.native import prove_writable
from xbench.results.schema import MIGRATIONS, SCHEMA_VERSIONS, SCHEMAS
from xbench.results.written_here import note_run_dir_written


def ensure_writable_dir(path: Path) -> Path:
    """Create ``path`` if needed and prove it is writable, or raise a one-line error."""
    path = Path(path)
    try:
        return prove_writable(path)
    except OSError as exc:
        # mkdir's own word for a file in the way is "File exists", which reads as no problem
        why = "a file, not a directory" if path.exists() and not path.is_dir() else None
        raise XbenchError(
            f"cannot write results to {path} ({why or exc.strerror or exc})",
            "pass --out with a directory you can write",
        ) from None


_held_locks: list = []  # open lock files: each holds its run directory until the process ends


def _release_locks() -> None:
    """At exit, however the command ended (a result, an error, a signal turned into an
    exit), each held lock file is removed before its lock goes: a run directory keeps no
    ``.xbench.lock`` behind. (A process killed outright leaves its file, whose lock the
    kernel has released; the next run on the directory takes it over.)"""
    while _held_locks:
        handle = _held_locks.pop()
        with contextlib.suppress(OSError):
            os.unlink(handle.name)
        with contextlib.suppress(OSError):
            handle.close()


atexit.register(_release_locks)


def claim_run_dir(out_dir: Path) -> Path:
    """Make ``out_dir`` this command's run directory: writable, not another run's, and
    locked, so that a second xbench started on it at the same time is refused instead of
    interleaving its part files with this one's (the lock goes with the process)."""
    import fcntl

    out_dir = ensure_writable_dir(Path(out_dir))
    handle = open(out_dir / ".xbench.lock", "a+")  # noqa: SIM115 - held until exit
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise XbenchError(
            f"{out_dir} is in use by another xbench (pid {holder})",
            "wait for it to finish, or pass another --out",
        ) from None
    refuse_existing_run(out_dir)
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
    except OSError as exc:  # a full disk: named (a buffered write's error names no file)
        with contextlib.suppress(OSError):  # closing flushes the same bytes again
            handle.close()
        raise OSError(exc.errno, exc.strerror, str(out_dir / ".xbench.lock")) from None
    _held_locks.append(handle)
    note_run_dir_written(out_dir)
    return out_dir


def announce_run(out_dir: Path, meta: dict) -> None:
    """Write run.json before any rank starts: a launch that never gets going (killed, or
    ranks that cannot start) still leaves a run that says it did not finish."""
    _write_meta(Path(out_dir), {**meta, "status": RUNNING})


def write_table(
    path: Path, table_name: str, rows_or_frame, run_meta: dict, replace: bool = True
) -> Path:
    """Write rows (list of dicts or a DataFrame) as one Parquet file of a known schema
    (``replace`` False: refused where the file appeared meanwhile)."""
    schema = SCHEMAS[table_name]
    frame = (
        rows_or_frame if isinstance(rows_or_frame, pd.DataFrame) else pd.DataFrame(rows_or_frame)
    )
    for field in schema:
        if field.name not in frame.columns:
            frame[field.name] = None
    table = pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    table = table.replace_schema_metadata(
        {
            b"xbench.table": table_name.encode(),
            b"xbench.schema_version": str(SCHEMA_VERSIONS[table_name]).encode(),
            b"xbench.run": json.dumps(run_meta, default=str).encode(),
        }
    )
    write_atomically(path, lambda p: pq.write_table(table, p), replace)
    return path


def report_path(table_path: Path, report: str) -> Path:
    """Where a report of the table at ``table_path`` lies: NAME.<report>.parquet beside
    NAME.parquet (``schema.SIMULATION_REPORTS``)."""
    table_path = Path(table_path)
    return table_path.with_name(f"{table_path.stem}.{report}{table_path.suffix}")


def refuse_existing_run(out_dir: Path, run_id: str | None = None) -> None:
    """One directory holds one run: adding to another run's samples would mix them.

    The same run may continue there (``--runs N`` launches N process sets into one run).
    """
    meta = Path(out_dir) / "run.json"
    if meta.exists():
        try:
            other = json.loads(meta.read_text()).get("run_id", "?")
        except (OSError, ValueError, AttributeError):
            other = "?"
        if run_id is not None and other == run_id:
            return
        raise XbenchError(
            f"{out_dir} already holds run {other}", "pass a new --out directory or delete that one"
        )


def refuse_overwrite(
    path: Path, force: bool, option: str = "--out", suffix: str | None = None
) -> Path:
    """One-file outputs (a profile, a decision table) never replace a file silently: nor
    a symbolic link, dangling or not (what it names may be someone's). ``suffix``: the
    only suffix the file may have (a Parquet table is written as nothing else)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():  # --force never replaces a directory
        raise XbenchError(f"{path} is a directory", f"pass {option} with a file path")
    if suffix is not None and path.suffix.lower() != suffix:
        named = f"a {path.suffix} name" if path.suffix else "a name without a suffix"
        raise XbenchError(
            f"{option} {path}: this writes {suffix[1:].capitalize()}, not under {named}",
            f"name it {path.with_suffix(suffix).name}"
            + (", or print CSV with --format csv > FILE" if suffix == ".parquet" else ""),
        )
    if path.is_symlink():
        raise XbenchError(
            f"{path} is a symbolic link (to {os.readlink(path)})",
            f"pass {option} with the path of a file, not a link",
        )
    if path.exists() and not force:
        raise XbenchError(
            f"{path} already exists", f"pass another {option}, or --force to replace it"
        )
    return path


# run.json "status": a run is "running" from its first file on and "complete" once every
# case finished; "partial" when it stopped early (interrupted, a rank died, a case hung),
# with the reason. Runs written before the status existed read as complete.
RUNNING, COMPLETE, PARTIAL = "running", "complete", "partial"


def _write_meta(out_dir: Path, meta: dict) -> None:
    write_atomically(
        Path(out_dir) / "run.json", lambda p: p.write_text(json.dumps(meta, indent=2, default=str))
    )


def mark_partial(out_dir: Path, reason: str) -> str | None:
    """Record in run.json that the run stopped before its last case (best-effort), unless it
    already says otherwise: a run that finished keeps its status (an error or a signal while
    its summary prints), as does one already marked. Returns what run.json says now (None:
    nothing was written yet)."""
    meta_file = Path(out_dir) / "run.json"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        return None  # nothing was written yet, or run.json is not ours to repair
    if meta.get("status") != RUNNING:
        return run_status(meta)
    meta["status"], meta["stopped_because"] = PARTIAL, reason
    try:
        _write_meta(out_dir, meta)
    except OSError:
        return RUNNING  # a full disk: the error that stopped the run is the one to report
    return PARTIAL


# run.json fields keyed by launch (--runs N): kept from the earlier launches of a run
PER_LAUNCH = ("rank_placement",)


class RunStore:
    """Writer for one run directory.

    A run may take several launches (``--runs N``, or one srun step each): each launch opens
    the same run again. What earlier launches planned is carried over, and a launch that
    stopped early leaves the whole run partial, whatever the launches after it do.
    """

    def __init__(self, out_dir: Path, run_meta: dict):
        self.out_dir = ensure_writable_dir(Path(out_dir))
        refuse_existing_run(self.out_dir, run_meta.get("run_id"))
        before = read_run_meta(self.out_dir)  # an earlier launch of this run, or {}
        self._planned_before = dict(before.get("planned_parts") or {})
        self.run_meta = {**run_meta, "status": RUNNING}
        for key in PER_LAUNCH:  # {launch: ...}: each launch adds its own to the earlier ones'
            if isinstance(before.get(key), dict) and isinstance(run_meta.get(key), dict):
                self.run_meta[key] = {**before[key], **run_meta[key]}
        if run_status(before) == PARTIAL:
            self.run_meta["stopped_before"] = before.get("stopped_because", "an earlier launch")
        self.run_meta["planned_parts"] = dict(self._planned_before)
        self._next_part: dict[str, int] = {}
        _write_meta(self.out_dir, self.run_meta)
        note_run_dir_written(self.out_dir)

    def plan(self, table_name: str, parts: int) -> None:
        """Record that this launch will write ``parts`` part files of ``table_name``, so a
        reader can tell a run that lost a case from one that never planned it."""
        planned = self._planned_before.get(table_name, 0) + parts
        self.run_meta["planned_parts"] = {**self.run_meta["planned_parts"], table_name: planned}
        _write_meta(self.out_dir, self.run_meta)

    def finish(self, *, launch: int = 0, launches: int = 1) -> None:
        """Every case of launch ``launch`` (from 0) of ``launches`` is written: the run is
        complete, unless an earlier launch of it stopped early. Before the last launch
        (``--runs N``) it still says running: a parent killed outright before the next one
        leaves a run that says it did not finish, not a complete one holding fewer launches
        than asked."""
        if launch + 1 < launches:
            return
        if "stopped_before" in self.run_meta:
            self.run_meta["status"] = PARTIAL
            self.run_meta["stopped_because"] = self.run_meta["stopped_before"]
        else:
            self.run_meta["status"] = COMPLETE
        _write_meta(self.out_dir, self.run_meta)

    def append(self, table_name: str, rows) -> Path:
        """Write one finished case as its own part file and return its path."""
        folder = self.out_dir / table_name
        folder.mkdir(exist_ok=True)
        if table_name not in self._next_part:
            existing = sorted(folder.glob("part-*.parquet"))
            self._next_part[table_name] = len(existing)
        index = self._next_part[table_name]
        self._next_part[table_name] += 1
        return write_table(folder / f"part-{index:05d}.parquet", table_name, rows, self.run_meta)


def _unreadable(path: Path, exc: Exception) -> XbenchError:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return XbenchError(
        f"{path} is not a readable Parquet file ({reason})",
        "it was cut short or is not xbench output: re-run that measurement, or move the file away",
    )


def schema_metadata(path: Path) -> dict:
    """The key-value metadata of a Parquet file's schema ({} without); a damaged file is
    refused in one line, as reading it would be."""
    try:
        return pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def _read_file(path: Path, table_name: str) -> pa.Table:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None
    meta = table.schema.metadata or {}
    found = meta.get(b"xbench.table", b"").decode()
    if found != table_name:
        raise XbenchError(
            f"{path} holds table {found or 'unknown'!r}, not {table_name!r}",
            "pass a results directory written by xbench",
        )
    version = int(meta.get(b"xbench.schema_version", b"0"))
    current = SCHEMA_VERSIONS[table_name]
    if version > current:
        raise XbenchError(
            f"{path} has schema v{version}, newer than this xbench (v{current})", "upgrade xbench"
        )
    while version < current:
        table = MIGRATIONS[table_name][version](table)
        version += 1
    schema = SCHEMAS[table_name]
    return table.select(schema.names).cast(schema)  # one schema, whatever version it came from


def table_files(paths, table_name: str) -> list[Path]:
    """All part files of ``table_name`` under the given run directories or files."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise XbenchError(
                f"results path {path} does not exist",
                "pass a directory written by xbench probe or xbench kernel",
            )
        if path.is_file():
            files.append(path)
        else:
            files.extend(sorted((path / table_name).glob("part-*.parquet")))
            files.extend(sorted(path.glob(f"*/{table_name}/part-*.parquet")))
    return files


def read_table(paths, table_name: str) -> pd.DataFrame:
    """Concatenate every part file of ``table_name`` under ``paths`` into one frame."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = [f for f in table_files(paths, table_name)]
    tables = [_read_file(f, table_name) for f in files]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return SCHEMAS[table_name].empty_table().to_pandas()
    return pa.concat_tables(tables).to_pandas()


def stored_config(run_dir, command: str, what: str, hint: str) -> dict:
    """The configuration a ``command`` run stored in ``run_dir`` (its run.json), to run it
    again; refused in one line (naming ``what``, with ``hint``) where there is none."""
    meta = read_run_meta(run_dir)
    if meta.get("command") != command or not meta.get("config"):
        raise XbenchError(f"{run_dir} holds no stored {what}", hint)
    return meta


def table_run_meta(path: Path) -> dict:
    """The run metadata a one-file table carries (``xbench.run``; {} without)."""
    return json.loads(schema_metadata(path).get(b"xbench.run", b"{}"))


def read_run_meta(path: Path) -> dict:
    """The run.json of a run directory, or of the run a part file belongs to ({} if none)."""
    path = Path(path)
    meta_file = path / "run.json" if path.is_dir() else path.parent.parent / "run.json"
    if not meta_file.exists():
        return {}
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise XbenchError(
            f"{meta_file} is not valid JSON ({str(exc).splitlines()[0]})",
            "restore it from a copy, or re-run that measurement",
        ) from None
    if not isinstance(meta, dict):
        raise XbenchError(f"{meta_file} is not a run.json object", "re-run that measurement")
    _check_run_meta(meta, meta_file)
    return meta


# The run.json fields xbench reads back, and what each must be (JSON's names)
RUN_FIELDS = {
    "run_id": (str, "a string"),
    "command": (str, "a string"),
    "status": (str, "a string"),
    "stopped_because": (str, "a string"),
    "hostname": (str, "a string"),
    "planned_parts": (dict, "an object of part counts by table"),
    "config": (dict, "an object"),
    "conditions": (dict, "an object"),
    "stopped_before": (str, "a string"),
    "gpus": (list, "a list"),
    "hosts": (list, "a list of host names"),
}


def _check_run_meta(meta: dict, meta_file: Path) -> None:
    """Refuse a run.json whose fields xbench reads are of another type (a hand edit, a
    tool's bug): each would fail later, deep inside compare, fit or report."""
    fix = "restore it from a copy, or re-run that measurement"
    for field, (kind, words) in RUN_FIELDS.items():
        value = meta.get(field)
        if value is not None and not isinstance(value, kind):
            raise XbenchError(f"{meta_file}: {field} is {json.dumps(value)[:40]}, not {words}", fix)
    status = meta.get("status")
    if status is not None and status not in (RUNNING, COMPLETE, PARTIAL):
        raise XbenchError(
            f"{meta_file}: status {status!r} is none of {RUNNING}, {COMPLETE}, {PARTIAL}", fix
        )
    for table, planned in (meta.get("planned_parts") or {}).items():
        if isinstance(planned, bool) or not isinstance(planned, int) or planned < 0:
            raise XbenchError(
                f"{meta_file}: planned_parts {table} is {json.dumps(planned)[:40]}, not a count",
                fix,
            )


def run_identity(path: Path, meta: dict | None = None) -> str:
    """What tells one stored result from another, in words: ``run RUN_ID`` for a run
    directory (the same at another path, and in a copy of the run), else ``file PATH``
    (resolved). ``meta``: the run.json already read, if it was."""
    path = Path(path)
    if meta is None:
        meta = read_run_meta(path) if path.is_dir() else {}
    run_id = meta.get("run_id")
    return f"run {run_id}" if run_id else f"file {path.resolve()}"


def refuse_repeats(results: list[Path], why: str) -> None:
    """One result given twice (by two paths, or as a copy of a run) is refused, naming both
    and ``why`` a second reading would mislead."""
    seen: dict[str, Path] = {}
    for path in results:
        same = run_identity(path)
        if same in seen:
            raise XbenchError(
                f"{seen[same]} and {path} are the same {same}: {why}", "pass each once"
            )
        seen[same] = path


def run_status(meta: dict) -> str:
    return meta.get("status", COMPLETE)


def run_dir_of(path: Path) -> Path:
    """The run directory a run directory or one of its part files belongs to."""
    path = Path(path)
    return path if path.is_dir() else path.parent.parent


def incompleteness(run_dir: Path) -> str | None:
    """Why the run in ``run_dir`` does not hold every case it planned, in a phrase; None
    when it does (or when it predates the status and the plan, which read as complete).

    Three ways: run.json says partial (interrupted, terminated, a rank died, a case hung);
    it still says running (the writer was killed outright, or is still at work); or a
    table has fewer part files than the run planned (one was deleted or lost)."""
    run_dir = Path(run_dir)
    meta = read_run_meta(run_dir)
    name = f"run {meta.get('run_id', run_dir)}"
    status = run_status(meta)
    if status == PARTIAL:
        return f"{name} is partial ({meta.get('stopped_because') or 'it stopped early'})"
    if status == RUNNING:
        return f"{name} never finished (run.json still says running: killed, or still at work)"
    for table_name, planned in sorted((meta.get("planned_parts") or {}).items()):
        found = len(list((run_dir / table_name).glob("part-*.parquet")))
        if found < planned:
            return f"{name} has {found} of the {planned} {table_name} part files it planned"
    return None
