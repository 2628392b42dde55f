"""The ``triton`` backend: split-KV MLA partial attention for Hopper-class GPUs.

Absorbed MLA decode has one KV head: every query row (decode token x head) reads the same
576-wide cache rows, so the kernel flattens rows x heads into the M dimension of a tile
(all of them for a dense page table, one row's heads for a per-row sparse selection) and
reads each selected cache row once per tile, not once per head. A dense selection arrives
as its page table and the kernel computes each token's address (one lookup a tile when a
tile lies in one page), and a 64-row tile's whole tiles of tokens are copied by the tensor
memory accelerator (TMA) through two descriptors of the cache; a sparse one as token
indices, -1 padding, gathered row by row. The key tile is split 512 +
64 (latent + RoPE); V is the latent part of the key tile already loaded. Tokens are split
over programs (split-KV) so a single decode row still fills the GPU; each split keeps an fp32
online softmax and writes a normalised fp32 partial with its LSE, and a second kernel
combines the splits by LSE (rows x column chunks), writing the caller's ``out`` (fp32 or
bf16) and ``lse``; with one split the split kernel writes them itself and nothing combines.

The split count is the one with the least estimated time: the products take whole waves
of programs over the SMs, and every split adds fp32 partials written and read back (with
132 splits at one row they outweighed the KV read; with 17 the GPU sat three-quarters idle).
The tile (query rows x tokens, warps, stages, output parts) is tuned on the GPU among
candidates whose sm_90 compile facts are checked in the tests (``triton_mla.GPU_TILES``).

Numerics as FlashMLA's: bf16 products accumulate in fp32; probabilities enter the second
product in the cache dtype. Under ``TRITON_INTERPRET=1`` (CPU tensors, for tests) ``tl.dot``
of two bf16 operands returns garbage, so the interpreter path upcasts both operands to fp32
after the same roundings (the ``UPCAST`` constexpr); bf16 tensor-core numerics are checked
on a GPU.

merge, gather and splice come from the torch backend.
"""

from __future__ import annotations

import functools
import math
import os
import time

from xbench.kernels.backend import BackendUnavailable, TorchFallbacks
from xbench.kernels.selection import DensePages

LATENT = 512  # the MLA latent width (V); the rest of the 576-wide row is RoPE
ROPE = 64
# What the split count is chosen by (ratios matter, not the figures): one program's rate
# through the products, about what the best tile reaches on a Hopper GPU, and the copy rate
# at which the fp32 partials are written and read back.
PROGRAM_FLOPS = 1.5e12
COPY_RATE = 3.0e12


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _tiles() -> tuple:
    from xbench.kernels import triton_mla

    return triton_mla.INTERPRETER_TILES if interpreting() else triton_mla.GPU_TILES


def tile_fields(tile) -> tuple:
    """A tile as (query rows, tokens, warps, stages, output parts, page lookahead 0 or 1);
    five fields mean no lookahead. A ValueError names what a tile is."""
    try:
        fields = tuple(int(v) for v in tile)
    except ValueError:
        fields = ()
    if len(fields) == 5:
        fields += (0,)
    if len(fields) != 6 or fields[4] not in (1, 2) or fields[5] not in (0, 1):
        raise ValueError(
            "a tile is rows,tokens,warps,stages,parts[,lookahead] with parts 1 or 2 and "
            f"lookahead 0 or 1, not {','.join(map(str, tile))}"
        )
    return fields


