"""Starting ranks: detect a site launcher, or re-launch under the local ``mpiexec``.

Started by srun, mpirun or mpiexec (an MPMD line included) the process is already a rank
and runs the probe in place. Started from a shell, ``xbench probe --np N`` launches N
ranks of ``python -m xbench.probe.worker`` under ``mpiexec``, reads rank 0's event lines
for the progress bar, and stops the whole job (its own process group) when no event
arrives for too long, so a hung rank can never hang the command.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from xbench.errors import RankFailure, XbenchError, require_installed
from xbench.events import EVENT_PREFIX
from xbench.fabric.orphans import LINGER_S, adopting_orphans, parents
from xbench.fabric.watchdog import EXIT_TIMEOUT
from xbench.host import usable_cores
from xbench.mpi_leftovers import remove_orphans
from xbench.ranks import (
    RANK_VARIABLES,
    STACKS_ON_STOP,
    append_stopped_stacks,
    stacks_file_prefix,
)

# What launched ranks get beyond a command's --timeout to report their start: their
# imports and MPI_Init, slower on a loaded machine than any case's own wait.
STARTUP_S = 60.0

# Variables that a process manager sets in each rank it starts.
RANK_ENV = (
    *RANK_VARIABLES,
    "PMI_SIZE",
    "MV2_COMM_WORLD_RANK",
    "PMI_FD",
    "MPI_LOCALRANKID",
)


def inside_launcher(environ=None) -> bool:
    """True when a process manager (mpiexec, mpirun, srun with PMI/PMIx) started us as one
    of the ranks. The only task of an srun step is not: it is where a user (``srun -n1
    xbench probe --np 2``, on a cluster whose srun gives every step a PMI) or xbench slurm's
    kernel step starts ranks from, as ``srun --mpi=none`` already did; taken for a rank, it
    was refused as a world of one."""
    env = os.environ if environ is None else environ
    if srun_task(env) and _step_tasks(env) == 1:
        return False
    return any(name in env for name in RANK_ENV)


def launched_ranks(environ=None) -> int:
    """How many ranks the process manager that started this process started (1 where none
    did, or it did not say): PMI's size (MPICH's mpiexec, srun's PMI-2), Open MPI's, else
    the tasks of the srun step."""
    env = os.environ if environ is None else environ
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return (_step_tasks(env) or 1) if srun_task(env) else 1


def srun_task(environ=None) -> bool:
    """A task of an srun step (srun sets both in every task's environment)."""
    env = os.environ if environ is None else environ
    return "SLURM_STEP_ID" in env and "SLURM_PROCID" in env


def _step_tasks(env) -> int | None:
    """The tasks of this srun step, where srun said (None where it did not)."""
    try:
        return int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "")
    except ValueError:
        return None


def srun_tasks_without_pmi(environ=None) -> int:
    """The tasks of the srun step this process is one of, when srun gave them no PMI
    (``srun --mpi=none``): each would start its own mpiexec, whose ranks then wait for the
    step's busy nodes forever. 0 when that is not the case (one task, or a PMI, or no srun)."""
    env = os.environ if environ is None else environ
    if not srun_task(env) or inside_launcher(env):
        return 0
    tasks = _step_tasks(env) or 1
    return tasks if tasks > 1 else 0


def refuse_srun_without_pmi(environ=None) -> None:
    """A one-line refusal, before anything is launched or written, where this process is one
    of several tasks of an srun step that gave them no PMI."""
    tasks = srun_tasks_without_pmi(environ)
    if tasks:
        raise XbenchError(
            f"this is one of {tasks} tasks of an srun step without a PMI (srun --mpi=none?): "
            "each would start its own mpiexec and wait for the step's nodes forever",
            "launch the ranks with srun --mpi=pmi2 (MPICH) or --mpi=pmix (Open MPI) and no "
            "--np, or run xbench with --np outside srun (xbench slurm writes the script)",
        )


