"""Entry point of ranks launched by ``xbench probe``: ``python -m xbench.probe.worker CONFIG``."""

from __future__ import annotations

import sys
from pathlib import Path

from xbench.probe.events import JsonLinesSink, NullSink
from xbench.probe.runner import ProbeConfig, run_probe


def main(argv: list[str]) -> int:
    cfg = ProbeConfig.from_json(Path(argv[0]).read_text())
    from mpi4py import MPI

    sink = JsonLinesSink() if MPI.COMM_WORLD.Get_rank() == 0 else NullSink()
    run_probe(cfg, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