def _host_time(kernel_call, quantiles=None):
    """The tuner's timer under the interpreter, where there is no GPU driver to time with:
    the host's, one call (interpreted tiles are compared for the tests, not for speed)."""
    start = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def _descriptor_blocks(args: dict) -> None:
    """The key tile's copies follow the tile the tuner tries: BLOCK_N cache rows of the
    accumulated latent columns, and of the RoPE columns (the tuner's per-config hook)."""
    args["own_desc"].block_shape = [args["BLOCK_N"], LATENT // args["VSPLIT"]]
    args["rp_desc"].block_shape = [args["BLOCK_N"], ROPE]


def lookahead_acts(block_m: int, block_n: int, page: int, tma: bool) -> bool:
    """Whether a tile's page lookahead changes the split kernel: it acts in the loop of whole
    tiles that a tile of 64 rows or more copies through TMA from a page table (``page``
    tokens a page, a multiple of the tile's ``block_n``) and nowhere else."""
    return bool(tma) and page > 0 and page % block_n == 0 and block_m >= 64


def _pointless_lookahead(configs, named_args, **kwargs) -> list:
    """The tuner's candidates less those whose page lookahead changes nothing here (the
    tuner would time the same kernel twice)."""
    return [
        c
        for c in configs
        if not c.kwargs["LOOKAHEAD"]
        or lookahead_acts(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], kwargs["PAGE"], kwargs["TMA"])
    ]


@functools.cache
def _kernels(tiles: tuple):
    """(split kernel, combine kernel), defined on first use (see ``triton_mla``). The split
    kernel chooses its tile among ``tiles``, the combine among ``COMBINE_TILES``, on their
    first call per shape (triton.autotune; one candidate each under the interpreter, so
    nothing is timed there)."""
    import triton

    from xbench.kernels import triton_mla

    split = triton.autotune(
        configs=[
            triton.Config(
                {"BLOCK_M": m, "BLOCK_N": n, "VSPLIT": parts, "LOOKAHEAD": bool(ahead)},
                num_warps=warps,
                num_stages=stages,
                pre_hook=_descriptor_blocks,
            )
            for m, n, warps, stages, parts, ahead in map(tile_fields, tiles)
        ],
        key=list(triton_mla.TUNED_FOR),
        prune_configs_by={"early_config_prune": _pointless_lookahead},
        do_bench=_host_time if interpreting() else None,  # None: Triton's, on the GPU
    )(triton_mla.split_kernel)
    combine = triton.autotune(
        configs=[
            triton.Config({"BLOCK_C": c, "BLOCK_S": s}, num_warps=warps)
            for c, s, warps in (
                triton_mla.INTERPRETER_COMBINE_TILES if interpreting() else triton_mla.COMBINE_TILES
            )
        ],
        key=list(triton_mla.COMBINE_TUNED_FOR),
        do_bench=_host_time if interpreting() else None,
    )(triton_mla.combine_kernel)
    return split, combine


@functools.lru_cache(maxsize=4096)  # a scan over every count: once per shape, not per call
def choose_splits(
    n_selected: int, programs: int, query_rows: int, sm_count: int, block_n: int
) -> int:
    """Splits over tokens: the count with the least estimated time, products plus partials.

    ``programs``: tiles of query rows (times output parts) before splitting; ``query_rows``:
    rows x heads, each of which writes (and the combine reads back) LATENT fp32 values and an
    LSE per split. The products take whole waves of programs over the SMs, each program its
    share of the tokens; the partials cost their bytes at the copy rate. Few rows over many
    tokens get about one wave of splits, many rows one split (benchmarks/triton_tiles.py
    times the counts against this estimate).
    """
    tiles = max(1, math.ceil(n_selected / block_n))
    flops = query_rows * n_selected * (LATENT + ROPE + LATENT) * 2
    programs = max(programs, 1)

    def estimate(splits: int) -> float:
        waves = math.ceil(programs * splits / sm_count)
        products = waves * flops / (programs * splits) / PROGRAM_FLOPS
        partials = 0.0 if splits == 1 else splits * query_rows * (LATENT + 1) * 4 * 2 / COPY_RATE
        return products + partials

    return min(range(1, tiles + 1), key=estimate)