def refuse_launched_ranks(command: str, once: str) -> None:
    """A one-line refusal where this process is one of several ranks a launcher started
    (mpiexec -n 2, srun -n 2) and ``command`` starts its own ranks: each would run the whole
    command into one --out (one refused there once the other had begun). ``once``: the
    command run once."""
    ranks = launched_ranks()
    if ranks > 1:
        raise XbenchError(
            f"this is one of {ranks} ranks {launcher_name()} started; xbench {command} starts "
            "its own ranks",
            f"run it once: {once}",
        )


def outside_slurm(environ=None) -> dict:
    """The environment for an mpiexec this process starts from inside an srun task: without
    Slurm's variables and the PMI srun gave this task. With them, Hydra and Open MPI's
    launcher take the job for theirs and ask srun for a step inside this one, which waits
    for this step's own CPUs until the time limit (``srun -n1 xbench kernel --np 2``);
    without them they start the ranks here, as outside Slurm, and each rank reads its own
    local rank, not this task's SLURM_LOCALID. A PMIx setting of the user's (PMIX_MCA_*)
    stays. Elsewhere the environment as it is."""
    env = dict(os.environ if environ is None else environ)
    if not srun_task(env):
        return env
    return {
        name: value
        for name, value in env.items()
        if not name.startswith(("SLURM_", "PMI_"))
        and not (name.startswith("PMIX_") and not name.startswith("PMIX_MCA_"))
        and name not in RANK_ENV
    }


def launcher_name(environ=None) -> str:
    env = os.environ if environ is None else environ
    if srun_task(env):
        # the PMI plugin srun gave the step (srun sets it in every task's environment)
        plugin = env.get("SLURM_MPI_TYPE")
        return f"srun --mpi={plugin}" if plugin else "srun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun (Open MPI)"
    return "mpiexec"


def find_mpi_tool(name: str, variable: str) -> str | None:
    """``$variable`` (a name on PATH or a path), else ``name`` beside this Python (the
    MPI wheel installed into this environment), else ``name`` on PATH."""
    explicit = os.environ.get(variable)
    if explicit:
        return shutil.which(explicit)
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    return shutil.which(name)


def find_mpiexec() -> str | None:
    return find_mpi_tool("mpiexec", "XBENCH_MPIEXEC")


def mpiexec_missing() -> tuple[str, str]:
    """Why :func:`find_mpiexec` found none, and the fix: a variable naming no executable
    is named, not advised."""
    explicit = os.environ.get("XBENCH_MPIEXEC")
    if explicit:
        return (
            f"XBENCH_MPIEXEC={explicit} names no executable here",
            "point it at an mpiexec or mpirun on PATH (or a path to one), or unset it",
        )
    return (
        "no mpiexec found",
        "pip install mpich, set XBENCH_MPIEXEC, or start xbench under srun/mpirun",
    )


def require_mpiexec() -> None:
    """Refused in one line where a command would launch ranks and no mpiexec is there, or no
    mpi4py (each rank's first import): called before the command writes its run, which
    would otherwise hold a run that never started and refuse the same --out once the fix is
    in."""
    if find_mpiexec() is None:
        raise XbenchError(*mpiexec_missing())
    require_installed("mpi4py")


@dataclass
class LaunchResult:
    returncode: int
    stalled: bool = False
    error: str | None = None  # the message rank 0 reported, if any
    error_exit: int | None = None  # the code rank 0 said it exits with, after that message
    last_started: str | None = None
    finished_cases: int = 0
    events: list = field(default_factory=list)


