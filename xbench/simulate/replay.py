"""The ranks of ``xbench simulate --validate``: a simulated trace replayed for real.

Each rank is one instance of the workload (two ranks, two instances). It holds the chunks
``k % 2 == rank`` as KV pages, keeps the chunks it fetched in an LRU cache, and runs one
event loop on one core: requests arrive on the trace's clock (shared: both ranks start
after a barrier); a routed query goes to the holder as one message, the holder attends
it (batched with the queued queries of the same chunk, as the simulator batches them)
and answers, the requester merges; a fetch asks the holder, which gathers the chunk on
its core and sends it, and the requester splices, attends and merges; a use of a chunk
that is here (home or cached) attends here, batched too; a use of a chunk on its way
waits for it. The compute is real (the kernels ``xbench kernel`` timed and the profile
was fitted on), so queueing at a popular holder and reuse of fetched chunks happen as
they would. Every request's latency (arrival on the trace to its answer) goes back to
the parent, which compares it with the simulation of the same trace.

The predicate is replayed with the simulation's decisions (``decisions``), so both see
the same choices; a use the simulation found here but the replay does not (its cache
differs) is routed and counted.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

QUERY, ANSWER, FETCH, KV, DONE = 11, 12, 13, 14, 19


@dataclass
class ReplayConfig:
    out_dir: str
    run_id: str
    policy: str  # route, fetch, or predicate (replaying ``decisions``)
    arrival: list  # s, per use
    requester: list
    chunk: list
    decisions: list = field(default_factory=list)  # per use: route, fetch or present
    chunk_tokens: int = 2048
    rows: int = 1
    heads: int = 16
    dim: int = 576
    v_dim: int = 512
    block_size: int = 64
    cache_chunks: int = 16
    max_batch_rows: int = 1024
    local_tokens: int = 256
    threads: int = 1
    cpu_attention: str = "auto"
    label: str = ""  # the result's file name, replay-<label>.json (default: the policy)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReplayConfig:
        return cls(**json.loads(text))


class Instance:
    """One rank's chunks, cache, compute queue and messages."""

    def __init__(self, cfg: ReplayConfig, comm):
        import numpy as np
        import torch

        from xbench.kernels import DensePages, mla_partial_attention

        self.cfg, self.comm, self.np, self.torch = cfg, comm, np, torch
        self.rank = comm.Get_rank()
        self.peer = 1 - self.rank
        self.scale = 1 / cfg.dim**0.5
        self.pages = -(-cfg.chunk_tokens // cfg.block_size)
        self.sel = DensePages(torch.arange(self.pages), cfg.chunk_tokens)
        chunks = sorted(set(cfg.chunk))
        self.home = {  # this instance's chunks, as pages of a cache
            k: torch.randn(
                self.pages, cfg.block_size, cfg.dim, generator=torch.Generator().manual_seed(k)
            ).to(torch.bfloat16)
            for k in chunks
            if k % 2 == self.rank
        }
        self.cache: OrderedDict = OrderedDict()  # fetched chunks (spliced pages), LRU
        # pages to splice fetched chunks into, allocated once (a serving cache's free pages)
        self.free = [
            torch.zeros(self.pages, cfg.block_size, cfg.dim, dtype=torch.bfloat16)
            for _ in range(cfg.cache_chunks + 1)
        ]
        # query rows, made before the clock starts: request r sends queries[r % 64]
        qgen = torch.Generator().manual_seed(10_000)
        self.queries = [
            torch.randn(cfg.rows, cfg.heads, cfg.dim, generator=qgen).to(torch.bfloat16)
            for _ in range(64)
        ]
        self.pending: dict[int, list[int]] = {}  # chunk on its way -> uses waiting for it
        self.queue: deque = deque()  # compute jobs, FIFO
        self.sends: list = []  # in-flight sends, the buffers they read, their pool
        # send buffers a gather packs a chunk into (its number, then its tokens), made and
        # touched before the clock, as a holder keeps its staging buffers registered: the
        # sweep timed the gather into one, and a packet made per fetch copied the chunk twice
        # (the replay's gathers ran 2.0-2.3x the profile's)
        self.chunk_bytes = cfg.chunk_tokens * cfg.dim * 2
        self.staging = [np.full(8 + self.chunk_bytes, 0, dtype=np.uint8) for _ in range(4)]
        q_bytes = cfg.rows * cfg.heads * cfg.dim * 2
        self.q_bytes = q_bytes
        self.out_bytes = cfg.rows * cfg.heads * cfg.v_dim * 2
        gen = torch.Generator().manual_seed(99)
        local = torch.randn(
            -(-cfg.local_tokens // cfg.block_size), cfg.block_size, cfg.dim, generator=gen
        ).to(torch.bfloat16)
        q0 = torch.randn(cfg.rows, cfg.heads, cfg.dim, generator=gen).to(torch.bfloat16)
        self.local_partial = mla_partial_attention(
            q0, local, DensePages(torch.arange(local.shape[0]), cfg.local_tokens), self.scale
        )
        self.latency: dict[int, float] = {}
        self.routed_instead = 0
        self.jobs: list = []

    # ---- messages ----
    def send(self, payload, dest: int, tag: int, pool: list | None = None) -> None:
        """Send ``payload``; once sent, it goes back to ``pool`` when given."""
        self.sends.append((self.comm.Isend(payload, dest=dest, tag=tag), payload, pool))

    def reap(self) -> None:
        pending = []
        for sent in self.sends:
            if not sent[0].Test():
                pending.append(sent)
            elif sent[2] is not None:
                sent[2].append(sent[1])
        self.sends = pending

    def staged_gather(self, r: int, k: int):
        """Request r's chunk k packed into a staging buffer behind r's number."""
        from xbench.kernels import gather_kv

        np, torch = self.np, self.torch
        buf = self.staging.pop() if self.staging else np.empty(8 + self.chunk_bytes, np.uint8)
        buf[:8] = self.head(r)
        tokens = torch.from_numpy(buf[8:]).view(torch.bfloat16).view(-1, self.cfg.dim)
        gather_kv(self.home[k], self.sel, out=tokens)
        return buf

    def head(self, r: int):
        """A message's first 8 bytes: the request it belongs to."""
        return self.np.array([r], dtype=self.np.int64).view(self.np.uint8)

    def packet(self, r: int, body) -> object:
        return self.np.concatenate([self.head(r), body.reshape(-1)])

    def query(self, r: int):
        """Request r's query rows."""
        return self.queries[r % len(self.queries)]

    def bytes_of(self, t):
        """A flat uint8 view of a contiguous tensor (bf16 has no numpy dtype)."""
        return t.contiguous().view(self.torch.uint8).numpy().reshape(-1)

    # ---- what happens ----
    def arrive(self, r: int, decision: str) -> None:
        k = self.cfg.chunk[r]
        if k % 2 == self.rank or k in self.cache:
            if k in self.cache:
                self.cache.move_to_end(k)
            self.queue.append(("attend", r, k, None, None))
            return
        if k in self.pending:
            self.pending[k].append(r)
            return
        if decision not in ("route", "fetch"):
            self.routed_instead += 1  # the simulation had it here; the replay does not
            decision = "route"
        if decision == "route":
            self.send(self.packet(r, self.bytes_of(self.query(r))), self.peer, QUERY)
        else:
            self.pending[k] = []
            self.send(self.np.array([r, k], dtype=self.np.int64), self.peer, FETCH)

    def receive(self, status, buf) -> bool:
        """Handle one message; True when it is the peer's DONE."""
        np, torch, tag = self.np, self.torch, status.Get_tag()
        if tag == DONE:
            return True
        r = int(buf[:8].view(np.int64)[0])
        body = buf[8:]
        if tag == QUERY:
            q = (
                torch.from_numpy(body)
                .view(torch.bfloat16)
                .view(self.cfg.rows, self.cfg.heads, self.cfg.dim)
            )
            self.queue.append(("attend", r, self.cfg.chunk[r], q, None))
        elif tag == ANSWER:
            self.queue.append(("merge", r, body))
        elif tag == FETCH:
            self.queue.append(("gather", r, int(buf[8:16].view(np.int64)[0])))
        elif tag == KV:
            self.queue.append(("fetched", r, body))
        return False

    def step(self, now) -> None:
        """Run the next compute job (a chunk's queued attentions as one call)."""
        from xbench.kernels import merge_partials, mla_partial_attention, splice_kv

        torch, cfg = self.torch, self.cfg
        job = self.queue.popleft()
        kind, r = job[0], job[1]
        start, calls = now(), 1
        if kind == "attend":
            k = job[2]
            members = [job]
            rest = deque()
            while self.queue:
                other = self.queue.popleft()
                if (
                    other[0] == "attend"
                    and other[2] == k
                    and (len(members) + 1) * cfg.rows <= cfg.max_batch_rows
                ):
                    members.append(other)
                else:
                    rest.append(other)
            self.queue = rest
            calls = len(members)
            q = torch.cat([m[3] if m[3] is not None else self.query(m[1]) for m in members])
            # the chunk: home, cached, or the pages a fetch brought for the uses that waited
            # for it (without a cache it has left the cache already)
            kv = next((m[4] for m in members if m[4] is not None), None)
            if kv is None:
                kv = self.home[k] if k in self.home else self.cache[k]
            out, lse = mla_partial_attention(q, kv, self.sel, self.scale, v_dim=cfg.v_dim)
            for i, m in enumerate(members):
                rows = slice(i * cfg.rows, (i + 1) * cfg.rows)
                if m[3] is not None:  # routed here: answer with the partial (bf16) and its LSE
                    body = self.np.concatenate(
                        [self.bytes_of(out[rows].to(torch.bfloat16)), self.bytes_of(lse[rows])]
                    )
                    self.send(self.packet(m[1], body), self.peer, ANSWER)
                else:
                    self.done(m[1], now())
        elif kind == "merge":
            body = job[2]
            out = torch.from_numpy(body[: self.out_bytes]).view(torch.bfloat16)
            lse = torch.from_numpy(body[self.out_bytes :]).view(torch.float32)
            shape = (cfg.rows, cfg.heads)
            merge_partials(
                [out.view(*shape, cfg.v_dim), self.local_partial[0]],
                [lse.view(*shape), self.local_partial[1]],
            )
            self.done(r, now())
        elif kind == "gather":
            self.send(self.staged_gather(r, job[2]), self.peer, KV, self.staging)
        elif kind == "fetched":
            k = cfg.chunk[r]
            packed = torch.from_numpy(job[2]).view(torch.bfloat16).view(cfg.chunk_tokens, cfg.dim)
            pages = self.free.pop()
            splice_kv(pages, packed, list(range(self.pages)), 0)
            out, lse = mla_partial_attention(
                self.query(r), pages, self.sel, self.scale, v_dim=cfg.v_dim
            )
            merge_partials([out, self.local_partial[0]], [lse, self.local_partial[1]])
            self.cache[k] = pages
            self.cache.move_to_end(k)
            while len(self.cache) > cfg.cache_chunks:  # (timing only: a page set that
                # uses still wait on may be reused by the next fetch; nothing is checked)
                self.free.append(self.cache.popitem(last=False)[1])
            self.done(r, now())
            for waiting in self.pending.pop(k, []):
                self.queue.append(("attend", waiting, k, None, pages))
        # each job's kind, start, end and the queries it served: what the compute cost here
        self.jobs.append((kind, start, now(), calls))

    def done(self, r: int, t: float) -> None:
        self.latency[r] = t - self.cfg.arrival[r]


def message_waiting(comm, status) -> bool:
    """Whether a message is waiting (its envelope in ``status``). MPICH's Iprobe looks for
    a match before it polls for what arrived, so a message that came while this rank
    computed is seen by the second call, not the first (measured with the mpich wheel: two
    calls every time, after 5 ms away from MPI); probing once took a rank's messages in a
    whole job late, as a serving loop that polls would not."""
    from mpi4py import MPI

    probe = comm.Iprobe
    return probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status) or probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)