def describe_plan(split_config, splits: int, combine_config, pdl: bool = False) -> str:
    """What a call ran: the split kernel's tile (query rows x tokens, warps, stages, output
    parts, ``la`` where it looks each tile's page up a step ahead), the split count and,
    with several splits, the combine's layout and whether it was launched dependent on the
    split kernel (``pdl``)."""
    k = split_config.kwargs
    plan = (
        f"tile {k['BLOCK_M']}x{k['BLOCK_N']} w{split_config.num_warps} "
        f"s{split_config.num_stages} p{k['VSPLIT']}{' la' * bool(k.get('LOOKAHEAD'))}, "
        f"{splits} split{'s' * (splits > 1)}"
    )
    if combine_config is not None:
        c = combine_config.kwargs
        plan += f", combine {c['BLOCK_C']}x{c['BLOCK_S']} w{combine_config.num_warps}"
        plan += " pdl" * pdl
    return plan


def pdl_unavailable(torch, device) -> str:
    """Why the combine cannot be launched dependent on the split kernel on ``device`` (a
    sentence), or "" where it can: a CUDA GPU of compute capability 9.0 or more, compiled
    (not interpreted), with a Triton that has grid dependency control."""
    from xbench.kernels import triton_mla

    if device.type != "cuda" or interpreting():
        return "programmatic dependent launch needs a CUDA GPU, compiled (not interpreted)"
    if not triton_mla.HAS_GDC:
        return "this Triton has no grid dependency control (Triton >= 3.4 has)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"programmatic dependent launch needs compute capability 9.0, this GPU has {major}.{minor}"
    return ""


