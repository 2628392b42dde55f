"""The Triton kernels of the ``triton`` backend (``triton_backend.py`` says what they do).

Their own module, imported on first use: Triton decides when a kernel is defined whether it
runs compiled or under the interpreter (``TRITON_INTERPRET=1``), and the interpreter needs
``tl`` as a module global of the kernel.
"""

import triton
import triton.language as tl

# The split kernel's tiles a GPU chooses among on its first call per shape (triton.autotune):
# (query rows, tokens, warps, pipeline stages, output column parts, page lookahead). The
# first is the preferred tile (the split count is chosen for it): one program per 64 query
# rows holds the whole 64 x 512 fp32 accumulator (128 registers a thread at 8 warps), so the
# 576-wide score is computed once (with some ptxas versions it spills a few hundred bytes a
# thread to L1, which cost less than computing the score twice); 16 x 64 is there for few
# query rows, where a 64-row tile would mostly compute padding. Lookahead 1 (the TMA loop
# of a page table): the next tile's page is looked up while a tile computes, so the copy the
# pipeliner issues at the end of a step waits for no L2 round trip first (without it, the
# lookup and the copy of the next tile sit back to back after the second product). A
# candidate until a GPU run times it faster (`benchmarks/triton_tiles.py`, gpu_check's
# `tiles` step); the tuner times both on a GPU's first call per shape. Their sm_90 compile
# facts (registers, spills, shared memory) are checked by tests/test_triton_sm90.py with
# Triton's own ptxas, no GPU needed.
GPU_TILES = (
    (64, 64, 8, 2, 1, 0),
    (64, 64, 8, 2, 1, 1),
    (16, 64, 4, 2, 1, 0),
)
# under TRITON_INTERPRET (warps and stages mean nothing there): one tile, so nothing is
# tuned, and small, so the tests stay quick; two output parts, so both halves' code runs
INTERPRETER_TILES = ((16, 16, 4, 1, 2, 0),)
# the combine's candidates on a GPU: (output columns a program, splits a step, warps). The
# first is the plain kernel (one program per row, the splits one by one); the others split
# the columns over programs or read several splits at once
COMBINE_TILES = ((512, 1, 4), (128, 1, 1), (128, 1, 4), (64, 8, 2), (32, 16, 1), (128, 16, 4))
INTERPRETER_COMBINE_TILES = ((128, 4, 4),)
COMBINE_TUNED_FOR = ("splits", "total_rows")
# Programmatic dependent launch (Hopper's grid dependency control, Triton >= 3.4): the
# combine is launched while the split kernel still runs, and waits in the GPU for its
# partials, so its launch and start overlap the split kernel's tail. Off until a GPU run
# times it faster (`benchmarks/triton_tiles.py --pdl off on`, gpu_check's `tiles` step)
COMBINE_PDL = False
HAS_GDC = hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")
# what a tuned tile is chosen for: the shape (dtypes count too)
TUNED_FOR = ("rows_per_group", "idx_group_stride", "n_selected", "tokens_per_split", "total_rows")


@triton.jit
def _round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), still as fp32; finite inputs."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