def _mpiexec_command(np: int, module: str, args: list[str], log_path: Path, bind, hostfile):
    """The launcher's command line: binding, hosts (the user's file rewritten in this
    launcher's dialect, beside the log) and ``python -m module args`` on np ranks."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise XbenchError(*mpiexec_missing())
    hydra = _is_hydra(mpiexec)
    # Open MPI binds to cores by default (at 2 ranks), so its none must be said; Hydra's
    # default is none
    if hydra:
        binding = ["-bind-to", bind] if bind != "none" else []
    else:
        binding = ["--bind-to", bind]
    if hostfile:  # the user's file, in whichever dialect, rewritten in this launcher's
        converted = Path(log_path).with_name("hosts")
        converted.write_text(render_hostfile(parse_hostfile(Path(hostfile).read_text()), hydra))
        hosts = ["-f", str(converted)] if hydra else ["--hostfile", str(converted)]
    else:
        hosts = []
    # more local ranks than cores only when asked (the CLI refuses it otherwise): Open MPI
    # then needs telling too, as it counts one slot a core
    over = ["--oversubscribe"] if not hydra and not hostfile and np > usable_cores() else []
    cmd = [mpiexec, *binding, *over, *hosts, "-n", str(np), sys.executable, "-u", "-m", module]
    return cmd + args


def _take_event(result: LaunchResult, line: str, on_event) -> None:
    """One of rank 0's events: kept, counted, and handed on."""
    event = json.loads(line[len(EVENT_PREFIX) :])
    result.events.append(event)
    if event["event"] == "case_started":
        result.last_started = event["label"]
    elif event["event"] == "case_done":
        result.finished_cases += 1
    elif event["event"] == "error":
        result.error, result.error_exit = event["message"], event.get("exit_code")
    on_event(event)


# Rank 0 exits as it reports an error (stop_rank), and the launcher should then end the
# other ranks at once. Hydra sometimes misses that exit (the order of its socket-close and
# waitpid events: pmodels/mpich#5930, #7058), and a peer hung in a case then runs on until
# the stall timeout, a minute past --timeout. Ending the job is then xbench's.
AFTER_ERROR_S = 5.0