def run_replay(cfg: ReplayConfig, sink) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from xbench.host import collector_paused, steady_allocator
    from xbench.kernels import cpu_bf16

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != 2:
        if rank == 0:
            sink.error(f"the replay needs 2 ranks (two instances), got {size}")
        comm.Abort(2)
    steady_allocator()
    torch.set_num_threads(cfg.threads)
    cpu_bf16.choose_path(cfg.cpu_attention)
    me = Instance(cfg, comm)
    mine = [r for r, who in enumerate(cfg.requester) if who == rank]
    decisions = cfg.decisions or [cfg.policy] * len(cfg.arrival)
    if rank == 0:
        sink.start(1, cfg.out_dir, "python")
        sink.case_started(0, f"replay {cfg.policy}")
    status = MPI.Status()
    # no collector pauses on the clock (a serving loop freezes its heap too): what was
    # made so far is frozen, and the loop runs with the collector off
    gc.collect()
    gc.freeze()
    comm.Barrier()
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    with collector_paused():
        nxt, peer_done, said_done = 0, False, False
        while True:
            t = now()
            handled = 0
            while nxt < len(mine) and cfg.arrival[mine[nxt]] <= t:
                me.arrive(mine[nxt], decisions[mine[nxt]])
                nxt += 1
                handled += 1
            while message_waiting(comm, status):
                buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
                comm.Recv(buf, source=status.Get_source(), tag=status.Get_tag())
                peer_done |= me.receive(status, buf)
                handled += 1
            me.reap()
            if handled:  # taking arrivals and messages in costs this core time too
                me.jobs.append(("messages", t, now(), handled))
            if me.queue:
                me.step(now)
                continue
            if not said_done and len(me.latency) == len(mine):
                me.send(np.zeros(1, dtype=np.int64), me.peer, DONE)
                said_done = True
            if said_done and peer_done and not me.sends and not me.queue:
                break
    latencies = comm.gather(me.latency, root=0)
    jobs = comm.gather(me.jobs, root=0)
    instead = comm.reduce(me.routed_instead, root=0)
    if rank == 0:
        merged = {r: v for part in latencies for r, v in part.items()}
        Path(cfg.out_dir, f"replay-{cfg.label or cfg.policy}.json").write_text(
            json.dumps(
                {
                    "latency": [merged[r] for r in range(len(cfg.arrival))],
                    "routed_instead": instead,
                    "jobs": jobs,
                    "cpu_attention": cpu_bf16.active_path(),
                }
            )
        )
        sink.case_done(0, f"replay {cfg.policy}", float(np.median(list(merged.values()))), "s")
        sink.finish()


def main(argv: list[str]) -> int:
    from xbench.ranks import start_mpi
    from xbench.results.stopping import failures_stop_the_job

    MPI = start_mpi()

    from xbench.events import JsonLinesSink, NullSink

    cfg = ReplayConfig.from_json(Path(argv[0]).read_text())
    sink = JsonLinesSink() if MPI.COMM_WORLD.Get_rank() == 0 else NullSink()
    with failures_stop_the_job(sink, cfg.out_dir):
        run_replay(cfg, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