LOG2E = tl.constexpr(1.4426950408889634)  # the softmax runs in base 2 (the GPU's exp2)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile_tokens(table, tile, stop, BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    """The cache rows of the tile at ``tile`` (int64) and which are selected. ``PAGE`` 0:
    ``table`` holds token indices, -1 padding a sparse selection; otherwise it is a page
    table of PAGE-token pages, whose tokens' addresses are computed (one lookup a tile when
    the tile lies in one page)."""
    offs = tile + tl.arange(0, BLOCK_N)
    in_range = offs < stop
    if PAGE > 0:
        if PAGE % BLOCK_N == 0:
            page = tl.load(table + tile // PAGE)
            token = page.to(tl.int64) * PAGE + tile % PAGE + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(table + offs // PAGE, mask=in_range, other=0)
            token = page.to(tl.int64) * PAGE + offs % PAGE
        valid = in_range
    else:
        token = tl.load(table + offs, mask=in_range, other=-1)
        valid = token >= 0
        token = tl.where(valid, token, 0).to(tl.int64)
    return token, valid


@triton.jit
def _load_tile(
    kv_ptr, token, valid, own, other, rp, DIM: tl.constexpr, LAT: tl.constexpr, VSPLIT: tl.constexpr
):
    """A tile's key columns through pointers (cp.async on a GPU): the accumulated latent
    part, the other latent part (VSPLIT 2) and the RoPE part; rows not ``valid`` read 0."""
    k_own = tl.load(kv_ptr + token[:, None] * DIM + own[None, :], mask=valid[:, None], other=0.0)
    k_rp = tl.load(
        kv_ptr + token[:, None] * DIM + LAT + rp[None, :], mask=valid[:, None], other=0.0
    )
    k_other = k_rp
    if VSPLIT == 2:
        k_other = tl.load(
            kv_ptr + token[:, None] * DIM + other[None, :], mask=valid[:, None], other=0.0
        )
    return k_own, k_rp, k_other


@triton.jit
def _attend(
    q_own,
    q_rp,
    q_other,
    k_own,
    k_rp,
    k_other,
    valid,
    m_i,
    l_i,
    acc,
    qk_scale,
    MASKED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    VSPLIT: tl.constexpr,
):
    """One tile of the online softmax, in base 2 (``m_i`` is log2 of the running maximum):
    the 576-wide score, the rescaled accumulator and the tile's probabilities times V (the
    latent part of the keys). ``MASKED``: some of the tile's tokens may be invalid, and a
    whole tile may be (a padded sparse selection), so the maximum is kept finite."""
    dtype = k_own.dtype
    if UPCAST:
        k_own = k_own.to(tl.float32)
        k_rp = k_rp.to(tl.float32)
        k_other = k_other.to(tl.float32)
    scores = tl.dot(q_own, tl.trans(k_own), input_precision=PRECISION)
    scores += tl.dot(q_rp, tl.trans(k_rp), input_precision=PRECISION)
    if VSPLIT == 2:
        scores += tl.dot(q_other, tl.trans(k_other), input_precision=PRECISION)
    if MASKED:
        scores = tl.where(valid[None, :], scores * qk_scale, float("-inf"))
    else:
        scores = scores * qk_scale
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = m_new  # finite: every row of an unmasked tile has a score
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    # probabilities in the cache dtype, as FlashMLA; the interpreter truncates when it
    # converts, so there the rounding to nearest even is done by hand (a GPU's is native)
    if UPCAST:
        p_cache = _round_to_bf16(p).to(dtype).to(tl.float32)
    else:
        p_cache = p.to(dtype)
    acc = acc * alpha[:, None] + tl.dot(p_cache, k_own, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attend_by_pointers(
    table, tile, stop, kv_ptr, own, other, rp, q_own, q_rp, q_other, m_i, l_i, acc, qk_scale,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, DIM: tl.constexpr, LAT: tl.constexpr,
    VSPLIT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One tile read through pointers, its invalid tokens masked."""
    token, valid = _tile_tokens(table, tile, stop, BLOCK_N, PAGE)
    k_own, k_rp, k_other = _load_tile(kv_ptr, token, valid, own, other, rp, DIM, LAT, VSPLIT)
    return _attend(
        q_own, q_rp, q_other, k_own, k_rp, k_other, valid, m_i, l_i, acc, qk_scale, True,
        UPCAST, PRECISION, VSPLIT,
    )  # fmt: skip


