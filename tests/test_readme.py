"""The README's examples run as written, from an empty folder: every ``xbench`` line of its
shell blocks that a laptop can run, and its Python blocks that need no tensors of one's own.

A line is a cluster's (``srun``, ``xbench slurm``, NCCL, NVSHMEM, FlashMLA, a GPU's
benchmark, a site's ``/shared`` folder or a named interface) or reads runs no example makes
(``results/base``, ``results/tonight``): those are listed, each with its reason, and the
test checks that nothing else is left out. The lines that read what an earlier example made
(``profiles/here.toml`` from the fit) run in order with it, in the slow test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from conftest import BIN, ROOT

README = ROOT / "README.md"
# what keeps a line off a laptop, by the words that say so
CLUSTER = {
    "srun": "a Slurm cluster's launcher",
    "slurm": "writes and submits a Slurm job",
    "nccl": "NCCL between GPUs",
    "nvshmem": "NVSHMEM between GPUs",
    "flashmla": "FlashMLA on a GPU",
    "eth0": "names an interface this machine may not have",
    "/shared": "a site's shared folder",
    "results/base": "a baseline run no example makes (a name for yours)",
    "results/tonight": "tonight's run, no example makes it (a name for yours)",
    "h100-ib.toml": "the cluster's fit, which the slurm examples make",
}
# what an example made that later ones read: they run in order with it (the slow test)
MADE_BY_EXAMPLES = ("profiles/here.toml", "results/p", "results/k")


def _blocks(lang: str) -> list[str]:
    """The README's fenced blocks in ``lang``, as written."""
    blocks, current, inside = [], [], None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if inside is None:
                inside, current = line[3:].strip(), []
            else:
                if inside == lang:
                    blocks.append("\n".join(current))
                inside = None
            continue
        if inside is not None:
            current.append(line)
    return blocks


def _commands() -> list[list[str]]:
    """Every xbench command of the shell blocks in order, a line's ``&&`` parts apart,
    continuation lines joined, comments dropped."""
    commands = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "xbench":
                    commands.append(words)
    return commands


def _why_not_here(words: list[str]) -> str | None:
    text = " ".join(words)
    return next((why for word, why in CLUSTER.items() if word in text), None)


def _run(words: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run(
        [str(BIN / "xbench"), *words[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )


def test_every_line_left_out_is_a_clusters_or_reads_a_run_no_example_makes():
    laptop = [w for w in _commands() if _why_not_here(w) is None]
    assert len(laptop) >= 15, laptop  # the examples are found, not silently none
    commands = {w[1] for w in laptop}
    assert {"probe", "kernel", "fit", "decide", "validate", "simulate"} <= commands


def test_the_readme_examples_that_stand_alone_run_as_written(tmp_path):
    """decide and simulate on shipped profiles and scenarios, and the Python API's block,
    from an empty folder."""
    alone = [
        w
        for w in _commands()
        if _why_not_here(w) is None
        and w[1] in ("decide", "simulate")
        and not any(made in " ".join(w) for made in MADE_BY_EXAMPLES)
    ]
    assert len(alone) >= 10, alone
    for words in alone:
        r = _run(words, tmp_path)
        assert r.returncode == 0, (words, r.stderr)
        assert "Traceback" not in r.stderr, (words, r.stderr)
    (python,) = [b for b in _blocks("python") if "xbench.load_profile" in b]
    r = subprocess.run(
        [sys.executable, "-c", python + "\nprint(d.choice, len(table))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    choice, rows = r.stdout.split()
    assert choice in ("route", "fetch", "local") and int(rows) == 12


@pytest.mark.slow
@pytest.mark.mpi  # starts MPI: the examples' probe, kernel and validate launch ranks
def test_the_readme_examples_run_in_order_as_written(tmp_path):
    """Every laptop line, in the README's order, in one empty folder: the probe and kernel
    runs, the fit that makes profiles/here.toml, and what reads it."""
    for words in _commands():
        if _why_not_here(words) is not None:
            continue
        r = _run(words, tmp_path)
        assert r.returncode == 0, (words, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (words, r.stderr)
    assert (tmp_path / "profiles" / "here.toml").exists()
