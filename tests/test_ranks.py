"""What a rank xbench launches leaves on its node when it is stopped before MPI_Finalize."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import BIN

RANK = """
import json, os, signal
from xbench.ranks import start_mpi

MPI = start_mpi()
with open("/proc/self/maps") as maps:
    paths = {line.split(maxsplit=5)[5].strip() for line in maps if " /dev/shm/" in line}
report = {"library": MPI.Get_library_version()[:40], "mapped": sorted(paths)}
with open(f"rank{MPI.COMM_WORLD.Get_rank()}.json", "w") as out:  # mpiexec mixes stdouts
    json.dump(report, out)
MPI.COMM_WORLD.Barrier()
os.kill(os.getpid(), signal.SIGKILL)  # as scancel's end or a stall's stop: no MPI_Finalize
"""


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_ranks_killed_after_mpi_init_leave_no_segment_for_a_later_job_to_hang_on(tmp_path):
    """MPICH 5 (the wheel's 5.0.2) names its node's segment after the job
    (/dev/shm/mpich_shm_*) and removes it in MPI_Finalize only: ranks killed before it left
    the segment, and two ranks of a later job of the same name spun in MPI_Init on it for
    good (a CI run hung so under Slurm, whose job ids restarted at 1 in each test cluster).
    xbench's ranks remove its name once every rank is past MPI_Init, so nothing a rank of
    theirs maps under /dev/shm is left by name (4.2.3 unnamed its segments itself). Open MPI
    keeps its per-rank segments named, for peers that open them later: not checked."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    r = subprocess.run(
        [str(BIN / "mpiexec"), "-n", "2", str(BIN / "python"), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    said = r.stdout + r.stderr[-2000:]
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == 2, said
    mapped = {path for rank in ranks for path in rank["mapped"]}
    if not ranks[0]["library"].startswith("MPICH"):
        return  # both ranks got through start_mpi, which asked Open MPI for no barrier
    assert mapped, f"{ranks[0]['library']} mapped nothing under /dev/shm: {said}"
    assert all(path.endswith(" (deleted)") for path in mapped), said
    names = {path.removesuffix(" (deleted)") for path in mapped}
    assert not [name for name in names if os.path.exists(name)], said