@triton.jit
def _load_query(
    q_ptr, rows, row_ok, own, other, rp, DIM: tl.constexpr, LAT: tl.constexpr,
    VSPLIT: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The query tile's columns this program accumulates, its RoPE part, and (VSPLIT 2)
    the columns it only scores."""
    q_own = tl.load(q_ptr + rows[:, None] * DIM + own[None, :], mask=row_ok[:, None], other=0.0)
    q_rp = tl.load(q_ptr + rows[:, None] * DIM + LAT + rp[None, :], mask=row_ok[:, None], other=0.0)
    q_other = q_rp
    if VSPLIT == 2:
        q_other = tl.load(
            q_ptr + rows[:, None] * DIM + other[None, :], mask=row_ok[:, None], other=0.0
        )
    if UPCAST:
        q_own = q_own.to(tl.float32)
        q_rp = q_rp.to(tl.float32)
        q_other = q_other.to(tl.float32)
    return q_own, q_rp, q_other


@triton.jit
def _attend_whole_tiles(
    table, start, tail, own_desc, rp_desc, v_part, q_own, q_rp, q_other, row_ok, m_i, l_i,
    acc, qk_scale, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, LAT: tl.constexpr,
    VSPLIT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    LOOKAHEAD: tl.constexpr,
):  # fmt: skip
    """The tiles from ``start`` to ``tail``, each BLOCK_N cache rows in a row of one page,
    copied through the tensor descriptors."""
    if LOOKAHEAD:  # the first tile's page; each step then looks up the next one's
        page = tl.load(table + start // PAGE, mask=start < tail, other=0)
    for tile in range(start, tail, BLOCK_N):
        if LOOKAHEAD:
            # the copy of this tile starts from a page looked up a step earlier, so its
            # issue waits for no load (the next page arrives while this tile computes)
            first = page * PAGE + tile % PAGE
            ahead = tile + BLOCK_N
            page = tl.load(table + ahead // PAGE, mask=ahead < tail, other=0)
        else:
            first = tl.load(table + tile // PAGE) * PAGE + tile % PAGE
        k_own = own_desc.load([first, v_part * (LAT // VSPLIT)])
        k_rp = rp_desc.load([first, LAT])
        k_other = k_rp
        if VSPLIT == 2:
            k_other = own_desc.load([first, (1 - v_part) * (LAT // VSPLIT)])
        m_i, l_i, acc = _attend(
            q_own, q_rp, q_other, k_own, k_rp, k_other, row_ok, m_i, l_i, acc, qk_scale,
            False, UPCAST, PRECISION, VSPLIT,
        )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def _store_partial(
    part_out_ptr, part_lse_ptr, base, own, row_ok, local, v_part, m_i, l_i, acc,
    LAT: tl.constexpr, ROUND_OUT: tl.constexpr,
):  # fmt: skip
    """This split's partial output (its columns) and, from one part, its LSE."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if ROUND_OUT:  # one split writes the caller's bf16 output: rounded as the combine does
        out = _round_to_bf16(out)
    # the natural-log LSE the combine and the callers take
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tl.store(
        part_out_ptr + base[:, None] * LAT + own[None, :],
        out.to(part_out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    # one part writes the LSE (the parts add the score's halves in different orders)
    tl.store(part_lse_ptr + base, lse, mask=row_ok & (local * 0 + v_part == 0))


@triton.jit
def split_kernel(
    q_ptr,
    kv_ptr,
    own_desc,
    rp_desc,
    idx_ptr,
    part_out_ptr,
    part_lse_ptr,
    rows_per_group,
    idx_group_stride,
    n_selected,
    tokens_per_split,
    total_rows,
    scale,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VSPLIT: tl.constexpr,
    ROUND_OUT: tl.constexpr,
    DIM: tl.constexpr,
    LAT: tl.constexpr,
    RP: tl.constexpr,
    PAGE: tl.constexpr,
    TMA: tl.constexpr,
    LOOKAHEAD: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    if PDL:  # the combine may start now: it waits in the GPU until this grid has finished
        tl.extra.cuda.gdc_launch_dependents()
    # VSPLIT programs share a tile of query rows, each accumulating LAT / VSPLIT of the
    # output's columns: a 64 x 512 fp32 accumulator takes 128 registers a thread at 8 warps
    # and spills beside the query tile; half of it does not. Each computes the whole score
    # (all 576 columns), so the product q K^T is done VSPLIT times.
    group = tl.program_id(0)
    m_block = tl.program_id(1) // VSPLIT
    v_part = tl.program_id(1) % VSPLIT
    split = tl.program_id(2)
    local = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = local < rows_per_group
    # flattened (decode row, head) query rows; int64, so offsets past 2^31 elements do not wrap
    rows = (group * rows_per_group + local).to(tl.int64)
    own = v_part * (LAT // VSPLIT) + tl.arange(0, LAT // VSPLIT)  # columns accumulated here
    other = (1 - v_part) * (LAT // VSPLIT) + tl.arange(0, LAT // VSPLIT)  # VSPLIT 2: scores only
    rp = tl.arange(0, RP)
    q_own, q_rp, q_other = _load_query(
        q_ptr, rows, row_ok, own, other, rp, DIM, LAT, VSPLIT, UPCAST
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, LAT // VSPLIT], 0.0, tl.float32)
    qk_scale = scale * LOG2E
    start = split * tokens_per_split
    stop = tl.minimum(start + tokens_per_split, n_selected)
    table = idx_ptr + group * idx_group_stride
    if TMA and PAGE % BLOCK_N == 0 and BLOCK_M >= 64:
        # a page table whose pages hold whole tiles: each full tile is BLOCK_N cache rows in
        # a row, copied by the tensor memory accelerator: one thread issues the copy, where
        # cp.async takes 18 masked 16-byte copies a thread with 64-bit addresses. Tiles of 64
        # query rows (warpgroup MMA) only: a 16-row tile's last partial tile, read into
        # registers for mma.sync, spills (tests/test_triton_sm90.py)
        tail = start + (stop - start) // BLOCK_N * BLOCK_N
        m_i, l_i, acc = _attend_whole_tiles(
            table, start, tail, own_desc, rp_desc, v_part, q_own, q_rp, q_other, row_ok, m_i,
            l_i, acc, qk_scale, BLOCK_N, PAGE, LAT, VSPLIT, UPCAST, PRECISION, LOOKAHEAD,
        )  # fmt: skip
        if tail < stop:  # a last partial tile, whose rows past the selection may hold anything
            m_i, l_i, acc = _attend_by_pointers(
                table, tail, stop, kv_ptr, own, other, rp, q_own, q_rp, q_other, m_i, l_i, acc,
                qk_scale, BLOCK_N, PAGE, DIM, LAT, VSPLIT, UPCAST, PRECISION,
            )  # fmt: skip
    else:
        for tile in range(start, stop, BLOCK_N):
            m_i, l_i, acc = _attend_by_pointers(
                table, tile, stop, kv_ptr, own, other, rp, q_own, q_rp, q_other, m_i, l_i, acc,
                qk_scale, BLOCK_N, PAGE, DIM, LAT, VSPLIT, UPCAST, PRECISION,
            )  # fmt: skip
    base = split.to(tl.int64) * total_rows + rows  # one split: the caller's output and LSE
    _store_partial(
        part_out_ptr, part_lse_ptr, base, own, row_ok, local, v_part, m_i, l_i, acc, LAT,
        ROUND_OUT,
    )  # fmt: skip


@triton.jit
def combine_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    lse_ptr,
    splits,
    total_rows,
    LAT: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # launched while the split kernel ran: nothing is read before its writes land
        tl.extra.cuda.gdc_wait()
    # one program per query row and BLOCK_C output columns. BLOCK_S 1: the splits one after
    # another, each a row of BLOCK_C partial columns; otherwise BLOCK_S splits at a time as a
    # [BLOCK_S, BLOCK_C] tile (more loads in flight, a reduction across the splits)
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 elements do not wrap
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    s_off = tl.arange(0, BLOCK_S).to(tl.int64)
    m = float("-inf")
    for s0 in range(0, splits, BLOCK_S):
        s = s0 + s_off
        lse_s = tl.load(part_lse_ptr + s * total_rows + row, mask=s < splits, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse_s, 0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = 0.0
    acc = tl.zeros([BLOCK_C], tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        s = s0 + s_off
        ok = s < splits
        w = tl.exp(
            tl.load(part_lse_ptr + s * total_rows + row, mask=ok, other=float("-inf")) - m_safe
        )
        total += tl.sum(w, 0)
        part = tl.load(
            part_out_ptr + ((s * total_rows + row) * LAT)[:, None] + cols[None, :],
            mask=ok[:, None],
            other=0.0,
        )
        acc += tl.sum(w[:, None] * part, 0)
    empty = total == 0.0
    acc = acc / tl.where(empty, 1.0, total)
    if UPCAST:  # rounded by hand to nearest even, as the GPU's conversion does
        acc = _round_to_bf16(acc)
    tl.store(out_ptr + row * LAT + cols, acc.to(out_ptr.dtype.element_ty))
    if tl.program_id(1) == 0:
        lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, total)))
        tl.store(lse_ptr + row, lse)
