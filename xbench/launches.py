"""Sweeps launched as configured: a probe or kernel sweep from the command line, or the one a
stored run was made with, run again (``xbench check``).

The ranks start here (a kernel sweep of one process runs in this one), each launch a fresh
process set appending to one run. Rank 0's events go to the caller's ``progress(label)``: a
context manager, one per launch, that yields the function taking them (a progress bar, or
nothing by default).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from xbench.errors import XbenchError


def _quiet(label: str):
    return nullcontext(lambda event: None)


def prepare_loop(cfg, warn=None) -> None:
    """The probe's compiled timing loop, built once here rather than racing in every rank;
    without it the Python loop times, with a warning (an error when --loop c asked for it)."""
    from xbench.fabric.cloop import LoopUnavailable, build_loops

    if cfg.loop == "python":
        return
    try:
        build_loops()
    except LoopUnavailable as exc:
        if cfg.loop == "c":
            raise XbenchError(str(exc), "use --loop python, or install an MPI with mpicc") from None
        if warn is not None:
            warn(f"compiled loop unavailable ({exc}); timing in Python")


def confirm_preset(cfg, log_path: Path) -> None:
    """What NCCL says it used, against what --fabric asked for."""
    if cfg.transport != "nccl" or cfg.backend != "nccl" or not cfg.fabric or not log_path.exists():
        return
    from xbench.fabric.presets import check_nccl_log

    ok, seen = check_nccl_log(log_path.read_text(errors="replace"), cfg.fabric)
    if not ok:  # the samples stand, but their fabric label has no evidence behind it
        what = f"NCCL reports {', '.join(sorted(seen))}" if seen else "NCCL named no transport"
        raise XbenchError(
            f"--fabric {cfg.fabric} asked for one path and {what} (see {log_path}); the "
            f"samples are in {log_path.parent} but their fabric label is not confirmed",
            "check the preset reached the ranks (NCCL_DEBUG=INFO), or label the run --fabric "
            "with what NCCL used",
        )


def launch_probe(cfg, np: int, *, hostfile=None, runs: int = 1, progress=_quiet):
    """The probe sweep on ``np`` launched ranks, ``runs`` times (separate process sets:
    placement and start-up state vary), then NCCL's log checked against --fabric. The
    caller has prepared the loop (``prepare_loop``), before anything was written."""
    from xbench.fabric.launch import STARTUP_S, run_ranks

    out_dir = Path(cfg.out_dir)
    config_path = out_dir / "probe-config.json"
    cfg.runs = runs
    for process_run in range(runs):
        cfg.process_run = process_run
        config_path.write_text(cfg.to_json())
        with progress("probe") as on_event:
            run_ranks(
                np,
                "xbench.probe.worker",
                config_path,
                on_event,
                cfg.timeout_s + STARTUP_S,
                bind=cfg.bind,
                hostfile=str(hostfile) if hostfile else None,
                launch_label=f" of launch {process_run + 1}/{runs}",
            )
    confirm_preset(cfg, out_dir / "launcher.log")


def run_kernel_sweep(cfg, *, progress=_quiet) -> None:
    """The kernel sweep as configured: in this process, or in launched ranks (--np 2,
    --runs N), each launch a fresh set of processes (pinned ranks) appending to one run."""
    if not cfg.launches_ranks:
        from xbench.events import CallbackSink
        from xbench.kernels.worker import run_sweep

        with progress("kernel") as on_event:
            run_sweep(cfg, CallbackSink(on_event))
        return
    from xbench.fabric.launch import run_ranks

    config_path = Path(cfg.out_dir) / "kernel-config.json"
    for process_run in range(cfg.runs):
        cfg.process_run = process_run
        config_path.write_text(cfg.to_json())
        with progress(f"kernel (launch {process_run + 1}/{cfg.runs})") as on_event:
            run_ranks(
                cfg.ranks,
                "xbench.kernels.worker",
                config_path,
                on_event,
                600.0,
                launch_label=f" of launch {process_run + 1}/{cfg.runs}",
            )


def rerun(baseline, command: str, run_id: str, out_dir, runs=None, *, progress=_quiet, warn=None):
    """The sweep a stored run (``command``: probe or kernel) was made with, run again into
    ``out_dir`` as ``run_id``: with its ranks, and its launches unless ``runs`` is given."""
    if command == "probe":
        from xbench.probe.runner import ProbeConfig

        cfg, np, launches = ProbeConfig.from_stored_run(
            baseline, out_dir=str(out_dir), run_id=run_id, tcp_interface=None, bind="core"
        )
        prepare_loop(cfg, warn)
        launch_probe(cfg, np, runs=runs or launches, progress=progress)
        return
    from xbench.kernels.worker import SweepConfig

    cfg = SweepConfig.from_stored_run(baseline, out_dir=str(out_dir), run_id=run_id)
    if runs:
        cfg.runs = runs
    run_kernel_sweep(cfg, progress=progress)
