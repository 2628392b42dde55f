"""The ranks of ``xbench validate``: run route, fetch and local for real between two ranks
(the comparison with the model's predictions is ``xbench.validate.summary``).

One rank is the requester A, the other the holder B; they swap roles sample by sample
(both hold the same data), so every option is timed from both cores. For each (rows b,
chunk c):

- route: A sends b*h query rows (S_q); B attends its resident chunk and returns the partial
  output in the query dtype plus fp32 LSE as one message (S_o); A merges it with its own
  local partial.
- fetch: A asks for the chunk; B gathers the selected (scattered) pages into one packed
  message (S_kv); A splices them into free pages of its cache (re-rotating RoPE), attends
  them and merges with its local partial.
- local: the blocks are already at A: A attends them (T_c).

Every path's output is checked against attention over all tokens on one instance. KV
sets are rotated iteration by iteration (total above twice the last-level cache), as in
``xbench kernel``, so the compute the model was fitted on and the compute timed here see
the same memory behaviour. Each rank uses one torch thread (two ranks share the cores).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from xbench.core.sweep_rules import check_repeats, resolve_launch
from xbench.errors import XbenchError
from xbench.ranks import mpi_library
from xbench.validate.calls import CaseCalls

OPTIONS = ("route", "fetch", "local")
# The phases each option's time is split into, as the model splits it (core.parts.phase_times).
PHASES = {
    "route": ("send", "attention", "return", "merge"),
    "fetch": ("transfer", "move", "attention", "merge"),
    "local": ("attention",),
}
PHASE_COLUMNS = ("send", "attention", "return", "merge", "transfer", "move")
# Phase boundaries are stamped on both ranks with one clock: perf_counter is
# CLOCK_MONOTONIC, shared by every process of a host, and validate's ranks share one.
now = time.perf_counter
# How a fetch leaves the holder: "pages", one message per selected page straight from its
# cache (n_seg = pages, nothing packed: the model's T_splice); "packed", gathered into a
# staging buffer and sent as one message (n_seg = 1, T_move = gather + splice).
FETCH_LAYOUTS = ("pages", "packed")


@dataclass
class ValidateConfig:
    out_dir: str
    run_id: str
    rows: tuple = (1, 4, 16)
    chunks: tuple = (256, 1024, 4096)
    heads: int = 16
    dim: int = 576
    v_dim: int = 512
    dtype: str = "bf16"
    local_tokens: int = 256
    block_size: int = 64
    fetch_layout: str = "pages"
    samples: int = 3  # per case and round
    warmups: int = 2  # per case and round: one per requesting rank
    rounds: int = 3  # passes over all cases (interleaved: drift hits every case alike)
    min_sample_s: float = 0.02
    threads: int = 1
    cpu_attention: str = "auto"
    process_run: int = 0  # which launch of the ranks this is (--runs)
    runs: int = 1
    timeout_s: float = 300.0
    fabric: str | None = None
    device: str = "cpu"  # where the tensors and kernels are: cpu or cuda
    launch: str = "eager"  # the compute calls: replayed from CUDA graphs, or eager (calls.py)
    wire: str = "host"  # how messages cross: a name of xbench.validate.wire.WIRES
    scale: float = 1 / math.sqrt(576)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        """The rules a configuration keeps wherever it comes from (the command line, the
        JSON the ranks read)."""
        check_repeats(self.dtype, self.rounds, self.samples, self.runs)
        self.launch = resolve_launch(self.device, self.launch)
        if self.fetch_layout not in FETCH_LAYOUTS:
            raise XbenchError(
                f"unknown --fetch-layout {self.fetch_layout!r}",
                f"pick {' or '.join(FETCH_LAYOUTS)}",
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ValidateConfig:
        data = json.loads(text)
        data["rows"], data["chunks"] = tuple(data["rows"]), tuple(data["chunks"])
        return cls(**data)


class Peer:
    """Both ranks' state for one (rows, chunk) case."""

    def __init__(self, cfg: ValidateConfig, rows: int, chunk: int, comm, sets: int):
        import torch

        from xbench.validate.wire import make_wire

        self.cfg, self.rows, self.chunk, self.comm = cfg, rows, chunk, comm
        self.wire = make_wire(cfg.wire, comm, cfg.device)
        self.calls = CaseCalls(graphs=cfg.launch == "graph")
        # what crosses the wire lives where the wire moves it from and into (NVSHMEM's
        # symmetric heap; the tensors themselves on the other wires)
        place = self.wire.place
        dev = torch.device(cfg.device)
        self.rank = comm.Get_rank()
        self.other = 1 - self.rank
        self.requester = 0  # which rank asks; samples alternate it (see run_validate)
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]
        self.dt = dt
        pages = -(-chunk // cfg.block_size)
        self._draw_sets(sets, pages, dev, place)
        self._free_pages(sets, pages, dev)
        self._landings(dev, place)
        self.req = bytearray(1)  # a fetch's request: one byte through host MPI
        self.stamps: list[float] = []  # phase boundaries of the iterations being timed
        self._local_partials()

    def _draw_sets(self, sets: int, pages: int, dev, place) -> None:
        """The holder's cache, the pages selected of it, the requester's local KV and the
        query, per set: drawn for the first FRESH_SETS (identical on both ranks: same
        seeds), copies of them after (more memory to rotate over)."""
        import torch

        from xbench.kernels import DensePages
        from xbench.kernels.bench import FRESH_SETS

        cfg, rows, chunk, dt, bs = self.cfg, self.rows, self.chunk, self.dt, self.cfg.block_size
        self.sets = []
        self.chosen_pages: list = []  # each fresh set's selected pages, on the host
        for s in range(min(sets, FRESH_SETS)):  # identical on both ranks: same seeds
            gen = torch.Generator().manual_seed(1000 * rows + chunk + 7919 * s)
            holder = place(torch.randn(2 * pages, bs, cfg.dim, generator=gen).to(dt).to(dev))
            # on a GPU the page table lives there (and a graph's capture refuses a copy from
            # the host); the pages a fetch sends are also named on the host (page_views)
            chosen = torch.randperm(2 * pages, generator=gen)[:pages]
            self.chosen_pages.append(chosen)
            sel = DensePages(_page_table(chosen, dev), chunk)
            local = torch.randn(-(-cfg.local_tokens // bs), bs, cfg.dim, generator=gen)
            local = local.to(dt).to(dev)
            q = place(torch.randn(rows, cfg.heads, cfg.dim, generator=gen).to(dt).to(dev))
            self.sets.append((holder, sel, local, q))
        for s in range(FRESH_SETS, sets):  # more memory to rotate over: copies, not draws
            holder, sel, local, q = self.sets[s % FRESH_SETS]
            self.sets.append((place(holder.clone()), sel, local, place(q.clone())))

    def _free_pages(self, sets: int, pages: int, dev) -> None:
        """Where each set's fetch splices the chunk."""
        import torch

        from xbench.kernels import DensePages

        cfg, rows, chunk, dt, bs = self.cfg, self.rows, self.chunk, self.dt, self.cfg.block_size
        # A's free pages: one target per set, so a fetch writes pages not in cache, as a
        # serving cache's free pages are (the bench's splice rotates its targets the same way),
        # and scattered over it as a free list hands them out: attention over pages in order
        # runs faster than over scattered ones (the prefetcher follows it), and the kernel
        # sweep times it over scattered pages
        gen = torch.Generator().manual_seed(1000 * rows + chunk + 1)
        self.targets = [
            torch.zeros(2 * pages, bs, cfg.dim, dtype=dt, device=dev) for _ in range(sets)
        ]
        free = [torch.randperm(2 * pages, generator=gen)[:pages] for _ in range(sets)]
        # as the kernel sweep passes them: a list on a CPU, a tensor on a GPU
        self.free_pages = [f.tolist() if dev.type == "cpu" else f.to(dev) for f in free]
        # where each set's fetch puts the chunk, in the chunk's token order
        self.spliced = [DensePages(_page_table(f, dev), chunk) for f in free]

    def _landings(self, dev, place) -> None:
        """Where each message lands and a fetch is packed, and the holder's page views a
        per-page fetch sends from."""
        import torch

        from xbench.kernels.bench import FRESH_SETS
        from xbench.validate.wire import byte_view

        cfg, rows, chunk, dt, bs = self.cfg, self.rows, self.chunk, self.dt, self.cfg.block_size
        # each message lands in its own tensor, named by its tag (1 queries, 2 partials,
        # 5 a fetch's chunk)
        self.sq = place(torch.empty(rows, cfg.heads, cfg.dim, dtype=dt, device=dev), landing=1)
        # What the holder returns, as one message of S_o bytes per query row (the model's
        # S_o): the partial output in the cache dtype, then its fp32 LSE.
        n_out = rows * cfg.heads * cfg.v_dim * torch.finfo(dt).bits // 8
        self.ret = place(
            torch.empty(n_out + rows * cfg.heads * 4, dtype=torch.uint8, device=dev), landing=2
        )
        self.ret_out = self.ret[:n_out].view(dt).view(rows, cfg.heads, cfg.v_dim)
        self.ret_lse = self.ret[n_out:].view(torch.float32).view(rows, cfg.heads)
        # the requester receives the chunk here; the holder packs it here
        self.skv = place(torch.empty(chunk, cfg.dim, dtype=dt, device=dev), landing=5)
        self.staging = place(torch.empty(chunk, cfg.dim, dtype=dt, device=dev))
        # a per-page fetch sends each selected page from where it lies in the holder's cache
        # and lands it at its place in skv; the last page may be partly selected
        landing = byte_view(self.skv)
        page_bytes = bs * cfg.dim * torch.finfo(dt).bits // 8
        self.landing = [landing[j : j + page_bytes] for j in range(0, len(landing), page_bytes)]
        self.page_views = [
            [
                byte_view(holder[int(p)])[: len(land)]
                for p, land in zip(self.chosen_pages[s % FRESH_SETS], self.landing, strict=True)
            ]
            for s, (holder, _, _, _) in enumerate(self.sets)
        ]

    def _local_partials(self) -> None:
        """A's local partials, computed once: route and fetch both need them equally."""
        import torch

        from xbench.kernels import DensePages, mla_partial_attention
        from xbench.kernels.bench import FRESH_SETS

        cfg = self.cfg
        self.local_partials = [
            mla_partial_attention(
                q, local, DensePages(torch.arange(local.shape[0]), cfg.local_tokens), cfg.scale
            )
            for _, _, local, q in self.sets[:FRESH_SETS]
        ]
        self.local_partials *= -(-len(self.sets) // FRESH_SETS)  # a copy's are its source's

    def close(self) -> None:
        """The case is over: the wire's placed memory given back (both ranks, together)."""
        self.wire.close()

    def stamp(self) -> None:
        """A phase boundary: the device's queued work done, then the clock read."""
        self.wire.ready()
        self.stamps.append(now())

    # ---- the compute calls, one key each (calls.py): replayed from graphs on a GPU ----
    def _attend_routed(self, k: int):
        """The holder's attention over its set ``k`` for the routed query, written straight
        into the message, in the wire format."""
        from xbench.kernels import mla_partial_attention

        holder, sel, _, _ = self.sets[k]
        return self.calls(
            ("route attention", k),
            lambda: mla_partial_attention(
                self.sq, holder, sel, self.cfg.scale, v_dim=self.cfg.v_dim,
                out=self.ret_out, lse=self.ret_lse,
            ),
        )  # fmt: skip

    def _merge_routed(self, k: int):
        """The returned partial merged where it lies (bf16, no unpacking copy) with A's own."""
        from xbench.kernels import merge_partials

        out, lse = self.local_partials[k]
        return self.calls(
            ("route merge", k),
            lambda: merge_partials([self.ret_out, out], [self.ret_lse, lse]),
        )

    def _gather(self, k: int):
        """The holder packs set ``k``'s selected pages into the staging buffer."""
        from xbench.kernels import gather_kv

        holder, sel, _, _ = self.sets[k]
        return self.calls(("fetch gather", k), lambda: gather_kv(holder, sel, out=self.staging))

    def _splice_fetched(self, k: int):
        from xbench.kernels import splice_kv

        return self.calls(
            ("fetch splice", k),
            lambda: splice_kv(self.targets[k], self.skv, self.free_pages[k], 0),
        )

    def _attend_fetched(self, k: int):
        from xbench.kernels import mla_partial_attention

        q = self.sets[k][3]
        return self.calls(
            ("fetch attention", k),
            lambda: mla_partial_attention(
                q, self.targets[k], self.spliced[k], self.cfg.scale, v_dim=self.cfg.v_dim
            ),
        )

    def _merge_fetched(self, k: int, attended):
        """The fetched chunk's partial (``attended``: what ``_attend_fetched`` gave, its
        graph's outputs on a GPU) merged with A's own."""
        from xbench.kernels import merge_partials

        local_out, local_lse = self.local_partials[k]
        return self.calls(
            ("fetch merge", k),
            lambda: merge_partials([attended[0], local_out], [attended[1], local_lse]),
        )

    def _attend_local(self, k: int):
        from xbench.kernels import mla_partial_attention

        holder, sel, _, q = self.sets[k]
        return self.calls(
            ("local attention", k),
            lambda: mla_partial_attention(q, holder, sel, self.cfg.scale, v_dim=self.cfg.v_dim),
        )

    def prepare(self) -> None:
        """Every compute call the paths make, on every set and in both roles, captured
        (graphs) or recorded before the first sample is timed."""
        self.calls.preparing = True
        try:
            for k in range(len(self.sets)):
                self._attend_routed(k)
                self._merge_routed(k)
                if self.cfg.fetch_layout == "packed":
                    self._gather(k)
                self._splice_fetched(k)
                self._merge_fetched(k, self._attend_fetched(k))
                self._attend_local(k)
        finally:
            self.calls.preparing = False

    # ---- the three paths; A's side returns the merged (out, lse) ----
    def route(self, i: int):
        k = i % len(self.sets)
        wire, stamp = self.wire, self.stamp
        if self.rank == self.requester:
            stamp()
            wire.send(self.sets[k][3], self.other, 1)
            wire.recv(self.ret, self.other, 2)
            stamp()
            merged = self._merge_routed(k)
            stamp()
            return merged
        wire.recv(self.sq, self.other, 1)
        stamp()
        self._attend_routed(k)
        stamp()
        wire.send(self.ret, self.other, 2)
        return None

    @property
    def fetch_segments(self) -> int:
        """Messages one fetch sends (the model's n_seg)."""
        return len(self.landing) if self.cfg.fetch_layout == "pages" else 1

    def fetch(self, i: int):
        k = i % len(self.sets)
        c, wire, stamp = self.comm, self.wire, self.stamp
        pages = self.cfg.fetch_layout == "pages"
        if self.rank == self.requester:
            stamp()
            c.Send(self.req, dest=self.other, tag=4)
            if pages:
                wire.recv_all(self.landing, self.other, 5)
            else:
                wire.recv(self.skv, self.other, 5)
            stamp()
            self._splice_fetched(k)
            stamp()
            attended = self._attend_fetched(k)
            stamp()
            merged = self._merge_fetched(k, attended)
            stamp()
            return merged
        c.Recv(self.req, source=self.other, tag=4)
        stamp()
        if pages:
            stamp()  # nothing to pack: the pages leave from where they lie
            wire.send_all(self.page_views[k], self.other, 5)
        else:
            self._gather(k)
            stamp()
            wire.send(self.staging, self.other, 5)
        return None

    def local(self, i: int):
        if self.rank == self.requester:
            self.stamp()
            result = self._attend_local(i % len(self.sets))
            self.stamp()
            return result
        return None

    def check(self, option: str, result) -> tuple[float, bool]:
        """(max |error|, within tolerance) of A's result against one-instance attention
        in float64: local over the holder's tokens, route and fetch over both instances'."""
        import torch

        from xbench.kernels.accuracy import bf16_tolerance, reference_attention

        holder, sel, local, q = self.sets[0]
        tokens = holder.reshape(-1, self.cfg.dim)[sel.token_indices(self.cfg.block_size)]
        if option != "local":
            tokens = torch.cat([local.reshape(-1, self.cfg.dim)[: self.cfg.local_tokens], tokens])
        ref, _, magnitude, spread = reference_attention(q, tokens, self.cfg.scale, self.cfg.v_dim)
        err = (result[0].double() - ref).abs()
        if self.cfg.dtype == "bf16":
            # route merges the holder's partial, shipped in bf16 (that is S_o)
            ok = bool(
                (err <= bf16_tolerance(ref, magnitude, spread, remote=option == "route")).all()
            )
        else:
            ok = bool((err <= 1e-5 * (1 + ref.abs())).all())
        return float(err.max()), ok


def phase_means(option: str, requester: list[float], holder: list[float], n: int) -> dict:
    """Mean seconds per phase over a sample's ``n`` iterations, from the requester's and the
    holder's stamps (see the paths above for where each is taken)."""
    import numpy as np

    a = np.asarray(requester, float).reshape(n, -1)
    if option == "local":
        return {"attention": float(np.mean(a[:, 1] - a[:, 0]))}
    b = np.asarray(holder, float).reshape(n, -1)
    if option == "route":
        send, attention, back, merge = (
            b[:, 0] - a[:, 0],
            b[:, 1] - b[:, 0],
            a[:, 1] - b[:, 1],
            a[:, 2] - a[:, 1],
        )
        return {
            "send": float(send.mean()),
            "attention": float(attention.mean()),
            "return": float(back.mean()),
            "merge": float(merge.mean()),
        }
    packing = b[:, 1] - b[:, 0]  # the holder's gather (nothing for a per-page fetch)
    return {
        "transfer": float(np.mean(a[:, 1] - a[:, 0] - packing)),
        "move": float(np.mean(packing + a[:, 2] - a[:, 1])),
        "attention": float(np.mean(a[:, 3] - a[:, 2])),
        "merge": float(np.mean(a[:, 4] - a[:, 3])),
    }


def _page_table(pages, dev):
    """A selection's pages where its kernels read them: on a GPU, a serving engine's int32
    block table on the device, as the kernel sweep passes them; on a CPU, as they are."""
    import torch

    return pages if dev.type == "cpu" else pages.to(device=dev, dtype=torch.int32)


def _sets_needed(cfg, chunk: int, rows: int) -> int:
    """Sets enough that the chunks a rank's options attend add up to twice its last-level
    cache, as the kernel sweep's attention and splice rotate (``cold_set_count``): every
    option reads its chunk from memory and a fetch splices into cold pages (then attends
    the chunk it has just spliced, in cache, as a serving instance would)."""
    from xbench.kernels.bench import cache_bytes, cold_set_count

    elem = 2 if cfg.dtype == "bf16" else 4
    pages = -(-chunk // cfg.block_size) * cfg.block_size
    # a copy holds the holder's cache and the requester's target (twice the chunk each)
    # and the query
    copy = (4 * pages * cfg.dim + rows * cfg.heads * cfg.dim) * elem
    return cold_set_count(chunk * cfg.dim * elem, copy, cache_bytes(cfg.device))


def _open_store(cfg: ValidateConfig, comm, sink, device_name, allocator):
    """Rank 0 checks the launch (two ranks) and opens the run's store with its metadata;
    every rank joins the gathering of host names. Returns the store (None off rank 0)."""
    import torch
    from mpi4py import MPI

    from xbench.fabric.launch import launcher_name, thread_level_name
    from xbench.kernels import cpu_bf16

    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0:
        comm.allgather(os.uname().nodename)
        return None
    # the store's modules (pandas, pyarrow) on rank 0 only: the other starts sooner
    from xbench.results.metadata import run_metadata
    from xbench.results.store import RunStore

    if size != 2:
        sink.error(f"validate needs exactly 2 ranks (requester and holder), got {size}")
        comm.Abort(2)
    return RunStore(
        cfg.out_dir,
        run_metadata(
            cfg.run_id,
            "validate",
            ranks=size,
            hosts=comm.allgather(os.uname().nodename),
            mpi_library=mpi_library(MPI),
            mpi_thread_level=thread_level_name(MPI),
            launcher=launcher_name(),
            runs=cfg.runs,
            device=cfg.device,
            device_name=device_name,
            wire=cfg.wire,
            conditions={
                "cpu_attention": cpu_bf16.active_path() if cfg.dtype == "bf16" else None,
                "torch_threads": torch.get_num_threads(),
                "allocator": allocator,
            },
            config=json.loads(cfg.to_json()),
        ),
    )


def _check_and_calibrate(cfg: ValidateConfig, peer: Peer, comm) -> tuple[dict, dict]:
    """Per option: (largest error, all correct) from each rank asking once, on set 0,
    against one instance; and the iterations a sample takes, from rank 0's first timed
    call (a sample of about ``min_sample_s``)."""
    rank = comm.Get_rank()
    checks, iters = {}, {}
    for option in OPTIONS:
        run = getattr(peer, option)
        found = []
        for asker in (1, 0):  # ends with rank 0 asking, for the calibration below
            peer.requester = asker
            comm.Barrier()
            result = run(0)
            found.append(peer.check(option, result) if rank == peer.requester else None)
        found = [f for pair in comm.allgather(found) for f in pair if f is not None]
        checks[option] = (max(e for e, _ in found), all(ok for _, ok in found))
        comm.Barrier()
        t0 = time.perf_counter()
        run(1)
        first = time.perf_counter() - t0
        iters[option] = comm.bcast(
            max(1, min(1000, math.ceil(cfg.min_sample_s / max(first, 1e-9))))
            if rank == 0
            else None,
            root=0,
        )
    return checks, iters


def _timed_sample(peer: Peer, comm, option: str, n: int):
    """One sample of ``option``: n calls timed on the requester's clock, then the phases
    from both ranks' stamps. Returns (seconds a call, phase means), the same on both ranks."""
    from xbench.host import collector_paused

    run = getattr(peer, option)
    comm.Barrier()
    with collector_paused():
        # One untimed iteration first, as the kernel sweep warms each case up: the options
        # alternate, so a sample's first calls follow another option's work (or its wait),
        # and on a CPU run slower for it, a cost of the alternation, not of the path. On a
        # set the timed calls reach last, if at all.
        run(len(peer.sets) - 1)
        peer.stamps.clear()
        t0 = time.perf_counter()
        for i in range(n):
            run(i)
        elapsed = (time.perf_counter() - t0) / n
    # after the clock stops: the holder's stamps go to the requester
    stamps = comm.gather(peer.stamps, root=peer.requester)
    phases = None
    if comm.Get_rank() == peer.requester:
        phases = phase_means(option, stamps[peer.requester], stamps[peer.other], n)
    return comm.bcast((elapsed, phases), root=peer.requester)


def _run_pass(cfg: ValidateConfig, comm, round_: int, b: int, c: int) -> list[dict]:
    """One pass over a case (b rows, c tokens): every option checked, calibrated and
    sampled; the rows of its samples."""
    from xbench.validate.wire import transport_label

    peer = Peer(cfg, b, c, comm, _sets_needed(cfg, c, b))
    peer.prepare()  # graphs captured (GPU) before any call is checked or timed
    checks, iters = _check_and_calibrate(cfg, peer, comm)
    rows = []
    # Options alternate sample by sample, so drift on a shared machine hits them alike; so
    # do the roles: the ranks take turns asking, so each option's samples run on both cores
    # (a noisy neighbour often slows one vCPU, not both). The requester's clock times a
    # sample, as a serving instance would see it.
    per_round = cfg.warmups + cfg.samples
    for s in range(per_round):
        peer.requester = (round_ * per_round + s) % 2
        for option in OPTIONS:
            n = iters[option]
            elapsed, phases = _timed_sample(peer, comm, option, n)
            error, correct = checks[option]
            rows.append(
                {
                    "run_id": cfg.run_id,
                    "option": option,
                    "transport": transport_label(cfg.wire, cfg.device),
                    "fabric": cfg.fabric or "shm",
                    "rows": b,
                    "heads": cfg.heads,
                    "chunk_tokens": c,
                    "dtype": cfg.dtype,
                    "iterations": n,
                    "sample": s,
                    "warmup": s < cfg.warmups,
                    "metric": "time",
                    "value": elapsed * 1e6,
                    "unit": "us",
                    "max_abs_error": error,
                    "correct": correct,
                    "requester": peer.requester,
                    "round": round_,
                    "segments": peer.fetch_segments if option == "fetch" else 1,
                    "process_run": cfg.process_run,
                    **{f"{k}_us": phases.get(k, math.nan) * 1e6 for k in PHASE_COLUMNS},
                }
            )
    peer.close()
    return rows


def _start_wire(cfg: ValidateConfig, comm, sink) -> None:
    """What the run's wire starts once over the two ranks (NCCL's process group, NVSHMEM's
    PEs); one GPU a rank first, where the wire needs it, said in one line. A rank that
    cannot start it ends the run with its line."""
    from xbench.fabric.gpu import claim_own_gpu
    from xbench.validate.wire import WIRES

    wire = WIRES[cfg.wire]
    try:
        gpu = None
        if cfg.device == "cuda":
            import torch

            gpu = torch.cuda.current_device()
            if wire.one_gpu_each:
                fix = "pass --wire staged (two ranks may share a GPU there)"
                claim_own_gpu(comm, gpu, cfg.wire, fix=fix)
        wire.start_run(comm, gpu)
    except XbenchError as exc:
        if comm.Get_rank() == 0:
            sink.error(str(exc))
        raise SystemExit(2) from None


def run_validate(cfg: ValidateConfig, sink) -> None:
    import torch
    from mpi4py import MPI

    from xbench.fabric.watchdog import EXIT_TIMEOUT, Watchdog, write_hang_report
    from xbench.host import steady_allocator
    from xbench.kernels import cpu_bf16
    from xbench.results.schema import VALIDATE_SAMPLES
    from xbench.results.stopping import stop_rank
    from xbench.validate.wire import WIRES

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    device_name = None
    if cfg.device == "cuda":  # the ranks take the GPUs in turn (two may share one)
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device_name = torch.cuda.get_device_name()
    _start_wire(cfg, comm, sink)
    allocator = steady_allocator()  # the state the kernel sweep measured in (see host.py)
    torch.set_num_threads(cfg.threads)
    cpu_bf16.choose_path(cfg.cpu_attention)
    store = _open_store(cfg, comm, sink, device_name, allocator)
    cases = [(b, c) for c in cfg.chunks for b in cfg.rows]

    def timed_out(label: str) -> None:
        """Where this rank waited, then the one line: rank 0 through its sink, the others
        on stderr, where the launcher finds it when this rank ends first."""
        said = f"validate case {label} did not finish within {cfg.timeout_s:g} s on rank {rank}"
        report = os.path.join(cfg.out_dir, f"hang-rank{rank}.txt")
        where = write_hang_report(report, [f"{said} (pid {os.getpid()})"])
        said += f"; what rank {rank} waited in is {where}"
        stop_rank(rank, sink, said, EXIT_TIMEOUT, cfg.out_dir)

    watchdog = Watchdog(cfg.timeout_s, timed_out)
    if rank == 0:
        store.plan(VALIDATE_SAMPLES, len(cases) * cfg.rounds)  # one part file a pass
        sink.start(len(cases) * cfg.rounds, cfg.out_dir, "python")
    passes = [(r, b, c) for r in range(cfg.rounds) for b, c in cases]
    for index, (round_, b, c) in enumerate(passes):
        label = f"rows={b} chunk={c}" + (
            f" round {round_ + 1}/{cfg.rounds}" if cfg.rounds > 1 else ""
        )
        if rank == 0:
            sink.case_started(index, label)
        with watchdog.watching(label):
            rows = _run_pass(cfg, comm, round_, b, c)
        if rank == 0:
            store.append(VALIDATE_SAMPLES, rows)
            route = sorted(r["value"] for r in rows if r["option"] == "route" and not r["warmup"])
            sink.case_done(index, label, route[len(route) // 2], "us")
    comm.Barrier()
    WIRES[cfg.wire].stop_run()
    if rank == 0:
        store.finish(launch=cfg.process_run, launches=cfg.runs)
        sink.finish()


def main(argv: list[str]) -> int:
    from xbench.ranks import dump_stacks_when_stopped, start_mpi
    from xbench.results.stopping import failures_stop_the_job

    MPI = start_mpi()  # at the level the probe ran at
    dump_stacks_when_stopped()  # after MPI_Init: Open MPI sets its own SIGTERM handler

    from xbench.events import JsonLinesSink, NullSink

    cfg = ValidateConfig.from_json(Path(argv[0]).read_text())
    sink = JsonLinesSink() if MPI.COMM_WORLD.Get_rank() == 0 else NullSink()
    with failures_stop_the_job(sink, cfg.out_dir):
        run_validate(cfg, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
