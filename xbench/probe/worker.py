"""Entry point of ranks launched by ``xbench probe``: ``python -m xbench.probe.worker CONFIG``.

The order is a C benchmark's: MPI_Init, then the buffers, then everything else. The rank's
host buffers are mapped and written before the runner loads pyarrow and the rest (see
:func:`xbench.fabric.transport.reserve_host_buffers` for why).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from xbench.ranks import dump_stacks_when_stopped, start_mpi
from xbench.results.stopping import failures_stop_the_job


def reserve_buffers(config_text: str) -> None:
    """Map this run's host buffers now, from the configuration alone."""
    from xbench.fabric.transport import reserve_host_buffers
    from xbench.probe.patterns import SweepSpec, buffer_plan

    data = json.loads(config_text)
    if data.get("device", "host") == "host":
        reserve_host_buffers(buffer_plan(SweepSpec.from_dict(data["sweep"])))


PRESET_MARK = "XBENCH_PRESET_APPLIED"


def apply_preset(preset: dict) -> None:
    """The --fabric preset into this process's environment before MPI_Init: UCX (under the
    MPI), NCCL and NVSHMEM read these when they initialise, so later is too late for UCX."""
    if preset:
        os.environ.update(preset)
        os.environ[PRESET_MARK] = "before MPI_Init"


def main(argv: list[str]) -> int:
    text = Path(argv[0]).read_text()
    apply_preset(json.loads(text).get("preset_env") or {})
    MPI = start_mpi()
    dump_stacks_when_stopped()  # after MPI_Init: Open MPI sets its own SIGTERM handler

    reserve_buffers(text)
    from xbench.events import JsonLinesSink, NullSink
    from xbench.probe.runner import ProbeConfig, run_probe

    cfg = ProbeConfig.from_json(text)
    sink = JsonLinesSink() if MPI.COMM_WORLD.Get_rank() == 0 else NullSink()
    with failures_stop_the_job(sink, cfg.out_dir):
        run_probe(cfg, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