def _combine(
    combine_kernel, part_out, part_lse, out_view, lse_view, round_out: bool, pdl: bool
) -> None:
    """The splits' partial outputs and LSEs combined into the views: one program per query
    row and column chunk (the tuner's choice of chunk); ``pdl``: launched while the split
    kernel runs (its programs wait for the partials in the GPU)."""
    splits, total_rows = part_lse.shape
    launch = {"launch_pdl": True} if pdl else {}  # the interpreter takes no launch options
    combine_kernel[lambda meta: (total_rows, LATENT // meta["BLOCK_C"])](
        part_out,
        part_lse,
        out_view,
        lse_view,
        splits,
        total_rows,
        LAT=LATENT,
        UPCAST=round_out,
        PDL=pdl,
        **launch,
    )


def flat_cache(kv_cache, dim: int):
    """The cache as 2-D rows, contiguous and 16-B aligned (what TMA copies need)."""
    kv_flat = kv_cache.reshape(-1, dim)
    if not kv_flat.is_contiguous():
        kv_flat = kv_flat.contiguous()
    if kv_flat.data_ptr() % 16:  # a view at an odd offset
        kv_flat = kv_flat.clone()
    return kv_flat


def partials(torch, splits: int, total_rows: int, out_view, lse_view):
    """Where the split kernel writes: the output views themselves at one split (nothing
    combines), else fp32 partials and LSEs a split for the combine."""
    if splits == 1:
        return out_view, lse_view
    dev = out_view.device
    return (
        torch.empty(splits, total_rows, LATENT, device=dev, dtype=torch.float32),
        torch.empty(splits, total_rows, device=dev, dtype=torch.float32),
    )


def deliver(result, result_lse, out_view, lse_view):
    """The views the kernels wrote copied into the caller's buffers where they differ."""
    if out_view is not result:
        result.copy_(out_view)
    if lse_view is not result_lse:
        result_lse.copy_(lse_view)
    return result, result_lse


def _refuse_unsupported(q, v_dim: int) -> None:
    """MLA's shapes only, and CPU tensors only under the interpreter."""
    dim = q.shape[-1]
    if v_dim != LATENT or dim != LATENT + ROPE:
        raise BackendUnavailable(
            f"triton: MLA shapes only (576 = 512 latent + 64 RoPE), got {dim} with v_dim {v_dim}",
            "use --backend torch for other head dimensions",
        )
    if q.device.type == "cpu" and not interpreting():
        raise BackendUnavailable(
            "triton: CPU tensors need TRITON_INTERPRET=1", "use --backend torch on CPU"
        )


def _combine_pdl(torch, pdl, splits: int, dev) -> bool:
    """Whether the combine launches dependent on the split kernel: as asked (default
    ``triton_mla.COMBINE_PDL``), where there is a combine and the device can."""
    if pdl is None:
        from xbench.kernels import triton_mla

        pdl = triton_mla.COMBINE_PDL
    return bool(pdl) and splits > 1 and not pdl_unavailable(torch, dev)


def _outputs(torch, out, lse, rows: int, heads: int, dev):
    """(output, LSE) as returned (the caller's where given), and the contiguous views the
    kernels write (copied into the caller's after, where theirs are not contiguous)."""
    result = (
        out
        if out is not None
        else torch.empty(rows, heads, LATENT, device=dev, dtype=torch.float32)
    )
    result_lse = (
        lse if lse is not None else torch.empty(rows, heads, device=dev, dtype=torch.float32)
    )
    out_view = result if result.is_contiguous() else torch.empty_like(result)
    lse_view = result_lse if result_lse.is_contiguous() else torch.empty_like(result_lse)
    return result, result_lse, out_view, lse_view


class TritonBackend(TorchFallbacks):
    """Split-KV partial attention in Triton; CUDA tensors, or CPU tensors when interpreting."""

    name = "triton"
    _plan = None  # (split config, splits, combine config or None, pdl) of the last call

    @property
    def last_plan(self) -> str:
        return describe_plan(*self._plan) if self._plan else ""

    def __init__(self):
        try:
            import torch
            from triton.tools.tensor_descriptor import TensorDescriptor  # Triton >= 3.3
        except ImportError as exc:
            raise BackendUnavailable(
                f"triton: not importable ({exc})",
                "pip install triton (CUDA builds of torch bring it), or use --backend torch",
            ) from None
        if not torch.cuda.is_available() and not interpreting():
            raise BackendUnavailable(
                "triton: no CUDA device here",
                "run on a GPU machine; TRITON_INTERPRET=1 runs it on CPU tensors (slow, for tests)",
            )
        self.torch = torch
        self._descriptor = TensorDescriptor

    def _sm_count(self, device) -> int:
        if device.type == "cuda":
            return self.torch.cuda.get_device_properties(device).multi_processor_count
        return 4  # the interpreter: a few splits, so split and combine are exercised

    def partial_attention(
        self,
        q,
        kv_cache,
        indices,
        scale,
        v_dim,
        *,
        out=None,
        lse=None,
        splits=None,
        tile=None,
        pdl=None,
    ):
        """``splits`` and ``tile`` (rows, tokens, warps, stages, parts[, lookahead]) fix what
        is otherwise chosen: the split count by its estimate, the tile by the tuner among
        ``GPU_TILES`` (``benchmarks/triton_tiles.py`` times them one by one). ``pdl``: launch the combine
        dependent on the split kernel where the device can (default
        ``triton_mla.COMBINE_PDL``); ``last_plan`` says whether it was."""
        torch = self.torch
        rows, heads, dim = q.shape
        _refuse_unsupported(q, v_dim)
        dev = q.device
        idx, groups, rows_per_group, group_stride, n_selected, page = self._selection(
            indices, rows, heads, kv_cache.shape[1], dev
        )
        total_rows = rows * heads
        tiles = _tiles() if tile is None else (tile_fields(tile),)
        splits, per_split = self._split_tokens(
            tiles, splits, n_selected, groups, rows_per_group, total_rows, dev
        )
        q_flat = q.reshape(total_rows, dim).contiguous()
        kv_flat, own_desc, rp_desc, tma = self._cache_operands(kv_cache, dim, page)
        result, result_lse, out_view, lse_view = _outputs(torch, out, lse, rows, heads, dev)
        # bf16 under the interpreter: converted by hand to nearest even (a GPU's is native)
        round_out = interpreting() and out_view.dtype != torch.float32
        part_out, part_lse = partials(torch, splits, total_rows, out_view, lse_view)
        split_kernel, combine_kernel = _kernels(tiles)
        pdl = _combine_pdl(torch, pdl, splits, dev)

        def grid(meta):  # the tuner picks the tile, so the grid follows it
            return (groups, math.ceil(rows_per_group / meta["BLOCK_M"]) * meta["VSPLIT"], splits)

        split_kernel[grid](
            q_flat,
            kv_flat,
            own_desc,
            rp_desc,
            idx,
            part_out,
            part_lse,
            rows_per_group,
            group_stride,
            n_selected,
            per_split,
            total_rows,
            float(scale),
            # bf16 operands under the interpreter: its bf16 dot is broken, upcast after rounding
            UPCAST=interpreting() and kv_cache.dtype == torch.bfloat16,
            # fp32 operands (the interpreter's upcast, or an fp32 cache) multiply in IEEE
            # fp32: Triton's default for them is TF32, 10 mantissa bits
            PRECISION="ieee" if interpreting() or q.dtype == torch.float32 else "tf32",
            ROUND_OUT=splits == 1 and round_out,
            DIM=dim,
            LAT=LATENT,
            RP=ROPE,
            PAGE=page,
            TMA=tma,
            PDL=pdl,
        )
        if splits > 1:
            _combine(combine_kernel, part_out, part_lse, out_view, lse_view, round_out, pdl)
        # the configurations, kept as they are: the text is made only when a sample asks
        self._plan = (
            split_kernel.best_config,
            splits,
            combine_kernel.best_config if splits > 1 else None,
            pdl,
        )
        return deliver(result, result_lse, out_view, lse_view)

    def _split_tokens(self, tiles, splits, n_selected, groups, rows_per_group, total_rows, dev):
        """(splits, tokens a split): the count given, or estimated for the first (preferred)
        tile, then whole tiles of tokens per split (every candidate's), so no tile
        straddles two splits."""
        block_m, parts = tiles[0][0], tiles[0][4]
        block_n = max(t[1] for t in tiles)
        if splits is None:
            splits = choose_splits(
                n_selected,
                groups * math.ceil(rows_per_group / block_m) * parts,
                total_rows,
                self._sm_count(dev),
                block_n,
            )
        splits = max(1, int(splits))
        per_split = block_n * math.ceil(max(n_selected, 1) / (splits * block_n))
        return max(1, math.ceil(max(n_selected, 1) / per_split)), per_split

    def _selection(self, indices, rows: int, heads: int, block_size: int, dev):
        """What the kernel reads for the tokens each row attends: (idx, groups, rows per
        group, the stride between groups' selections, tokens selected, page: 0 when idx
        holds token indices, else the tokens a page of idx holds)."""
        torch = self.torch
        if isinstance(indices, DensePages):  # every row attends the same tokens: one group
            # the page table itself (as FlashMLA's int32 block table): the kernel computes
            # each token's address, so no per-call list of token indices is built
            idx = indices.pages.to(device=dev, dtype=torch.int32)
            return idx, 1, rows * heads, 0, indices.num_tokens, block_size
        idx = torch.as_tensor(indices).to(device=dev, dtype=torch.int32).contiguous()
        if idx.dim() == 1:  # one token list that every row attends: one group
            return idx, 1, rows * heads, 0, idx.shape[-1], 0
        # per-row selections, -1 padded: one group per decode row
        return idx, rows, heads, idx.shape[1], idx.shape[-1], 0

    def _cache_operands(self, kv_cache, dim: int, page: int):
        """The cache as the kernel reads it: a 2-D tensor (contiguous, 16-B aligned), the
        two TMA descriptors over it (block shapes set by the tuned tile,
        ``_descriptor_blocks``), and whether the tensor memory accelerator copies whole
        tiles of a page table's pages (its coordinates are int32)."""
        kv_flat = flat_cache(kv_cache, dim)
        tma = page > 0 and kv_flat.shape[0] < 2**31
        own_desc, rp_desc = (
            self._descriptor(kv_flat, list(kv_flat.shape), list(kv_flat.stride()), [1, 1])
            for _ in range(2)
        )
        return kv_flat, own_desc, rp_desc, tma
