"""Timing the kernels: cases, ceilings, and the sweep behind ``xbench kernel``.

Honest timing: every case first runs untimed warm-ups, then calibrates the calls per
sample so a sample lasts at least ``min_sample_s``, then takes ``samples`` samples. Inputs
are several fresh sets (at most 8) rotated call by call, enough that their total exceeds
twice the last-level cache where 8 sets can, so a kernel does not re-read what the previous
call left in cache. A serving cache's pages (the chunk attention reads, the free pages a
splice writes) always exceed it, copies of the fresh sets in memory of their own: they are
read from memory however short the chunk is. The splice's source is the exception: it is
the landing buffer the transfer has just written, one buffer kept in cache. Other small
inputs (a merge of a few rows, a short gather) stay in cache across 8 sets: they are timed
with their data cached, as when they directly follow the transfer or the attention that
produced it. (Flushing the whole cache before each call was tried: it also evicts the code
and the allocator's state, and made a 64 KB merge 7x slower than the same merge inside a
routed query.) On CUDA the samples are timed with CUDA events around the calls, never host
clocks around asynchronous work. Python's cyclic collector is off while a case is timed
(as in timeit).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from xbench.core.models import LSE_BYTES, ModelPreset
from xbench.errors import XbenchError
from xbench.host import collector_paused, llc_bytes
from xbench.kernels import cpu_bf16
from xbench.kernels.api import gather_kv, get_backend
from xbench.kernels.selection import DensePages, random_topk

# a sparse attention's rows each select their chunk out of this many times as many tokens
SPARSE_CONTEXT = 2
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class KernelCase:
    kernel: str
    rows: int
    heads: int
    chunk: int  # tokens attended (sparse: per row) or moved
    dim: int
    v_dim: int
    dtype: str
    sparse: bool
    partials: int = 2
    block_size: int = 64
    rope_dim: int = 64
    # Tokens an attention (of ``rows`` query rows) reads just before each timed call; 0:
    # calls back to back. In a route or a fetch the merge, gather and splice follow an
    # attention over the chunk, which has evicted their inputs from the caches: timed back
    # to back they would look several times cheaper than they are there.
    after: int = 0
    # Microseconds the device idles (the timing thread asleep) before each timed call; 0:
    # calls back to back. A call after some idle finds caches, TLBs and clocks gone cold
    # and costs more, whatever its shape: a server at moderate load runs most of its calls
    # so.
    idle_us: int = 0
    # Microseconds the timing thread spins before each timed call, touching nothing, as a
    # route's requester polls MPI for its answer; 0: back to back. A merge after such a
    # wait costs more the longer the wait was, so the fit prices the wait separately.
    wait_us: int = 0
    # Tokens a splice wrote into the attention's own pages just before each timed call (an
    # attention only; 0: none). A fetch attends the chunk it has just spliced, partly still
    # in cache, so that attention is cheaper than one over pages from memory.
    after_splice: int = 0

    @property
    def elem(self) -> int:
        return torch.finfo(TORCH_DTYPES[self.dtype]).bits // 8

    @property
    def spec(self) -> KernelSpec:
        return SPECS[self.kernel]

    @property
    def bytes_moved(self) -> int:
        """Least bytes the kernel must read and write."""
        return self.spec.bytes_moved(self)

    @property
    def flops(self) -> int:
        return self.spec.flops(self)

    @property
    def label(self) -> str:
        kind = "sparse" if self.sparse else "dense"
        after = f" after {self.after}" if self.after else ""
        idle = f" after {self.idle_us} us idle" if self.idle_us else ""
        wait = f" after a {self.wait_us} us wait" if self.wait_us else ""
        spliced = " after its splice" if self.after_splice else ""
        return (
            f"{self.kernel} rows={self.rows} chunk={self.chunk}{after}{idle}{wait}{spliced} "
            f"{kind} {self.dtype}"
        )

    def context(self) -> KernelCase:
        """The attention that runs before each timed call (``after`` tokens)."""
        return KernelCase(
            kernel="partial_attention",
            rows=self.rows,
            heads=self.heads,
            chunk=self.after,
            dim=self.dim,
            v_dim=self.v_dim,
            dtype=self.dtype,
            sparse=False,
            block_size=self.block_size,
            rope_dim=self.rope_dim,
        )


@dataclass(frozen=True)
class KernelSpec:
    """One kernel as the sweep times it (nccl-tests' struct per test): the least bytes it
    moves and the FLOPs it does for a case, one fresh input set, and the call timed. A new
    kernel is one spec and its line in ``SPECS``."""

    name: str
    bytes_moved: Callable[[KernelCase], int]
    flops: Callable[[KernelCase], int]
    inputs: Callable[[KernelCase, str, torch.Generator], dict]
    runner: Callable[[KernelCase, str, float], Callable[[dict], object]]
    # touches a serving cache's pages (attention reads its chunk, a splice writes free
    # pages). A serving cache is gigabytes, so those pages come from memory however short
    # the chunk: its rotating sets are copied past twice the last cache (input_sets), or a
    # few small sets would stay cached and time it faster than validate's paths run it
    cold_pages: bool = False
    shared_inputs: tuple = ()  # inputs every set shares: one buffer, kept in cache
    merges_partials: bool = False  # its case's ``partials`` is what it combines
    every_rows: bool = False  # timed at each rows count of a sweep (others at one row)


def _attention_bytes(case: KernelCase) -> int:
    rh, elem = case.rows * case.heads, case.elem
    kv_tokens = case.chunk * (case.rows if case.sparse else 1)
    return rh * case.dim * elem + kv_tokens * case.dim * elem + rh * (case.v_dim * 4 + LSE_BYTES)


def _merge_bytes(case: KernelCase) -> int:
    return (case.partials + 1) * case.rows * case.heads * (case.v_dim * 4 + LSE_BYTES)


def _prefill_bytes(case: KernelCase) -> int:  # q, k, v read, the output written
    return case.chunk * case.heads * (2 * case.dim + 2 * case.v_dim) * case.elem


def _moved_bytes(case: KernelCase) -> int:  # gather, splice: each token read and written
    return 2 * case.chunk * case.dim * case.elem


def _attention_flops(case: KernelCase) -> int:
    return 2 * case.rows * case.heads * case.chunk * (case.dim + case.v_dim)


def _merge_flops(case: KernelCase) -> int:
    return 2 * case.partials * case.rows * case.heads * case.v_dim


def _splice_flops(case: KernelCase) -> int:  # RoPE on the tokens' rotary part
    return 6 * case.chunk * case.rope_dim // 2


def _prefill_flops(case: KernelCase) -> int:  # causal: token i attends to i + 1 tokens
    return case.heads * case.chunk * (case.chunk + 1) * (case.dim + case.v_dim)


class Clock:
    """Host clock on CPU; CUDA events on GPU (the device's own timeline)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def capture(self, body):
        """``body`` recorded into a CUDA graph (after one eager run on a side stream, which
        allocates and compiles outside the capture); its replay is what a sample times."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            body()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                body()
        except Exception as exc:  # noqa: BLE001 - capture refuses host syncs, among others
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise XbenchError(
                f"this backend's calls cannot be captured in a CUDA graph ({reason})",
                "pass --launch eager",
            ) from None
        return graph

    def time(self, fn, calls: int) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(calls):
                fn(i)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        return time.perf_counter() - t0


def make_inputs(case: KernelCase, device: str, seed: int):
    """One fresh input set for ``case`` (random values, written before timing)."""
    return case.spec.inputs(case, device, torch.Generator().manual_seed(seed))


def _merge_inputs(case: KernelCase, device: str, gen: torch.Generator) -> dict:
    outs = torch.randn(case.partials, case.rows, case.heads, case.v_dim, generator=gen)
    lses = torch.randn(case.partials, case.rows, case.heads, generator=gen)
    if device == "cpu":  # separate partials, as route and fetch merge them (no stacking)
        parts = list(outs.unbind(0))
        # the first as a route's answer arrives, in the wire format (the cache dtype):
        # torch's merge converts it (route's merge ran up to 1.7x fetch's all-fp32 one
        # on that path), the C merge reads it in place
        parts[0] = parts[0].to(TORCH_DTYPES[case.dtype])
        return {"outs": parts, "lses": list(lses.unbind(0))}
    return {"outs": outs.to(device), "lses": lses.to(device)}


def _prefill_inputs(case: KernelCase, device: str, gen: torch.Generator) -> dict:
    dt, shape = TORCH_DTYPES[case.dtype], (1, case.heads, case.chunk)  # one causal sequence
    return {
        "q": torch.randn(*shape, case.dim, generator=gen).to(dt).to(device),
        "k": torch.randn(*shape, case.dim, generator=gen).to(dt).to(device),
        "v": torch.randn(*shape, case.v_dim, generator=gen).to(dt).to(device),
    }


def _splice_inputs(case: KernelCase, device: str, gen: torch.Generator) -> dict:
    """Packed tokens into a paged cache's free pages."""
    dt, bs = TORCH_DTYPES[case.dtype], case.block_size
    pages = -(-case.chunk // bs)
    # scattered over the cache, as a free list hands them out: a list on the CPU (its
    # splice takes one), a tensor on a GPU, where the page table lives (and a graph's
    # capture refuses a copy from the host)
    free_list = torch.randperm(2 * pages, generator=gen)[:pages]
    on_cpu = torch.device(device).type == "cpu"
    return {
        "packed": torch.randn(case.chunk, case.dim, generator=gen).to(dt).to(device),
        "target": torch.zeros(2 * pages, bs, case.dim, dtype=dt, device=device),
        "pages": free_list.tolist() if on_cpu else free_list.to(device),
    }


def _paged_inputs(case: KernelCase, device: str, gen: torch.Generator, per_row: bool) -> dict:
    """A paged cache and a selection of its tokens (what attention and gather read);
    ``per_row``: a sparse selection of its own for each decode row (attention's)."""
    dt, bs = TORCH_DTYPES[case.dtype], case.block_size
    if per_row:
        # each decode row selects from a context of its own (a batch's rows are different
        # requests): one region of SPARSE_CONTEXT x chunk tokens a row, so no row reads
        # another's tokens from cache and the rows x chunk tokens the bound counts are read
        # from memory (one pool of 4 x chunk for every row stayed in a GPU's L2)
        region = SPARSE_CONTEXT * case.chunk
        pool = region * case.rows
    else:
        pool = case.chunk * (4 if case.sparse else 1)  # a gather's selection: a larger cache
    blocks = max(1, -(-pool // bs))
    cache = torch.randn(blocks, bs, case.dim, generator=gen).to(dt).to(device)
    if per_row:
        offsets = torch.arange(case.rows).unsqueeze(1) * region
        indices = (random_topk(region, case.chunk, case.rows, generator=gen) + offsets).to(device)
    elif case.sparse:
        indices = random_topk(blocks * bs, case.chunk, 1, generator=gen)[0].to(device)
    else:
        pages = torch.randperm(blocks, generator=gen)[: -(-case.chunk // bs)]
        # int32, as a serving engine's block table: a kernel that takes it (triton, FlashMLA)
        # converts nothing inside the timed call
        indices = DensePages(pages.to(device=device, dtype=torch.int32), case.chunk)
    return {"cache": cache, "indices": indices}


def _attention_inputs(case: KernelCase, device: str, gen: torch.Generator) -> dict:
    inputs = _paged_inputs(case, device, gen, per_row=case.sparse)
    q = torch.randn(case.rows, case.heads, case.dim, generator=gen)
    inputs["q"] = q.to(TORCH_DTYPES[case.dtype]).to(device)
    return inputs


def _gather_inputs(case: KernelCase, device: str, gen: torch.Generator) -> dict:
    """Packed into a staging buffer allocated once, as a holder does."""
    inputs = _paged_inputs(case, device, gen, per_row=False)
    dt = TORCH_DTYPES[case.dtype]
    inputs["staging"] = torch.empty(case.chunk, case.dim, dtype=dt, device=device)
    return inputs


def input_bytes(inputs) -> int:
    tensors = [t for v in inputs.values() for t in (v if isinstance(v, list) else [v])]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def cache_bytes(device: str) -> int:
    """The last cache level inputs must outgrow to be read from memory: the GPU's L2 (50 MB
    on an H100), or the CPU's last-level cache."""
    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)
    return llc_bytes()


# Sets past the 8 fresh ones are copies (cold memory costs a copy, not a draw), within this
# much memory: a host whose last-level cache is huge rotates over less than twice it.
MAX_ROTATION_BYTES = 512 * 2**20
FRESH_SETS = 8


def cold_set_count(touched_bytes: int, set_bytes: int, cache: int) -> int:
    """Sets enough that the pages the calls touch add up to twice ``cache``, within
    ``MAX_ROTATION_BYTES`` of sets of ``set_bytes`` each."""
    wanted = math.ceil(2 * cache / max(touched_bytes, 1))
    return max(1, min(wanted, MAX_ROTATION_BYTES // max(set_bytes, 1)))


def input_sets(case: KernelCase, device: str, seed: int) -> list[dict]:
    """The input sets a case rotates through: up to 8 fresh ones, together over twice the
    last cache where 8 can; a serving cache's pages always over it (copies added)."""
    first = make_inputs(case, device, seed)
    cache = cache_bytes(device)
    fresh = max(1, min(FRESH_SETS, math.ceil(2 * cache / max(input_bytes(first), 1))))
    sets = [first] + [make_inputs(case, device, seed + i) for i in range(1, fresh)]
    shared = set(case.spec.shared_inputs)
    for inputs in sets[1:]:
        inputs.update({k: first[k] for k in shared})
    if case.spec.cold_pages:
        own = input_bytes({k: v for k, v in first.items() if k not in shared})
        touched = case.chunk * (case.rows if case.sparse else 1) * case.dim * case.elem
        count = cold_set_count(touched, own, cache)
        for i in range(fresh, count):
            sets.append(
                {
                    k: v.clone() if torch.is_tensor(v) and k not in shared else v
                    for k, v in sets[i % fresh].items()
                }
            )
    return sets


def case_runner(case: KernelCase, backend_name: str, scale: float):
    return case.spec.runner(case, backend_name, scale)


def _attention_runner(case: KernelCase, backend_name: str, scale: float):
    backend = get_backend(backend_name)
    return lambda x: backend.partial_attention(x["q"], x["cache"], x["indices"], scale, case.v_dim)


def _merge_runner(case: KernelCase, backend_name: str, scale: float):
    backend = get_backend(backend_name)
    return lambda x: backend.merge_partials(x["outs"], x["lses"])


def _gather_runner(case: KernelCase, backend_name: str, scale: float):
    return lambda x: gather_kv(x["cache"], x["indices"], backend=backend_name, out=x["staging"])


def _splice_runner(case: KernelCase, backend_name: str, scale: float):
    backend = get_backend(backend_name)
    return lambda x: backend.splice_kv(
        x["target"], x["packed"], x["pages"], 1024, case.rope_dim, None
    )


def _prefill_runner(case: KernelCase, backend_name: str, scale: float):
    # attention's part of a prefill, as torch runs it on this device (flash kernels on
    # GPUs, its fused CPU kernel here): the term that grows with the square of the length
    scale = 1 / math.sqrt(case.dim)
    return lambda x: torch.nn.functional.scaled_dot_product_attention(
        x["q"], x["k"], x["v"], is_causal=True, scale=scale
    )


SPECS = {
    spec.name: spec
    for spec in (
        KernelSpec(
            "partial_attention", _attention_bytes, _attention_flops, _attention_inputs,
            _attention_runner, cold_pages=True, every_rows=True,
        ),
        KernelSpec(
            "merge", _merge_bytes, _merge_flops, _merge_inputs, _merge_runner,
            merges_partials=True, every_rows=True,
        ),
        KernelSpec("gather", _moved_bytes, lambda case: 0, _gather_inputs, _gather_runner),
        KernelSpec(
            "splice", _moved_bytes, _splice_flops, _splice_inputs, _splice_runner,
            cold_pages=True,
            # a splice reads the landing buffer the transfer has just written (one buffer,
            # in cache) and writes free pages that are not: only the targets rotate
            shared_inputs=("packed",),
        ),
        KernelSpec("prefill", _prefill_bytes, _prefill_flops, _prefill_inputs, _prefill_runner),
    )
}  # fmt: skip
KERNELS = tuple(SPECS)


def time_case(
    case: KernelCase,
    backend: str,
    device: str,
    scale: float,
    *,
    samples: int,
    warmups: int,
    min_sample_s: float,
    seed: int = 0,
    launch: str = "eager",
    runner=None,
):
    """[(calls, warm-up?, seconds per call)] for one case (no collector pauses in it)."""
    with collector_paused():
        return _time_case(
            case, backend, device, scale, samples, warmups, min_sample_s, seed, launch, runner
        )


def _time_case(case, backend, device, scale, samples, warmups, min_sample_s, seed, launch, runner):
    sets = input_sets(case, device, seed)
    run = runner or case_runner(case, backend, scale)  # a runner: a reference timed alike
    clock = Clock(device)
    if case.after or case.idle_us or case.wait_us or case.after_splice:
        # each call timed alone after what precedes it; on a GPU as the back-to-back twin
        # is launched (a graph replay of the one call, or the call itself), so the launch's
        # cost does not pass for the effect of what came before
        one = _SingleCalls(clock, sets, run, launch)
        if case.after:
            return _time_after_attention(
                case, backend, device, scale, clock, one, samples, warmups, min_sample_s, seed
            )
        if case.idle_us:
            return _time_after_idle(case, clock, one, samples, warmups, min_sample_s)
        if case.wait_us:
            return _time_after_wait(case, clock, one, samples, warmups, min_sample_s)
        return _time_after_splice(
            case, backend, device, clock, sets, one, samples, warmups, min_sample_s
        )

    def call(i):
        run(sets[i % len(sets)])

    # the first call compiles (Triton, NVRTC), tunes a tile and allocates: a warm-up that
    # says nothing of a call's time (counted from it, a sample held one call), so the calls
    # a sample needs are counted from the second
    results = [(1, True, clock.time(call, 1))]
    elapsed = clock.time(call, 1)
    results.append((1, True, elapsed))
    calls = max(1, min(10_000, math.ceil(min_sample_s / max(elapsed, 1e-9))))
    if launch == "graph":  # one graph replays the sample's calls, inputs rotating as eager
        graph = clock.capture(lambda: [call(i) for i in range(calls)])
        for s in range(warmups + samples):
            results.append((calls, s < warmups, clock.time(lambda i: graph.replay(), 1) / calls))
        return results
    for s in range(warmups + samples):
        results.append((calls, s < warmups, clock.time(call, calls) / calls))
    return results


class _SingleCalls:
    """One call on input set ``k``, as the back-to-back samples launch it: eager, or (GPU,
    graph launches) the replay of a graph holding that one call, captured on first use."""

    def __init__(self, clock: Clock, sets: list, run, launch: str):
        self.clock, self.sets, self.run = clock, sets, run
        self.graphs = {} if clock.cuda and launch == "graph" else None

    def __len__(self) -> int:
        return len(self.sets)

    def __call__(self, k: int) -> None:
        if self.graphs is None:
            self.run(self.sets[k])
            return
        if k not in self.graphs:
            self.graphs[k] = self.clock.capture(lambda: self.run(self.sets[k]))
        self.graphs[k].replay()

    def prepare(self, k: int) -> None:
        """Set ``k``'s graph captured (and run once), untimed, before its first timed call."""
        if self.graphs is not None and k not in self.graphs:
            self(k)

    def timed(self, k: int) -> float:
        """Seconds of the call alone (on a GPU: events around it, queued after what was
        queued before, so only the call is counted)."""
        self.prepare(k)
        return self.clock.time(lambda _: self(k), 1)


def _time_after_attention(case, backend, device, scale, clock, one, samples, warmups, min_s, seed):
    """Each call right after an untimed attention over ``case.after`` tokens; only the call
    is timed (on a GPU: events around it, the attention queued before them)."""
    context = case.context()
    context_sets = input_sets(context, device, seed + 7)
    attend = case_runner(context, backend, scale)

    def timed(i: int) -> float:
        attend(context_sets[i % len(context_sets)])
        return one.timed(i % len(one))

    return _samples_of_timed_calls(timed, samples, warmups, min_s)


def _time_after_splice(case, backend, device, clock, sets, one, samples, warmups, min_s):
    """Each call right after an untimed splice of the chunk into the very pages it attends
    (from one landing buffer, as a fetch's transfer leaves it), as a fetch's first use runs;
    only the call is timed (on CUDA: events around it, the splice queued before them)."""
    splice = get_backend(backend).splice_kv
    first = sets[0]
    landing = torch.randn(
        case.after_splice, case.dim, generator=torch.Generator().manual_seed(17)
    ).to(dtype=first["cache"].dtype, device=first["cache"].device)
    on_cpu = torch.device(device).type == "cpu"
    # the pages each set's attention reads, as the splice takes them (a list on a CPU)
    pages = [x["indices"].pages.tolist() if on_cpu else x["indices"].pages for x in sets]

    def timed(i: int) -> float:
        k = i % len(sets)
        splice(sets[k]["cache"], landing, pages[k], 1024, case.rope_dim, None)
        return one.timed(k)

    return _samples_of_timed_calls(timed, samples, warmups, min_s)


def _samples_of_timed_calls(timed, samples: int, warmups: int, min_s: float):
    """Samples of calls each timed alone by ``timed(i)`` (which also runs what precedes
    the call, untimed): as many calls per sample as the whole cycle takes to fill
    ``min_s``; the first call is also the first warm-up."""
    t0 = time.perf_counter()
    first = timed(0)
    cycle = time.perf_counter() - t0
    results = [(1, True, first)]
    calls = max(1, min(10_000, math.ceil(min_s / max(cycle, 1e-9))))
    for s in range(warmups + samples):
        results.append((calls, s < warmups, sum(timed(i) for i in range(calls)) / calls))
    return results


def _time_after_idle(case, clock, one, samples, warmups, min_s):
    """Each call after ``case.idle_us`` of the timing thread asleep."""
    idle = case.idle_us * 1e-6
    return _time_after(lambda: time.sleep(idle), clock, one, samples, warmups, min_s)


def _time_after_wait(case, clock, one, samples, warmups, min_s):
    """Each call after ``case.wait_us`` of the timing thread spinning on the clock, as a
    rank polling MPI for a message does (the core busy, touching almost no memory)."""
    wait = case.wait_us * 1e-6

    def spin():
        until = time.perf_counter() + wait
        while time.perf_counter() < until:
            pass

    return _time_after(spin, clock, one, samples, warmups, min_s)


def _time_after(pause, clock, one, samples, warmups, min_s):
    """Each call after ``pause()``; only the call is timed (on CUDA: events around it, the
    device drained before the pause)."""

    def timed(i: int) -> float:
        k = i % len(one)
        one.prepare(k)  # before the device drains and the pause begins
        if clock.cuda:
            torch.cuda.synchronize()
        pause()
        return one.timed(k)

    return _samples_of_timed_calls(timed, samples, warmups, min_s)


def matmul_dtype(device: str, dtype: str) -> str:
    """The dtype the kernels multiply in here: a CPU without AVX512-BF16 runs bf16 attention
    as fp32 products (see torch_backend), so that is the rate its ceiling should be."""
    if device == "cpu" and dtype == "bf16" and not cpu_bf16.cpu_has_bf16():
        return "fp32"
    return dtype


def measure_ceilings(device: str, dtype: str, *, samples: int = 5) -> dict[str, float]:
    """Copy bandwidth (bytes read + written per second) and matmul rate (FLOP/s) here."""
    clock = Clock(device)
    n_copy = (512 if device.startswith("cuda") else 128) * 2**20
    src = torch.ones(n_copy // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_t = []
    for _ in range(samples + 1):
        copy_t.append(clock.time(lambda i: dst.copy_(src), 3) / 3)
    mm_dtype = matmul_dtype(device, dtype)
    dt = TORCH_DTYPES[mm_dtype]
    n = 8192 if device.startswith("cuda") else 256
    while True:  # on CPU: the smallest n up to 2048 whose product takes 50 ms (bounded time)
        a = torch.randn(n, n, device=device).to(dt)
        b = torch.randn(n, n, device=device).to(dt)
        if (
            device.startswith("cuda")
            or n >= 2048
            or clock.time(lambda i, a=a, b=b: torch.mm(a, b), 1) > 0.05
        ):
            break
        n *= 2
    mm_t = []
    for _ in range(samples + 1):
        mm_t.append(clock.time(lambda i: torch.mm(a, b), 2) / 2)
    copy_s, mm_s = sorted(copy_t[1:])[samples // 2], sorted(mm_t[1:])[samples // 2]
    return {
        "copy_bytes_per_s": 2 * n_copy / copy_s,
        "matmul_flops_per_s": 2 * n**3 / mm_s,
        "copy_s": copy_s,
        "matmul_s": mm_s,
        "matmul_n": n,
        "matmul_dtype": mm_dtype,
        "copy_bytes": n_copy,
    }


def plan_cases(
    model: ModelPreset,
    kernels,
    rows,
    chunks,
    dtype: str,
    sparse: bool,
    heads: int | None,
    block_size: int,
    in_context: bool = False,
    idle_us=(),
    merge_wait_us=(),
) -> list[KernelCase]:
    """The cases of a sweep. ``in_context``: merge, gather and splice each follow an attention
    over the chunk (a merge then has one case per rows and chunk, its own chunk 0).
    With ``in_context`` a dense attention at the fewest rows and every chunk is also timed
    right after a splice of its chunk into its pages, as a fetch's first use attends it.
    ``idle_us``: the attention at the fewest rows and every chunk is also timed after each
    of these idle times (its back-to-back case is the sweep's own). ``merge_wait_us``: the
    merge at every rows is also timed after each of these waits, after nothing else."""
    h = heads or model.q_heads

    def decode_case(kernel: str, r: int, c: int, sparse_: bool, **when) -> KernelCase:
        """A case of the decode kernels' shapes (``when``: what precedes each call)."""
        return KernelCase(
            kernel=kernel, rows=r, heads=h, chunk=c, dim=model.qk_dim, v_dim=model.v_dim,
            dtype=dtype, sparse=sparse_, block_size=block_size, rope_dim=model.rope_dim,
            **when,
        )  # fmt: skip

    cases = []
    for kernel in kernels:
        if kernel == "prefill":  # one sequence per length, the model's prefill head shapes
            cases += [
                KernelCase(
                    kernel="prefill",
                    rows=1,
                    heads=h,
                    chunk=c,
                    dim=model.prefill_qk_dim,
                    v_dim=model.prefill_v_dim,
                    dtype=dtype,
                    sparse=False,
                    block_size=block_size,
                    rope_dim=model.rope_dim,
                )  # fmt: skip
                for c in chunks
            ]
            continue
        spliced = kernel == "partial_attention" and in_context and not sparse
        for r in rows if SPECS[kernel].every_rows else [1]:
            merge = kernel == "merge"
            for c in chunks if not merge or in_context else [0]:
                after = c if in_context and kernel != "partial_attention" else 0
                cases.append(
                    decode_case(kernel, r, 0 if merge else c, sparse and not merge, after=after)
                )
                if spliced and r == min(rows):  # right after its twin: a pair close in time
                    cases.append(decode_case(kernel, r, c, False, after_splice=c))
        if kernel == "partial_attention":
            cases += [
                decode_case(kernel, min(rows), c, sparse, idle_us=gap)
                for gap in idle_us
                for c in chunks
            ]
        if kernel == "merge":
            cases += [
                decode_case(kernel, r, 0, False, wait_us=wait)
                for wait in merge_wait_us
                for r in rows
            ]
    return cases


def timing_turns(cases: list[KernelCase]) -> list[int]:
    """The turn that picks each case's timing rank (ranks take turns case by case): its own
    index, but an attention after a splice takes its back-to-back twin's, so the pair the
    fit subtracts is timed on one core (two cores of one machine can differ by more than
    the saving the pair measures)."""
    index = {case: i for i, case in enumerate(cases)}
    return [
        index.get(dataclasses.replace(case, after_splice=0), i) if case.after_splice else i
        for i, case in enumerate(cases)
    ]


def default_device() -> str:
    return os.environ.get("XBENCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def sample_rows(
    case: KernelCase,
    timings,
    run_id: str,
    backend: str,
    device: str,
    model: str,
    round_: int = 0,
    *,
    launch: str = "eager",
    plan: str = "",
) -> list[dict]:
    """kernel_samples rows of one case in one pass over the cases (time per call in us).
    ``launch``: as timed (:func:`timed_launch`); ``plan``: the backend's choice
    (:func:`backend_plan`)."""
    return [
        {
            "run_id": run_id,
            "kernel": case.kernel,
            "backend": backend,
            "device": device,
            "model": model,
            "dtype": case.dtype,
            "rows": case.rows,
            "heads": case.heads,
            "chunk_tokens": case.chunk,
            "sparse": case.sparse,
            "partials": case.partials if case.spec.merges_partials else 1,
            "bytes_moved": case.bytes_moved,
            "flops": case.flops,
            "iterations": calls,
            "sample": i,
            "warmup": warm,
            "metric": "time",
            "value": seconds * 1e6,
            "unit": "us",
            "round": round_,
            "process_run": 0,  # the sweep's launch and timing rank stamp their own
            "timed_by": 0,
            "after_tokens": case.after,
            "idle_us": case.idle_us,
            "wait_us": case.wait_us,
            "after_splice_tokens": case.after_splice,
            "launch": launch,
            "plan": plan,
        }
        for i, (calls, warm, seconds) in enumerate(timings)
    ]


def timed_launch(device: str, launch: str) -> str:
    """How :func:`time_case` launches the calls it times: graphs only on a GPU."""
    return launch if device.startswith("cuda") else "eager"


def backend_plan(backend: str) -> str:
    """What the backend chose for its last attention call (tile, splits), or ""."""
    return getattr(get_backend(backend), "last_plan", "")


def ceiling_rows(ceilings: dict, run_id: str, backend: str, device: str, dtype: str) -> list[dict]:
    """The ceilings as kernel_samples rows, so a run's shares can be recomputed from disk."""
    base = {
        "run_id": run_id,
        "backend": "torch",
        "device": device,
        "model": "-",
        "dtype": dtype,
        "rows": 0,
        "heads": 0,
        "chunk_tokens": 0,
        "sparse": False,
        "partials": 0,
        "iterations": 1,
        "sample": 0,
        "warmup": False,
        "unit": "us",
        "round": 0,
        "process_run": 0,
        "timed_by": 0,
        "after_tokens": 0,
        "idle_us": 0,
        "wait_us": 0,
        "after_splice_tokens": 0,
        "launch": "",
        "plan": "",
    }
    n = ceilings["matmul_n"]
    return [
        {
            **base,
            "kernel": "ceiling_copy",
            "dtype": "fp32",
            "bytes_moved": 2 * ceilings["copy_bytes"],
            "flops": 0,
            "metric": "time",
            "value": ceilings["copy_s"] * 1e6,
        },
        {
            **base,
            "kernel": "ceiling_matmul",
            "dtype": ceilings["matmul_dtype"],
            "bytes_moved": 3 * n * n * TORCH_DTYPES[ceilings["matmul_dtype"]].itemsize,
            "flops": 2 * n**3,
            "metric": "time",
            "value": ceilings["matmul_s"] * 1e6,
        },
    ]
