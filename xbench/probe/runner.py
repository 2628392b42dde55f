"""The probe as it runs inside the MPI ranks.

Every rank calls :func:`run_probe` with the same configuration. For each rank pair and
each case, the pair warms up, calibrates the iterations per sample so a sample lasts at
least ``min_sample_s``, then takes ``samples`` samples separated by barriers. Rank 0
writes each finished case to the store before the next case starts.

A watchdog thread on every rank ends the rank (exit 124) when one case runs longer than
``timeout`` seconds, so a hung peer turns into an error instead of a hang; the launcher
then takes the other ranks down.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import time
from dataclasses import dataclass, field

from xbench.errors import XbenchError
from xbench.fabric.device_probe import PUT_SCOPES
from xbench.fabric.launch import thread_level_name
from xbench.fabric.registry import (
    DEVICE_INITIATED,
    INITIATORS,
    TRANSPORTS,
    infer_fabric,
    make_transport,
)
from xbench.fabric.transport import Pair
from xbench.fabric.watchdog import EXIT_TIMEOUT, Watchdog, write_hang_report
from xbench.host import cpu_placement
from xbench.probe.patterns import Case, SweepSpec, buffer_plan, osu_counts, plan_cases
from xbench.ranks import mpi_library
from xbench.results.stopping import stop_rank

# What a configuration may name (the probe command's options offer the same)
BINDINGS = ("core", "socket", "numa", "hwthread", "none")  # mpiexec's -bind-to
DEVICES = ("host", "cuda")
BACKENDS = ("nccl", "gloo")
LOOPS = ("auto", "c", "python")
OSU_PATTERNS = ("latency", "bandwidth", "bibw")  # osu_latency, osu_bw, osu_bibw


@dataclass
class ProbeConfig:
    """Everything the ranks need; written as JSON by the parent, read by the worker."""

    out_dir: str
    run_id: str
    sweep: SweepSpec = field(default_factory=SweepSpec)
    transport: str = "mpi"
    fabric: str | None = None
    pairs: str = "0-1"
    samples: int = 10
    warmups: int = 2
    min_sample_s: float = 0.01
    max_iters: int = 1_000_000
    timeout_s: float = 120.0
    loop: str = "auto"
    tcp_interface: str | None = None
    launcher: str = "mpiexec"
    bind: str = "core"  # what the launch pinned ranks to ("by launcher" under srun/mpirun)
    device: str = "host"  # host or cuda buffers (mpi --device cuda: CUDA-aware MPI)
    backend: str = "nccl"  # nccl transport: nccl on GPUs, gloo on CPUs
    initiator: str = "host"  # who posts the messages: the host, or GPU kernels (nvshmem)
    put_scope: str | None = None  # --initiator device: who issues a put (None: a warp)
    preset_env: dict = field(default_factory=dict)  # the --fabric preset applied to every rank
    process_run: int = 0  # which launch of the ranks this is (--runs N)
    runs: int = 1  # how many launches the run takes (--runs N)
    # Fixed-count sampling (OSU's method) instead of calibrated samples: every sample runs
    # exactly `iterations` iterations, after `skip` untimed ones; osu_compat takes both from
    # OSU's own tables per pattern and size.
    iterations: int | None = None
    skip: int = 0
    osu_compat: bool = False

    def __post_init__(self):
        """The rules a configuration keeps wherever it comes from (the command line, a stored
        run's JSON, a baseline rerun by xbench check), each refused in one line."""
        if self.osu_compat and self.iterations is not None:
            raise XbenchError(
                "--osu-compat sets OSU's iteration counts itself",
                "pass --osu-compat or --iterations",
            )
        if self.skip and self.iterations is None:
            raise XbenchError(
                f"--skip {self.skip} without --iterations: skip goes with a fixed iteration count",
                "e.g. --iterations 1000 --skip 10",
            )
        if self.iterations is not None and self.iterations < 1 or self.skip < 0:
            raise XbenchError(
                f"--iterations {self.iterations} --skip {self.skip}: need iterations >= 1 and skip >= 0",
                "e.g. --iterations 1000 --skip 10 (skip goes with --iterations)",
            )
        beyond_osu = set(self.sweep.patterns) - set(OSU_PATTERNS)
        if self.osu_compat and beyond_osu:
            raise XbenchError(
                f"--osu-compat covers latency, bandwidth and bibw (osu_latency, osu_bw, osu_bibw), "
                f"not {', '.join(sorted(beyond_osu))}",
                "pass -p latency,bandwidth with --osu-compat, or --iterations N for any pattern",
            )
        if self.samples < 1 or self.warmups < 0:
            raise XbenchError(
                "--samples must be at least 1, --warmups at least 0", "pass positive counts"
            )
        if self.transport not in TRANSPORTS:
            raise XbenchError(
                f"unknown transport {self.transport!r}", f"pick one of {', '.join(TRANSPORTS)}"
            )
        for name, value, allowed in (
            ("binding", self.bind, (*BINDINGS, "by launcher")),
            ("device", self.device, DEVICES),
            ("backend", self.backend, BACKENDS),
            ("loop", self.loop, LOOPS),
            ("initiator", self.initiator, INITIATORS),
        ):
            if value not in allowed:
                raise XbenchError(f"unknown {name} {value!r}", f"pick one of {', '.join(allowed)}")
        check_initiator(self.initiator, self.transport, self.sweep.patterns, self.put_scope)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProbeConfig:
        data = json.loads(text)
        return cls(sweep=SweepSpec.from_dict(data.pop("sweep")), **data)

    @classmethod
    def from_stored_run(
        cls, run_dir, *, out_dir: str, run_id: str, tcp_interface: str | None, bind: str
    ) -> tuple[ProbeConfig, int, int]:
        """(config, ranks, launches) of the probe run stored in ``run_dir``, run again into
        ``out_dir`` as ``run_id`` (``xbench check``, ``probe --config-from``)."""
        from xbench.results.store import stored_config

        meta = stored_config(
            run_dir, "probe", "probe configuration", "pass a run directory written by xbench probe"
        )
        cfg = cls.from_json(json.dumps(meta["config"]))
        cfg.out_dir, cfg.run_id, cfg.process_run = out_dir, run_id, 0
        cfg.runs = 1  # the launch decides how many launches follow (launch_probe)
        cfg.tcp_interface = tcp_interface
        # who binds: a site launcher now, or xbench's launch as stored (or as asked, when the
        # stored run was itself started by a site launcher)
        if bind == "by launcher" or cfg.bind == "by launcher":
            cfg.bind = bind
        return cfg, int(meta.get("ranks") or 2), int(meta["config"].get("process_run", 0)) + 1


def check_initiator(initiator: str, transport: str, patterns, put_scope=None) -> None:
    """What GPU kernels post here: NVSHMEM's puts, as a ping-pong and a stream (no gather,
    no both-ways stream), each ping-pong put issued at ``put_scope``; every transport is
    posted by the host too."""
    if put_scope is not None and put_scope not in PUT_SCOPES:
        raise XbenchError(
            f"unknown put scope {put_scope!r}", f"pick one of {', '.join(PUT_SCOPES)}"
        )
    if initiator != "device":
        if put_scope is not None:
            raise XbenchError(
                "--put-scope says who issues a GPU kernel's put, and --initiator host posts "
                "from the host",
                "pass --transport nvshmem --initiator device with it, or leave it out",
            )
        return
    if transport not in DEVICE_INITIATED:
        raise XbenchError(
            f"--initiator device with --transport {transport}: only NVSHMEM's puts are "
            "posted by the GPU here; the others are posted by the host",
            "pass --transport nvshmem --initiator device, or leave --initiator at host",
        )
    other = set(patterns) - {"latency", "bandwidth", "rtt"}
    if other:
        raise XbenchError(
            f"--initiator device times latency, bandwidth and rtt, not {', '.join(sorted(other))}",
            "pass -p latency,bandwidth,rtt with --initiator device",
        )


def check_transport_options(transport: str, tcp_interface: str | None, backend: str) -> None:
    """Refuse an option the transport never reads, as --put-scope without --initiator
    device: ``--tcp-interface eth0`` without ``--transport tcp`` measured MPI's own path
    under a TCP-minded command line. Checked on what the command line gave (a stored run
    rerun by check keeps its own)."""
    if tcp_interface is not None and transport != "tcp":
        raise XbenchError(
            f"--tcp-interface names the interface the tcp transport listens on, and "
            f"--transport {transport} opens no socket of its own",
            "pass --transport tcp with it, or leave it out",
        )
    if backend != "nccl" and transport != "nccl":
        raise XbenchError(
            f"--backend {backend} picks the nccl transport's library, and this is "
            f"--transport {transport}",
            f"pass --transport nccl --backend {backend}, or leave --backend out",
        )


def parse_pairs(text: str, size: int) -> list[tuple[int, int]]:
    """``0-1`` (default), ``all`` (every pair), or ``0-1,0-2,2-3``."""
    if text == "all":
        return [(a, b) for a in range(size) for b in range(a + 1, size)]
    pairs = []
    for item in text.split(","):
        try:
            a, b = (int(x) for x in item.split("-"))
        except ValueError:
            raise XbenchError(f"bad rank pair {item!r}", "write pairs as 0-1,0-2 or all") from None
        if a == b or not (0 <= a < size and 0 <= b < size):
            raise XbenchError(
                f"rank pair {item!r} does not fit {size} ranks",
                "use distinct ranks below the number of ranks",
            )
        pairs.append((a, b))
    return pairs


def uses_gpu_buffers(cfg) -> bool:
    """Whether the messages leave and land in GPU memory: CUDA buffers, NVSHMEM's heap, or
    NCCL on GPUs (gloo's are host memory)."""
    return (
        cfg.device == "cuda"
        or cfg.transport == "nvshmem"
        or (cfg.transport == "nccl" and cfg.backend == "nccl")
    )


def refuse_nvlink_from_host_memory(cfg) -> None:
    """``--fabric nvlink`` with host buffers: they never cross NVLink, so the samples would
    be shared memory's (or a network's) under NVLink's name, and a fit would make them the
    profile's NVLink. Refused before any rank starts."""
    if cfg.fabric == "nvlink" and not uses_gpu_buffers(cfg):
        raise XbenchError(
            f"--fabric nvlink with --transport {cfg.transport} on {cfg.device} buffers: host "
            "memory never crosses NVLink, so the samples would be another path's under its name",
            "probe GPU buffers (--device cuda, or --transport nccl or nvshmem) on GPUs joined "
            "by NVLink, or name the path host memory takes (--fabric shm), or leave --fabric out",
        )


def _my_gpu(cfg, world) -> dict | None:
    """This rank's GPU in the topology format, when the transport uses one."""
    if not uses_gpu_buffers(cfg):
        return None
    from xbench.fabric.gpu import local_gpu, torch_module
    from xbench.host import gpu_by_uuid, gpu_topology

    gpus = gpu_topology()
    if not gpus:
        return None
    props = torch_module().cuda.get_device_properties(local_gpu(world))
    return gpu_by_uuid(gpus, str(getattr(props, "uuid", "")))


def _pair_labels(pairs_text: str, size: int, hosts, rank_gpus) -> dict:
    from xbench.fabric.topology import label_pair

    try:
        pairs = parse_pairs(pairs_text, size)
    except XbenchError:
        return {}
    return {
        f"{a}-{b}": label_pair(
            {"host": hosts[a], "gpu": rank_gpus[a]}, {"host": hosts[b], "gpu": rank_gpus[b]}
        )
        for a, b in pairs
    }


def _refuse_a_fabric_not_crossed(fabric: str | None, labels: dict, rank_gpus: list) -> None:
    """``--fabric nvlink`` where a pair's messages cannot cross NVLink: host memory (no
    GPU buffers), one GPU, or two GPUs NVML finds no NVLink between. The samples would be
    shared memory's or PCIe's under NVLink's name, and a fit would make them the profile's
    NVLink. (GPUs on two hosts pass: a multi-node NVLink domain joins them.)"""
    if fabric != "nvlink":
        return
    for pair, label in labels.items():
        a, b = (rank_gpus[int(rank)] for rank in pair.split("-"))
        if label == "nvlink" or (label == "inter-node" and a and b):
            continue
        why = {
            "same-GPU": "both its ranks use one GPU",
            "same-node-pcie": "NVML finds no NVLink between its GPUs",
        }.get(label, "no GPU of its ranks is known to NVML")
        raise XbenchError(
            f"--fabric nvlink: pair {pair}'s messages cannot cross NVLink: {why}; its samples "
            "would be another path's under NVLink's name",
            "probe GPUs joined by NVLink with --device cuda (or --transport nccl or nvshmem), "
            "or name the path they take (--fabric shm), or leave --fabric out",
        )


def _inject_fault(world_rank: int, case_index: int) -> None:
    """Test hook: ``XBENCH_FAULT=kill:RANK:CASE``, ``hang:RANK:CASE`` or ``raise:RANK:CASE``
    (an exception nothing catches) breaks a rank on purpose."""
    spec = os.environ.get("XBENCH_FAULT")
    if not spec:
        return
    kind, rank, case = spec.split(":")
    if int(rank) == world_rank and int(case) == case_index:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            time.sleep(10**6)
        elif kind == "raise":
            raise RuntimeError(f"fault injected on rank {world_rank} before case {case_index}")


def _fixed_counts(case: Case, cfg: ProbeConfig) -> tuple[int, int] | None:
    if cfg.osu_compat:
        return osu_counts(case)
    return (cfg.iterations, cfg.skip) if cfg.iterations else None


def _measure(case: Case, transport, pair: Pair, cfg: ProbeConfig) -> list[tuple[int, bool, float]]:
    """(iterations, warm-up?, elapsed seconds) of every sample of one case, on this rank."""
    comm = pair.comm
    out = []
    fixed = _fixed_counts(case, cfg)
    if fixed is not None:  # OSU's method: skip, then a fixed count, one stream per sample
        iters, skip = fixed
        comm.Barrier()
        if skip:  # stored as a warm-up sample; the first timed sample follows it directly
            out.append((skip, True, case.run(transport, skip)))
        for s in range(cfg.samples):
            if s:
                comm.Barrier()
            out.append((iters, False, case.run(transport, iters)))
        return out
    first = case.first_iters()
    comm.Barrier()
    elapsed = case.run(transport, first)
    out.append((first, True, elapsed))
    # The initiator's calibration decides the iterations for both ranks.
    wanted = math.ceil(cfg.min_sample_s * first / max(elapsed, 1e-9)) if pair.initiator else 0
    iters = comm.bcast(max(1, min(cfg.max_iters, case.max_iters or cfg.max_iters, wanted)), root=0)
    for s in range(cfg.warmups + cfg.samples):
        comm.Barrier()
        out.append((iters, s < cfg.warmups, case.run(transport, iters)))
    return out


def _overhead_rows(transport, base: dict) -> list[dict]:
    """The timed loop's own per-iteration cost, so a reader can subtract or judge it."""
    rows = []
    for s in range(5):
        iters = 100_000
        elapsed = transport.empty_loop(iters)
        rows.append(
            {
                **base,
                "pattern": "overhead",
                "size_bytes": 0,
                "iterations": iters,
                "sample": s,
                "warmup": False,
                "metric": "loop_overhead",
                "value": elapsed / iters * 1e6,
                "unit": "us",
            }
        )
    return rows


@dataclass
class _Rank:
    """What every step of one rank's sweep reads: the configuration, the world, this rank,
    every rank's host, rank 0's sink, and the watchdog that ends a rank whose step hangs."""

    cfg: ProbeConfig
    world: object
    rank: int
    hosts: list
    sink: object
    watchdog: Watchdog | None = None
    transport: object = None  # this rank's end of the pair being measured, if any

    def timed_out(self, label: str) -> None:
        """The watchdog's verdict: a report of where this rank waited (its stacks, the
        connection's state), then the one-line error naming it."""
        cfg = self.cfg
        said = f"case '{label}' did not finish within {cfg.timeout_s:g} s on rank {self.rank}"
        lines = [f"{said} ({self.hosts[self.rank]}, pid {os.getpid()})"]
        state = self.transport.state() if self.transport is not None else ""
        if state:
            lines.append(f"{self.transport.name} transport: {state}")
        where = write_hang_report(os.path.join(cfg.out_dir, f"hang-rank{self.rank}.txt"), lines)
        self.fatal(
            f"{said}: a peer rank hung or died, or the fabric stalled; finished cases are in {cfg.out_dir}, what rank {self.rank} waited in is {where} (raise --timeout if the case is just slow)",
            EXIT_TIMEOUT,
        )

    def fatal(self, message: str, code: int) -> None:
        """Stop this rank now (the launcher takes the others down)."""
        stop_rank(self.rank, self.sink, message, code, self.cfg.out_dir)


def _open_run(r: _Rank, MPI, rank_gpus: list, placements: list):
    """Rank 0 checks the launch and the pairs and opens the run's store; the verdict is
    shared, so every rank stops together on bad input. Returns (pairs, store: rank 0's)."""
    cfg, size = r.cfg, r.world.Get_size()
    problem, pairs, store = None, [], None
    if r.rank == 0:  # the store's modules (pandas, pyarrow) here only: the others start sooner
        from xbench.results.metadata import run_metadata
        from xbench.results.store import RunStore

        try:
            if size < 2:
                raise XbenchError(
                    f"the probe needs at least 2 ranks, got {size}", "launch with -n 2 or more"
                )
            pairs = parse_pairs(cfg.pairs, size)
            labels = _pair_labels(cfg.pairs, size, r.hosts, rank_gpus)
            _refuse_a_fabric_not_crossed(cfg.fabric, labels, rank_gpus)
            meta = run_metadata(
                cfg.run_id,
                "probe",
                hosts=r.hosts,
                ranks=size,
                mpi_library=mpi_library(MPI),
                mpi_vendor="{} {}".format(
                    MPI.get_vendor()[0], ".".join(map(str, MPI.get_vendor()[1]))
                ),
                mpi4py=__import__("mpi4py").__version__,
                mpi_thread_level=thread_level_name(MPI),
                launcher=cfg.launcher,
                rank_gpus=rank_gpus,
                # where each rank of this launch ran (a launch's figures move with it)
                rank_placement={str(cfg.process_run): placements},
                pair_labels=labels,
                preset_env=cfg.preset_env,
                # UCX's settings only count when set before MPI_Init; say when they were
                preset_applied=os.environ.get(
                    "XBENCH_PRESET_APPLIED", "after MPI_Init" if cfg.preset_env else None
                ),
                config=json.loads(cfg.to_json()),
            )
            store = RunStore(cfg.out_dir, meta)
        except XbenchError as exc:
            problem = str(exc)
    problem, pairs = r.world.bcast((problem, pairs), root=0)
    if problem:
        if r.rank == 0:
            r.sink.error(problem)
        raise SystemExit(2)
    return pairs, store


def _set_up_world(r: _Rank, plan) -> None:
    """The --fabric preset, then the transport's world-level set-up, on every rank alike
    (watched: a rendezvous that never completes is a hang like any other)."""
    from xbench.fabric.registry import transport_class

    cfg = r.cfg
    os.environ.update(cfg.preset_env)
    try:
        with r.watchdog.watching(f"{cfg.transport} set-up"):
            transport_class(cfg.transport, cfg.device, cfg.initiator).setup_world(
                r.world, cfg, plan
            )
    except XbenchError as exc:
        r.fatal(str(exc), 2)
    except ImportError as exc:
        r.fatal(f"transport {cfg.transport} cannot load: {exc}", 2)


def _connect(r: _Rank, pair_comm, a: int, b: int, plan):
    """This rank's end of pair (a, b), connected: (pair, transport, the columns every row of
    the pair carries)."""
    cfg, hosts = r.cfg, r.hosts
    pair = Pair(
        comm=pair_comm,
        me=0 if r.rank == a else 1,
        world_ranks=(a, b),
        hosts=(hosts[a], hosts[b]),
    )
    fabric = cfg.fabric or infer_fabric(cfg.transport, pair.same_host, cfg.device)
    try:
        with r.watchdog.watching(f"connect {a}-{b}"):
            transport = make_transport(
                cfg.transport,
                pair,
                plan,
                loop=cfg.loop,
                tcp_interface=cfg.tcp_interface,
                seed=a * 1000 + b,
                device=cfg.device,
                backend=cfg.backend,
                initiator=cfg.initiator,
            )
            transport.connect()
    except XbenchError as exc:
        r.fatal(str(exc), 2)
    base = {
        "run_id": cfg.run_id,
        "transport": transport.name,
        "device": transport.device,
        "fabric": fabric,
        "fabric_inferred": cfg.fabric is None,
        "loop": transport.loop,
        "rank_a": a,
        "rank_b": b,
        "host_a": hosts[a],
        "host_b": hosts[b],
        "pair_class": "intra-node" if pair.same_host else "inter-node",
        "process_run": cfg.process_run,
    }
    return pair, transport, base


def _case_rows(case: Case, samples, base: dict) -> list[dict]:
    """One row per sample of a case, as the initiator stores it."""
    fields = {
        k: getattr(case, k) for k in ("rows", "return_bytes", "window", "blocks", "block_bytes")
    }
    return [
        {
            **base,
            **fields,
            "pattern": case.pattern,
            "size_bytes": case.size_bytes,
            "iterations": it,
            "sample": i,
            "warmup": warm,
            "metric": case.metric,
            "value": case.value(el, it),
            "unit": case.unit,
        }
        for i, (it, warm, el) in enumerate(samples)
    ]


def _run_case(r: _Rank, case: Case, index: int, a: int, b: int, ends, store, last: bool) -> None:
    """One case of pair (a, b) on every rank: started together once rank 0 has written the
    last one, measured by the pair's ranks (``ends``: (pair, transport, base) there, None
    elsewhere), its rows gathered and written by rank 0 before the next case."""
    label = f"{a}-{b} {case.label}"
    if r.rank == 0:
        r.sink.case_started(index, label)
    # Nobody starts a case before rank 0 has written the last one and announced this one:
    # every finished case is on disk first, and a rank that dies now is reported against
    # the right case.
    with r.watchdog.watching(f"start {label}"):
        r.world.Barrier()
    rows = None
    if ends is not None:
        pair, transport, base = ends
        _inject_fault(r.rank, index)
        with r.watchdog.watching(label):
            try:
                samples = _measure(case, transport, pair, r.cfg)
            except XbenchError as exc:
                r.fatal(str(exc), 2)
            except (ConnectionError, OSError) as exc:
                r.fatal(f"case '{case.label}' failed between ranks {a} and {b}: {exc}", 3)
        if pair.initiator:
            rows = _case_rows(case, samples, base)
            if last:
                rows += _overhead_rows(transport, base)
    with r.watchdog.watching(f"collect {case.label}"):
        gathered = r.world.gather(rows, root=0)
    if r.rank == 0:
        from xbench.results.schema import PROBE_SAMPLES

        rows = next(g for g in gathered if g)
        store.append(PROBE_SAMPLES, rows)
        measured = sorted(
            row["value"] for row in rows if not row["warmup"] and row["pattern"] == case.pattern
        )
        r.sink.case_done(index, case.label, measured[len(measured) // 2], case.unit)


def run_probe(cfg: ProbeConfig, sink, comm=None) -> None:
    """Run the sweep on every rank; rank 0 writes results and drives ``sink``."""
    from mpi4py import MPI

    from xbench.fabric.registry import transport_class
    from xbench.results.schema import PROBE_SAMPLES  # (pyarrow: not at the CLI's start)

    world = comm or MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    r = _Rank(cfg, world, world.Get_rank(), hosts, sink)
    placements = world.allgather(cpu_placement())
    pairs, store = _open_run(r, MPI, world.allgather(_my_gpu(cfg, world)), placements)
    r.watchdog = Watchdog(cfg.timeout_s, r.timed_out)
    plan = buffer_plan(cfg.sweep)
    _set_up_world(r, plan)
    cases = plan_cases(cfg.sweep)
    if cfg.device == "cuda":  # packing device buffers needs a device copy the C loop lacks
        cases = [c for c in cases if c.mode != "packed"]
    total = len(pairs) * len(cases)
    if r.rank == 0:
        store.plan(PROBE_SAMPLES, total)  # one part file a case
        sink.start(total, cfg.out_dir, "c" if cfg.loop != "python" else "python")
    index = 0
    for a, b in pairs:
        member = r.rank in (a, b)
        pair_comm = world.Split(0 if member else MPI.UNDEFINED, 0 if r.rank == a else 1)
        ends = _connect(r, pair_comm, a, b, plan) if member else None
        r.transport = ends[1] if ends else None  # what a hang report asks for its state
        for case in cases:
            _run_case(r, case, index, a, b, ends, store, case is cases[-1])
            index += 1
        if ends is not None:
            r.transport = None
            ends[1].close()
            ends[1].return_buffers()
        if pair_comm != MPI.COMM_NULL:
            pair_comm.Free()
    world.Barrier()
    transport_class(cfg.transport, cfg.device, cfg.initiator).teardown_world(world)
    if r.rank == 0:
        store.finish(launch=cfg.process_run, launches=cfg.runs)
        sink.finish()