def _watch(proc, log, result: LaunchResult, on_event, stall_timeout_s: float) -> None:
    """Read the ranks' stdout to its end: events to ``on_event``, anything else to the log.
    The job is stopped when no event comes for ``stall_timeout_s`` (``result.stalled``), or
    when the launcher still runs ``AFTER_ERROR_S`` after rank 0 reported the error it ends on."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + stall_timeout_s
    try:
        while True:
            if time.monotonic() > deadline and proc.poll() is None:
                if result.error is None:
                    result.stalled = True
                else:
                    log.write(
                        f"xbench: the launcher was still running {AFTER_ERROR_S:g} s after "
                        "rank 0 reported its error and exited; stopped the job\n"
                    )
                    log.flush()
                _stop_group(proc)
                break
            if not sel.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(EVENT_PREFIX):
                _take_event(result, line, on_event)
                wait = stall_timeout_s if result.error is None else AFTER_ERROR_S
                deadline = time.monotonic() + wait
            else:
                log.write(line)
    except KeyboardInterrupt:
        _stop_group(proc)
        raise
    finally:
        sel.close()


def launch_worker(
    np: int,
    module: str,
    args: list[str],
    log_path: Path,
    on_event,
    stall_timeout_s: float,
    bind: str = "core",
    hostfile: str | None = None,
) -> LaunchResult:
    """Run ``python -m module args`` on ``np`` local ranks; feed rank 0's events to ``on_event``.

    ``bind`` is passed as Hydra's ``-bind-to`` (core, socket, none): pinned ranks do not
    migrate between cores mid-sample.
    """
    cmd = _mpiexec_command(np, module, args, log_path, bind, hostfile)
    result = LaunchResult(returncode=0)
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        log_start = log.tell()
        # the local ranks write their stacks when stopped to files of their own, added to
        # this log rank by rank once the job has ended
        stacks = f"{socket.gethostname()}:{stacks_file_prefix(log_path)}"
        try:
            # the launch ends once what the launcher left running (Hydra's proxy) has
            # ended too, before the ranks' stacks and files are gathered
            with adopting_orphans() as adoption:
                proc = subprocess.Popen(
                    cmd,
                    env={**outside_slurm(), STACKS_ON_STOP: stacks},
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    text=True,
                    bufsize=1,
                )
                _watch(proc, log, result, on_event, stall_timeout_s)
                result.returncode = proc.wait()
        finally:
            if adoption.stopped:
                log.write(
                    f"xbench: stopped {len(adoption.stopped)} process(es) of the job still "
                    f"running {LINGER_S:g} s after the launcher exited\n"
                )
            append_stopped_stacks(log, log_path)
            _remove_leftovers(log)
    if result.returncode != 0 and result.error is None:
        result.error = rank_error(log_path, log_start)
    return result


def _remove_leftovers(log) -> None:
    """What a rank or launcher killed inside MPI_Init left (this job's, or an earlier one's
    no process holds), named in the log."""
    removed = remove_orphans()
    if removed:
        names = ", ".join(str(path) for path in removed)
        log.write(f"xbench: removed what a killed MPI job left: {names}\n")


def run_ranks(
    np: int,
    module: str,
    config_path: Path,
    on_event,
    stall_timeout_s: float,
    *,
    bind: str = "core",
    hostfile: str | None = None,
    launch_label: str = "",
) -> LaunchResult:
    """Launch ``python -m module config_path`` on ``np`` ranks and watch it to the end.

    The one place that turns a failed launch into a one-line :class:`RankFailure` that says
    what happened and where the finished cases and the log are. ``on_event`` receives rank
    0's events (a progress bar, or nothing). The log is ``launcher.log`` beside the config.
    """
    from xbench.results.store import mark_partial  # (pandas: not at the CLI's start)

    out_dir = config_path.parent
    log_path = out_dir / "launcher.log"
    refuse_srun_without_pmi()
    # Ctrl-C or SIGTERM here: the command's error mapping marks the run, naming which
    result = launch_worker(
        np, module, [str(config_path)], log_path, on_event, stall_timeout_s, bind, hostfile
    )
    finished = any(event.get("event") == "finish" for event in result.events)
    if result.returncode == 0 and not result.stalled and not result.error and finished:
        return result
    if result.returncode == 0 and not result.stalled and not result.error:
        # a launcher that ran something else, or no ranks at all, and exited 0
        mark_partial(out_dir, "the launcher exited without xbench's ranks finishing")
        raise RankFailure(
            f"the launcher ({find_mpiexec()}) exited 0, but xbench's rank 0 never reported "
            f"finishing ({len(result.events)} event(s) from it): it started no ranks, or not "
            f"xbench's; {result.finished_cases} finished case(s){launch_label} are in {out_dir}",
            f"see {log_path}; XBENCH_MPIEXEC, if set, must name an MPI launcher (mpiexec)",
        )
    mark_partial(
        out_dir,
        "a case hung" if result.stalled else (result.error or f"exit {result.returncode}"),
    )
    kept = f"{result.finished_cases} finished case(s){launch_label} are in {out_dir}"
    if result.error:
        code = 124 if EXIT_TIMEOUT in (result.returncode, result.error_exit) else 3
        raise RankFailure(result.error, f"see {log_path}", exit_code=code)
    if result.stalled and not result.events:
        raise RankFailure(
            f"the ranks never started: no word from them {stall_timeout_s:g} s after the "
            f"launcher ({find_mpiexec()}) began; stopped it; {kept}",
            f"see {log_path}; check the launcher runs (mpiexec -n 2 hostname), and "
            "XBENCH_MPIEXEC, if set, names one",
        )
    if result.stalled:
        raise RankFailure(
            f"no progress from the ranks for {stall_timeout_s:g} s during "
            f"'{result.last_started}'; stopped the job; {kept}",
            f"see {log_path}",
        )
    refused = launcher_refusal(log_path)
    if refused:
        raise RankFailure(*refused)
    where = f" during '{result.last_started}'" if result.last_started else " before the first case"
    raise RankFailure(
        f"a rank died{where} (mpiexec exit {result.returncode}); {kept}", f"see {log_path}"
    )


def parse_hostfile(text: str) -> list[tuple[str, int | None]]:
    """(host, slots) per line of a hosts file in MPICH's (``host[:slots]``) or Open MPI's
    (``host slots=N [max_slots=M]``) dialect; comments and blank lines skipped."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name, _, count = words[0].partition(":")
        slots = None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots":
                count = value
        try:
            slots = int(count) if count else None
        except ValueError:
            raise XbenchError(
                f"hosts file line {number} ({raw.strip()!r}): slots is not a whole number",
                "write host:N or host slots=N",
            ) from None
        if not name or (slots is not None and slots < 1):
            raise XbenchError(
                f"hosts file line {number} ({raw.strip()!r}) names no host or no slots",
                "write host:N or host slots=N",
            )
        hosts.append((name, slots))
    if not hosts:
        raise XbenchError("the hosts file names no host", "write one host[:slots] per line")
    return hosts


