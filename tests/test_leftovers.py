"""What a killed MPI job leaves (processes, shared-memory segments, Hydra's topology file)
is gone once xbench's launch returns, and only what no process holds is removed."""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BIN

from xbench.fabric.orphans import _is_subreaper, adopting_orphans, children, parents
from xbench.mpi_leftovers import candidates, held_paths, remove_orphans

QUICK = ["--samples", "3", "--warmups", "1", "--min-sample-time", "2ms"]


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process below ``pid`` now (pid reuse cannot fool a later
    look: the start time differs)."""
    tree = parents()
    found, todo = {}, [pid]
    while todo:
        for child, _ in tree.get(todo.pop(), []):
            todo.append(child)
            found[child] = _start_time(child)
    return found


def test_only_the_files_no_process_holds_are_removed(tmp_path):
    """Names as MPICH, UCX and Hydra give them: the one nothing holds goes; one held open,
    one mapped (its creator between shm_open and its own removal), another user's and a
    name of another program stay."""
    tag = f"xbtest{os.getpid()}"
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm here")
    orphan, held_open, mapped, foreign = (
        shm / f"mpich_shar_tmp{tag}a",
        shm / f"mpich_shm_{tag}_0",
        shm / f"ucx_shm_posix_{tag}",
        shm / f"other_{tag}",
    )
    hydra = Path("/tmp") / f"hydra_hwloc_xmlfile_{tag}"
    made = [orphan, held_open, mapped, foreign, hydra]
    holder = None
    try:
        for path in made:
            path.write_bytes(b"\0" * 4096)
        holder = subprocess.Popen(  # holds one open, as Hydra's proxy holds its file
            [
                sys.executable,
                "-c",
                "import sys, time; f = open(sys.argv[1]); time.sleep(600)",
                str(held_open),
            ]
        )
        with open(mapped, "r+b") as f:
            mapping = mmap.mmap(f.fileno(), 4096)  # mapped, descriptor closed
        deadline = time.monotonic() + 30
        while str(held_open) not in held_paths():
            assert time.monotonic() < deadline, "the holder never opened its file"
            time.sleep(0.05)
        ours = set(candidates())
        assert {orphan, held_open, mapped, hydra} <= ours and foreign not in ours
        removed = set(remove_orphans())
        assert {orphan, hydra} <= removed
        assert not {held_open, mapped, foreign} & removed
        assert held_open.exists() and mapped.exists() and foreign.exists()
        assert not orphan.exists() and not hydra.exists()
        mapping.close()
        if os.getuid() == 0:  # another user's orphan is not this user's to remove
            os.chown(mapped, 65534, 65534)
            assert mapped not in remove_orphans() and mapped.exists()
    finally:
        if holder:
            holder.kill()
            holder.wait()
        for path in made:
            path.unlink(missing_ok=True)


def test_a_launch_waits_for_the_orphans_of_what_it_started_and_stops_those_that_stay():
    """Inside the block this process adopts what its children leave running (as Hydra's
    proxy outlives mpiexec); at its end it has waited for the short one and killed the one
    that stays; the children it had before are left alone, and it stops adopting."""
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = time.monotonic()
        with adopting_orphans(linger_s=1.0) as adoption:
            assert before.pid in adoption.known
            # each parent exits at once, leaving its child (sleep) to be adopted
            for seconds in ("0.3", "600"):
                subprocess.run(["sh", "-c", f"sleep {seconds} & echo $! > /dev/null"], check=True)
            adopted = children() - adoption.known
            assert len(adopted) == 2, adopted
        assert time.monotonic() - started < 1.0 + 5.0 + 5.0  # waited, then stopped, not hung
        assert not any(Path(f"/proc/{pid}").exists() for pid in adopted)
        assert len(adoption.stopped) == 1  # the 600 s sleep, not the short one
        assert before.poll() is None, "a child from before the block was touched"
        assert not _is_subreaper()
    finally:
        before.kill()
        before.wait()


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_a_job_whose_ranks_are_killed_leaves_no_process_and_no_file(tmp_path):
    """Both ranks killed (an OOM kill, a stop from outside): Hydra's proxy outlived mpiexec
    and then left its topology file in /tmp, every time. Now no process of the job runs
    once xbench has returned, and nothing of the names an MPI job removes itself is left
    that no process holds."""
    out = tmp_path / "run"
    env = {**os.environ, "XBENCH_FAULT": "hang:0:1"}
    argv = [
        str(BIN / "xbench"),
        "probe",
        "--np",
        "2",
        "--sizes",
        "8B,16B",
        *QUICK,
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    job: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        # case 0 done: the ranks hang before case 1, past MPI_Init
        while not (out / "launcher.log").exists() or len(job := _descendants(proc.pid)) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the ranks never started: {job}"
            time.sleep(0.1)
        time.sleep(2.0)
        job = _descendants(proc.pid)
        ranks = [
            pid for pid in job if _cmdline(pid).split(" ")[0].endswith(Path(sys.executable).name)
        ]
        assert len(ranks) == 2, {pid: _cmdline(pid) for pid in job}
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            for pid in [proc.pid, *job]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, err
    alive = {pid: _cmdline(pid) for pid, start in job.items() if _start_time(pid) == start}
    assert not alive, f"still running after xbench returned: {alive}"
    unheld = set(map(str, candidates())) - held_paths()
    assert not unheld, f"left behind: {sorted(unheld)}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""
