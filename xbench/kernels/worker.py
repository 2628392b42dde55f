"""The sweep of ``xbench kernel``: in the command's own process, or in launched ranks.

In-process (``--np 1``, one launch) is the default and the only way on a GPU box without an
MPI launcher. ``--runs N`` launches the sweep N times into one run (``process_run``), as
pyperf repeats processes: on a shared VM a launch's placement moves every case together by
10-30 %, which no number of samples inside one launch can average out. ``--np 2`` runs it
in two pinned ranks in the layout ``xbench validate`` uses (each rank holds the inputs;
the rank that is not timing waits in MPI, resident on the other core; cases alternate the
timing rank), so a profile fitted from it describes attention as validate's paths run it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from xbench.core.sweep_rules import LAUNCHES, check_sweep
from xbench.errors import XbenchError
from xbench.ranks import mpi_library

LAYOUTS = {1: "alone", 2: "peer waiting in MPI"}


@dataclass
class SweepConfig:
    out_dir: str
    run_id: str
    model: str
    backend: str
    device: str
    launch: str
    kernels: list
    rows: list
    chunks: list
    dtype: str = "bf16"
    sparse: bool = False
    heads: int | None = None
    block_size: int = 64
    samples: int = 5
    warmups: int = 1
    rounds: int = 1
    min_sample_s: float = 0.02
    ceilings: bool = True
    threads: int | None = None
    cpu_attention: str = "auto"
    in_context: bool | None = None  # merge/gather/splice after an attention; None: on CPUs
    ranks: int = 1
    process_run: int = 0
    runs: int = 1
    # attention also timed after these idle times (us); a stored config without it had none
    idle_us: list = field(default_factory=list)
    # merges also timed after these waits (us); a stored config without it had none
    merge_wait_us: list = field(default_factory=list)

    def __post_init__(self):
        check_sweep(self.dtype, self.rounds, self.samples, self.ranks, self.runs)
        if self.launch not in LAUNCHES:
            raise XbenchError(f"unknown launch {self.launch!r}", f"pick {' or '.join(LAUNCHES)}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_stored_run(cls, run_dir, *, out_dir: str, run_id: str) -> SweepConfig:
        """The kernel sweep stored in ``run_dir``, run again into ``out_dir`` as ``run_id``
        (``xbench check``, ``kernel --config-from``)."""
        from xbench.errors import XbenchError
        from xbench.kernels import cpu_bf16
        from xbench.results.store import stored_config

        meta = stored_config(
            run_dir,
            "kernel",
            "kernel sweep configuration",
            "pass a run directory written by xbench kernel (0.2.0 or later)",
        )
        cfg = cls(**meta["config"])
        cfg.out_dir, cfg.run_id, cfg.process_run = out_dir, run_id, 0
        try:
            cpu_bf16.choose_path(cfg.cpu_attention)
        except ValueError as exc:
            raise XbenchError(str(exc), "re-run the baseline on a machine that has it") from None
        return cfg

    @classmethod
    def from_json(cls, text: str) -> SweepConfig:
        return cls(**json.loads(text))

    @property
    def launches_ranks(self) -> bool:
        """Whether the sweep runs in launched ranks (else in the command's own process)."""
        return self.ranks > 1 or self.runs > 1

    @property
    def timed_in_context(self) -> bool:
        return self.in_context if self.in_context is not None else self.device == "cpu"

    def total_steps(self, cases: int) -> int:
        return cases * self.rounds + int(self.ceilings and self.process_run == 0)


def sweep_conditions(cfg: SweepConfig, allocator: str | None) -> dict:
    """What the sweep's times depend on beyond the host (stored in run.json, then the profile)."""
    import torch

    from xbench.kernels import cpu_bf16

    on_cpu = cfg.device == "cpu"
    return {
        "backend": cfg.backend,
        "device": cfg.device,
        "cpu_attention": cpu_bf16.active_path() if on_cpu and cfg.dtype == "bf16" else None,
        "torch_threads": torch.get_num_threads(),
        "kernel_layout": LAYOUTS.get(cfg.ranks, f"{cfg.ranks} ranks"),
        "kernel_context": "after attention" if cfg.timed_in_context else "back to back",
        "allocator": allocator,
    }


def _open_store(cfg: SweepConfig, comm, preset, allocator):
    """The run's store with its metadata (rank 0, or the only process)."""
    import torch

    from xbench.results.metadata import run_metadata
    from xbench.results.store import RunStore

    extra = {}
    if comm is not None:
        from mpi4py import MPI

        extra["mpi_library"] = mpi_library(MPI)
    return RunStore(
        cfg.out_dir,
        run_metadata(
            cfg.run_id,
            "kernel",
            device=cfg.device,
            device_name=torch.cuda.get_device_name(0) if cfg.device.startswith("cuda") else None,
            backend=cfg.backend,
            launch=cfg.launch,
            model=preset.name,
            torch_threads=torch.get_num_threads(),
            ranks=comm.Get_size() if comm is not None else 1,
            runs=cfg.runs,
            conditions=sweep_conditions(cfg, allocator),
            config=json.loads(cfg.to_json()),
            **extra,
        ),
    )


def _ceilings(cfg: SweepConfig, sink, store) -> None:
    """The copy and matmul ceilings, measured once a run (rank 0, step 0)."""
    from xbench.kernels.bench import ceiling_rows, measure_ceilings
    from xbench.results.schema import KERNEL_SAMPLES

    sink.case_started(0, "ceilings")
    rows = ceiling_rows(
        measure_ceilings(cfg.device, cfg.dtype), cfg.run_id, cfg.backend, cfg.device, cfg.dtype
    )
    store.append(KERNEL_SAMPLES, _stamped(rows, cfg))
    sink.case_done(0, "ceilings", float("nan"), "")


def _timed_rows(cfg: SweepConfig, case, preset, round_: int) -> list[dict]:
    """One case timed in this process: its samples as rows."""
    from xbench.kernels.bench import backend_plan, sample_rows, time_case, timed_launch

    timings = time_case(
        case,
        cfg.backend,
        cfg.device,
        preset.softmax_scale,
        samples=cfg.samples,
        warmups=cfg.warmups,
        min_sample_s=cfg.min_sample_s,
        seed=1000 * round_ + 100_000 * cfg.process_run,
        launch=cfg.launch,
    )
    return sample_rows(
        case,
        timings,
        cfg.run_id,
        cfg.backend,
        cfg.device,
        preset.name,
        round_,
        launch=timed_launch(cfg.device, cfg.launch),
        plan=backend_plan(cfg.backend) if case.kernel == "partial_attention" else "",
    )


def run_sweep(cfg: SweepConfig, sink, comm=None) -> None:
    """Time every case ``cfg.rounds`` times; rank 0 (or the only process) writes the samples."""
    import torch

    from xbench.core.models import get_model
    from xbench.host import steady_allocator
    from xbench.kernels import cpu_bf16
    from xbench.kernels.bench import plan_cases, timing_turns
    from xbench.results.schema import KERNEL_SAMPLES

    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    allocator = steady_allocator() if cfg.device == "cpu" else None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cpu_bf16.choose_path(cfg.cpu_attention)
    preset = get_model(cfg.model)
    cases = plan_cases(
        preset,
        cfg.kernels,
        cfg.rows,
        cfg.chunks,
        cfg.dtype,
        cfg.sparse,
        cfg.heads,
        cfg.block_size,
        in_context=cfg.timed_in_context,
        idle_us=cfg.idle_us,
        merge_wait_us=cfg.merge_wait_us,
    )
    turns = timing_turns(cases)
    store = None
    if rank == 0:
        store = _open_store(cfg, comm, preset, allocator)
        store.plan(KERNEL_SAMPLES, cfg.total_steps(len(cases)))  # one part file a step
        sink.start(cfg.total_steps(len(cases)), cfg.out_dir, "python")
    step = 0
    if cfg.ceilings and cfg.process_run == 0:
        if rank == 0:
            _ceilings(cfg, sink, store)
        step += 1
        if comm is not None:
            comm.Barrier()
    for round_, (index, case) in ((r, ic) for r in range(cfg.rounds) for ic in enumerate(cases)):
        label = case.label if cfg.rounds == 1 else f"{case.label}, round {round_ + 1}/{cfg.rounds}"
        if rank == 0:
            sink.case_started(step, label)
        # Cases alternate the timing rank, so each shape is timed from both cores over the
        # rounds; the other rank waits in the broadcast below, as validate's peer waits.
        timer = (turns[index] + round_ + cfg.process_run) % size
        rows = _timed_rows(cfg, case, preset, round_) if rank == timer else None
        if comm is not None:
            rows = comm.bcast(rows, root=timer)
        if rank == 0:
            store.append(KERNEL_SAMPLES, _stamped(rows, cfg, timer))
            values = sorted(r["value"] for r in rows if not r["warmup"])
            sink.case_done(step, label, values[len(values) // 2] if values else float("nan"), "us")
        step += 1
    if rank == 0:
        store.finish(launch=cfg.process_run, launches=cfg.runs)
        sink.finish()


def _stamped(rows: list[dict], cfg: SweepConfig, timer: int = 0) -> list[dict]:
    return [{**r, "process_run": cfg.process_run, "timed_by": timer} for r in rows]


def main(argv: list[str]) -> int:
    from xbench.ranks import dump_stacks_when_stopped, start_mpi
    from xbench.results.stopping import failures_stop_the_job

    MPI = start_mpi()  # at the level the probe's and validate's ranks run at
    dump_stacks_when_stopped()  # after MPI_Init: Open MPI sets its own SIGTERM handler

    from xbench.events import JsonLinesSink, NullSink

    cfg = SweepConfig.from_json(Path(argv[0]).read_text())
    comm = MPI.COMM_WORLD
    sink = JsonLinesSink() if comm.Get_rank() == 0 else NullSink()
    with failures_stop_the_job(sink, cfg.out_dir):
        run_sweep(cfg, sink, comm)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