def render_hostfile(hosts: list[tuple[str, int | None]], hydra: bool) -> str:
    """The same hosts in MPICH Hydra's dialect (``host:N``) or Open MPI's (``host slots=N``)."""
    if hydra:
        return "".join(f"{h}:{n}\n" if n else f"{h}\n" for h, n in hosts)
    return "".join(f"{h} slots={n}\n" if n else f"{h}\n" for h, n in hosts)


def rank_error(log_path: Path, start: int = 0) -> str | None:
    """The first one-line error a rank other than 0 wrote to the log since ``start``.

    A rank that fails on its own (say, a missing GPU noticed before rank 0 gets there)
    writes ``xbench: error on rank N: ...`` and exits; the launcher then kills rank 0 before
    it can report, so the message is taken from the log instead.
    """
    try:
        with open(log_path, errors="replace") as log:
            log.seek(start)
            for line in log:
                if line.startswith("xbench: error on rank "):
                    return line[len("xbench: error on ") :].strip()
    except OSError:
        return None
    return None


# Open MPI's mpiexec starts no rank as root unless told to, and says so in a paragraph
# (containers on GPU nodes and CI runners often run as root)
OPEN_MPI_ROOT = "has detected an attempt to run as root"


def launcher_refusal(log_path: Path) -> tuple[str, str] | None:
    """(problem, fix) where the launcher itself refused to start the ranks."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    if OPEN_MPI_ROOT in text:
        return (
            "Open MPI's mpiexec refuses to start ranks as root",
            "run as a user, or where root is the norm (a container, CI) export "
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
        )
    return None


@lru_cache(maxsize=4)
def _is_hydra(mpiexec: str) -> bool:
    """MPICH's Hydra (``-f hosts``, ``-bind-to``) or Open MPI's mpirun (``--hostfile``, ``--bind-to``)."""
    try:
        text = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return True
    return "Open MPI" not in text and "OpenRTE" not in text


def _outside_group(pid: int) -> list[int]:
    """The processes below ``pid`` in process groups of their own, where the launcher's
    group's signal does not reach them: Open MPI's prterun puts each rank in one, and
    MPICH's Hydra its proxy and each rank. Read from /proc; none where it cannot be read."""
    tree = parents()
    found, todo = [], [pid]
    while todo:
        for child, group in tree.get(todo.pop(), []):
            todo.append(child)
            if group != pid:
                found.append(child)
    return found


def _stop_group(proc: subprocess.Popen) -> None:
    """Terminate the launcher and every rank it started. Ranks in groups of their own are
    told first, so that each writes its stacks to the log (``dump_stacks_when_stopped``)
    before its launcher takes it down."""
    alone = _outside_group(proc.pid)
    for pid in alone:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 2.0
    while alone and time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in alone):
        time.sleep(0.05)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def thread_level_name(MPI) -> str:
    """The MPI thread level the ranks were given (recorded: it changes small-message latency)."""
    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    return names.get(MPI.Query_thread(), "unknown")
