"""The ``gluon`` backend's split kernel: warp-specialized MLA decode for Hopper (sm_90).

The ``triton`` backend's split kernel keeps the tensor cores about 42 % busy (64 rows x
8K-64K on an H200): each step computes the 576-wide score,
waits for it, runs the softmax, waits, then multiplies by V, and the next tile's copy is
issued from the same warps. Here the work is laid out by hand in Gluon (Triton's tile-level
language, where layouts, shared memory, barriers and warp partitions are explicit), as
FlashAttention-3 and FlashMLA do on Hopper. One warp (the loader partition) copies the query
tile once and each tile of 64 cache rows through the tensor memory accelerator into a ring
of ``STAGES`` buffers, looking each tile's page up itself, as far ahead as the ring lets it.
Two warpgroups compute, in one of two layouts (``split_kernel``'s ``LAYOUT``, candidates a
GPU run times: ``XBENCH_GLUON_KERNEL``, ``gluon_backend``):

- ``overlap``: both warpgroups (one partition) compute each score, 32 of its 64 columns
  each; the next tile's score (576 columns, both products issued asynchronously) runs on the
  tensor cores while they do the current tile's online softmax; each then accumulates its
  256 of the output's 512 columns (P in shared memory, V the latent part of the key tile).
- ``scorer`` (FlashMLA's): warpgroup 0 computes each whole score and its softmax and hands
  P to warpgroup 1 through shared memory, whose P V overlaps warpgroup 0's next score (the
  comment above ``_one_warpgroup`` says what that saves).

Same contract as ``triton_mla.split_kernel`` (the partials it writes are combined by its
combine kernel; with one split it writes the caller's output and LSE), for what it
covers: a dense page table of pages holding whole 64-token tiles, bf16, 64 query rows a
program. Gluon has no interpreter: it runs on a Hopper GPU only, and its sm_90
compile facts are checked without one (tests/test_gluon_sm90.py); its numerics are checked on
a GPU (tests/test_gluon_kernels.py, gpu_check's ``gluon`` step).

Written for the Gluon of Triton 3.6 (the GPU machines') to 3.9; Gluon is experimental and
its names move (``thread_barrier`` became ``barrier``, ``async_copy_global_to_shared``
``async_load``).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# a barrier over the partition's warps (Triton 3.6: thread_barrier; later: barrier)
_sync = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# a TMA copy into shared memory (Triton 3.6: async_copy_global_to_shared; later: async_load)
_copy_in = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# The tile is the descriptors' blocks: 64 query rows (one warpgroup MMA's M) x 64 cache rows
LOADER_WARPS: gl.constexpr = gl.constexpr(1)
LOADER_REGS = 24  # the loader only issues copies: the fewest registers a warp may hold
# registers a thread at launch (12 warps, one SM's 64K registers); the partitions then
# rebalance (setmaxnreg): the loader's warpgroup down to LOADER_REGS, the computing
# warpgroups up to (168 * 12 - 24 * 4) / 8 = 240, which their 64 x 256 fp32 share of the
# output (128 registers) and two 64 x 32 scores need
MAXNREG = 168
STAGES = 2  # 72 KB a tile: the query tile, two tiles and P fill 224 of the 227 KB
# the scorer layout: warpgroup 0 is the default partition (4 warps), warpgroup 1 a
# worker with SECOND_REGS registers a thread, which leaves warpgroup 0 the most a thread
# may hold, (168 * 12 - 224 * 4 - 24 * 4) / 4 = 256: its 64 x 256 output columns, two
# whole 64 x 64 scores and P (the layouts' warps: gluon_backend.KERNELS)
SECOND_REGS = 224

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)  # the softmax runs in base 2
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.constexpr_function
def _score_layout(num_warps):
    # a 64 x 64 score: the warpgroups split its 64 columns (32 each)
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, num_warps // 4], instr_shape=[16, 32, 16]
    )


@gluon.constexpr_function
def _out_layout(num_warps):
    # the 64 x 512 output: each warpgroup accumulates 256 columns
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, num_warps // 4], instr_shape=[16, 256, 16]
    )


@gluon.jit
def _loader(descs, buffers, barriers, table_ptr, row0, start, n_tiles, PAGE: gl.constexpr):
    """The copies: the query tile once, then each tile of cache rows into the ring as soon
    as the computing warps have released its buffer."""
    q_own_desc, q_rp_desc, own_desc, rp_desc = descs
    q_own_s, q_rp_s, k_own_s, k_rp_s, _ = buffers
    q_bar, ready, empty = barriers
    LAT: gl.constexpr = own_desc.block_type.shape[1]
    TILE: gl.constexpr = own_desc.block_type.shape[0]
    RING: gl.constexpr = k_own_s.type.shape[0]
    mbarrier.expect(q_bar, q_own_desc.block_type.nbytes + q_rp_desc.block_type.nbytes)
    # rows past the last query row lie past the tensor: the copy fills them with zeros
    _copy_in(q_own_desc, [row0, 0], q_bar, q_own_s)
    _copy_in(q_rp_desc, [row0, LAT], q_bar, q_rp_s)
    for i in range(n_tiles):
        slot = i % RING
        # a barrier starts with its phase 1 complete: the first lap waits for nothing
        mbarrier.wait(empty.index(slot), ((i // RING) & 1) ^ 1)
        tile = start + i * TILE
        first = gl.load(table_ptr + tile // PAGE) * PAGE + tile % PAGE
        mbarrier.expect(ready.index(slot), own_desc.block_type.nbytes + rp_desc.block_type.nbytes)
        _copy_in(own_desc, [first, 0], ready.index(slot), k_own_s.index(slot))
        _copy_in(rp_desc, [first, LAT], ready.index(slot), k_rp_s.index(slot))


@gluon.jit
def _score(q_own_s, q_rp_s, k_own, k_rp, num_warps: gl.constexpr):
    """q K^T over the 576 columns, issued asynchronously (512 latent + 64 RoPE)."""
    # the accumulator's initial value is ignored (use_acc=False): made here, it holds no
    # registers across the loop
    S_LAYOUT: gl.constexpr = _score_layout(num_warps)
    ROWS: gl.constexpr = q_own_s.type.shape[0]
    TILE: gl.constexpr = k_own.type.shape[0]
    zero = gl.zeros([ROWS, TILE], gl.float32, S_LAYOUT)
    s = warpgroup_mma(q_own_s, k_own.permute((1, 0)), zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_rp_s, k_rp.permute((1, 0)), s, is_async=True)


@gluon.jit
def _zero_rows_from(v_s, first_invalid, num_warps: gl.constexpr):
    """Rows ``first_invalid`` on of a tile in shared memory set to 0: the last tile's rows
    past the selection hold whatever the page held (NaN in the tests), and a probability
    of 0 times NaN would still be NaN."""
    ROWS: gl.constexpr = v_s.type.shape[0]
    COLS: gl.constexpr = v_s.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    row = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    for c in gl.static_range(COLS // 64):
        chunk = v_s.slice(c * 64, 64, dim=1)
        values = chunk.load(layout)
        chunk.store(gl.where((row < first_invalid)[:, None], values, gl.zeros_like(values)))


@gluon.jit
def _softmax_and_pv(
    scores, m_i, l_i, acc, p_s, v_s, tile, stop, qk_scale, LAST: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """One tile's online softmax in base 2 (``m_i``: log2 of the running maximum), the
    accumulator rescaled, and its probabilities times V issued asynchronously. ``LAST``:
    the split's last tile, the only one that may end past the selection (a split holds
    whole tiles, the last split the selection's end)."""
    S_LAYOUT: gl.constexpr = _score_layout(num_warps)
    O_LAYOUT: gl.constexpr = _out_layout(num_warps)
    TILE: gl.constexpr = v_s.type.shape[0]
    if LAST:
        token = tile + gl.arange(0, TILE, layout=gl.SliceLayout(0, S_LAYOUT))
        scores = gl.where((token < stop)[None, :], scores * qk_scale, float("-inf"))
    else:
        scores = scores * qk_scale
    m_new = gl.maximum(m_i, gl.max(scores, 1))  # finite: every tile has a selected token
    p = gl.exp2(scores - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    if LAST:
        if tile + TILE > stop:
            _zero_rows_from(v_s, stop - tile, num_warps)
    # probabilities in the cache dtype, as FlashMLA; both warpgroups' halves written (and
    # seen by the tensor cores' proxy) before either multiplies
    p_s.store(p.to(p_s.dtype))
    fence_async_shared()
    _sync()
    acc = warpgroup_mma(p_s, v_s, acc, is_async=True)
    return m_new, l_i, acc


@gluon.jit
def _compute(buffers, barriers, outputs, span, qk_scale, num_warps: gl.constexpr):
    """The two warpgroups: tile i's softmax and P V while tile i + 1's score computes."""
    q_own_s, q_rp_s, k_own_s, k_rp_s, p_s = buffers
    q_bar, ready, empty = barriers
    part_out_ptr, part_lse_ptr, row0, split, total_rows = outputs
    start, stop, n_tiles = span
    S_LAYOUT: gl.constexpr = _score_layout(num_warps)
    O_LAYOUT: gl.constexpr = _out_layout(num_warps)
    ROWS: gl.constexpr = q_own_s.type.shape[0]
    LAT: gl.constexpr = q_own_s.type.shape[1]
    TILE: gl.constexpr = k_own_s.type.shape[1]
    RING: gl.constexpr = k_own_s.type.shape[0]
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([ROWS, LAT], gl.float32, O_LAYOUT)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    scores = _score(q_own_s, q_rp_s, k_own_s.index(0), k_rp_s.index(0), num_warps)
    scores = warpgroup_mma_wait(0, deps=(scores,))
    for i in range(n_tiles - 1):
        slot = i % RING
        ahead = (i + 1) % RING
        mbarrier.wait(ready.index(ahead), ((i + 1) // RING) & 1)
        following = _score(q_own_s, q_rp_s, k_own_s.index(ahead), k_rp_s.index(ahead), num_warps)
        m_i, l_i, acc = _softmax_and_pv(
            scores, m_i, l_i, acc, p_s, k_own_s.index(slot), start + i * TILE, stop, qk_scale,
            False, num_warps,
        )  # fmt: skip
        scores, acc = warpgroup_mma_wait(0, deps=(following, acc))
        # both warpgroups are done with this tile's buffer (and with P) before it is given
        # back: one thread of the partition arrives
        _sync()
        mbarrier.arrive(empty.index(slot), count=1)
    last = n_tiles - 1
    m_i, l_i, acc = _softmax_and_pv(
        scores, m_i, l_i, acc, p_s, k_own_s.index(last % RING), start + last * TILE, stop,
        qk_scale, True, num_warps,
    )  # fmt: skip
    acc = warpgroup_mma_wait(0, deps=(acc,))
    # the natural-log LSE and the normalised output, as the triton split kernel writes them
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))[:, None]
    lse = (m_i + gl.log2(l_i)) * LN2
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))
    cols = gl.arange(0, LAT, layout=gl.SliceLayout(0, O_LAYOUT))
    base = split.to(gl.int64) * total_rows + rows  # int64: splits x rows x 512 may pass 2^31
    gl.store(
        part_out_ptr + base[:, None] * LAT + cols[None, :],
        out.to(part_out_ptr.dtype.element_ty),
        mask=(rows < total_rows)[:, None],
    )
    lse_rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(
        part_lse_ptr + split.to(gl.int64) * total_rows + lse_rows, lse, mask=lse_rows < total_rows
    )


@gluon.jit
def _tokens(tokens_per_split, n_selected, TILE: gl.constexpr):
    """This program's split: (split, its first token, its end, its tiles: at least one)."""
    split = gl.program_id(1)
    start = split * tokens_per_split
    stop = gl.minimum(start + tokens_per_split, n_selected)
    return split, start, stop, gl.cdiv(stop - start, TILE)


@gluon.jit
def _buffers_and_barriers(descs, STAGES: gl.constexpr, RELEASES: gl.constexpr):
    """Shared memory (the query tile, a ring of STAGES cache tiles, P) and the barriers
    the loader and the computing warps meet at: the query tile's, and each slot's ``ready``
    (its copy landed) and ``empty`` (RELEASES partitions are done with it)."""
    q_own_desc, q_rp_desc, own_desc, rp_desc = descs
    ROWS: gl.constexpr = q_own_desc.block_type.shape[0]
    TILE: gl.constexpr = own_desc.block_type.shape[0]
    dtype: gl.constexpr = own_desc.dtype
    buffers = (
        gl.allocate_shared_memory(dtype, q_own_desc.block_type.shape, q_own_desc.layout),
        gl.allocate_shared_memory(dtype, q_rp_desc.block_type.shape, q_rp_desc.layout),
        gl.allocate_shared_memory(dtype, [STAGES] + own_desc.block_type.shape, own_desc.layout),
        gl.allocate_shared_memory(dtype, [STAGES] + rp_desc.block_type.shape, rp_desc.layout),
        gl.allocate_shared_memory(
            dtype, [ROWS, TILE], gl.NVMMASharedLayout.get_default_for([ROWS, TILE], dtype)
        ),
    )
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=RELEASES)
    return buffers, (q_bar, ready, empty)


# ---- the second layout: one warpgroup scores, both multiply (FlashMLA's on Hopper) -------
#
# Above, both warpgroups compute every score, each 32 of its 64 columns, so each reads the
# whole query tile from shared memory for half the product (m64n32 instructions) and the
# softmax's row maxima cross warpgroups. Here warpgroup 0 computes the whole score (m64n64),
# runs the softmax on whole rows, multiplies its 256 output columns with P from its own
# registers, and hands P and the rescale to warpgroup 1 through shared memory; warpgroup 1's
# P V then overlaps warpgroup 0's next score. 27 % less shared-memory traffic a tile.


@gluon.constexpr_function
def _one_warpgroup(n):
    # an MMA of 64 rows x n columns on one warpgroup's four warps
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _store_columns(acc, l_i, part_out_ptr, row0, split, total_rows, first_col, LAT: gl.constexpr):
    """A warpgroup's output columns, normalised, where the split's rows go."""
    O_LAYOUT: gl.constexpr = acc.type.layout
    ROWS: gl.constexpr = acc.type.shape[0]
    COLS: gl.constexpr = acc.type.shape[1]
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))[:, None]
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))
    cols = first_col + gl.arange(0, COLS, layout=gl.SliceLayout(0, O_LAYOUT))
    base = split.to(gl.int64) * total_rows + rows  # int64: splits x rows x 512 may pass 2^31
    gl.store(
        part_out_ptr + base[:, None] * LAT + cols[None, :],
        out.to(part_out_ptr.dtype.element_ty),
        mask=(rows < total_rows)[:, None],
    )


@gluon.jit
def _whole_score(q_own_s, q_rp_s, k_own, k_rp):
    """q K^T over the 576 columns on one warpgroup, issued asynchronously."""
    S_LAYOUT: gl.constexpr = _one_warpgroup(k_own.type.shape[0])
    ROWS: gl.constexpr = q_own_s.type.shape[0]
    TILE: gl.constexpr = k_own.type.shape[0]
    zero = gl.zeros([ROWS, TILE], gl.float32, S_LAYOUT)
    s = warpgroup_mma(q_own_s, k_own.permute((1, 0)), zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_rp_s, k_rp.permute((1, 0)), s, is_async=True)


@gluon.jit
def _softmax_and_hand_over(
    scores, m_i, l_i, acc, p_s, row_s, v_s, p_ready, p_free, i, tile, stop, qk_scale,
    LAST: gl.constexpr,
):  # fmt: skip
    """Warpgroup 0's step: the softmax of a tile's whole rows, P and the rescale handed to
    warpgroup 1 (once it has used the last ones), its own columns rescaled and P V issued
    with P from its registers."""
    S_LAYOUT: gl.constexpr = scores.type.layout
    O_LAYOUT: gl.constexpr = acc.type.layout
    TILE: gl.constexpr = scores.type.shape[1]
    HALF: gl.constexpr = acc.type.shape[1]
    if LAST:
        token = tile + gl.arange(0, TILE, layout=gl.SliceLayout(0, S_LAYOUT))
        scores = gl.where((token < stop)[None, :], scores * qk_scale, float("-inf"))
    else:
        scores = scores * qk_scale
    m_new = gl.maximum(m_i, gl.max(scores, 1))  # finite: every tile has a selected token
    p = gl.exp2(scores - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    p_cache = p.to(p_s.dtype)  # probabilities in the cache dtype, as FlashMLA
    if LAST:
        if tile + TILE > stop:
            _zero_rows_from(v_s, stop - tile, 4)
    # warpgroup 1 multiplied by the last P and read its rescale (the wait for step i - 1's
    # completion of p_free; at step 0 the barrier's initial phase lets it through)
    mbarrier.wait(p_free, (i & 1) ^ 1)
    p_s.store(p_cache)
    row_s.store(alpha)
    fence_async_shared()
    _sync()
    mbarrier.arrive(p_ready, count=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    p_operand = gl.convert_layout(
        p_cache, gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    )
    acc = warpgroup_mma(p_operand, v_s.slice(0, HALF, dim=1), acc, is_async=True)
    return m_new, l_i, acc


@gluon.jit
def _scorer(buffers, barriers, hand_over, outputs, span, qk_scale):
    """Warpgroup 0: tile i's softmax while tile i + 1's score computes; its 256 columns."""
    q_own_s, q_rp_s, k_own_s, k_rp_s, p_s = buffers
    q_bar, ready, empty = barriers
    row_s, p_ready, p_free, l_ready = hand_over
    part_out_ptr, part_lse_ptr, row0, split, total_rows = outputs
    start, stop, n_tiles = span
    ROWS: gl.constexpr = q_own_s.type.shape[0]
    TILE: gl.constexpr = k_own_s.type.shape[1]
    LAT: gl.constexpr = k_own_s.type.shape[2]
    RING: gl.constexpr = k_own_s.type.shape[0]
    S_LAYOUT: gl.constexpr = _one_warpgroup(TILE)
    O_LAYOUT: gl.constexpr = _one_warpgroup(LAT // 2)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([ROWS, LAT // 2], gl.float32, O_LAYOUT)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    scores = _whole_score(q_own_s, q_rp_s, k_own_s.index(0), k_rp_s.index(0))
    scores = warpgroup_mma_wait(0, deps=(scores,))
    for i in range(n_tiles - 1):
        slot = i % RING
        ahead = (i + 1) % RING
        mbarrier.wait(ready.index(ahead), ((i + 1) // RING) & 1)
        following = _whole_score(q_own_s, q_rp_s, k_own_s.index(ahead), k_rp_s.index(ahead))
        m_i, l_i, acc = _softmax_and_hand_over(
            scores, m_i, l_i, acc, p_s, row_s, k_own_s.index(slot), p_ready, p_free, i,
            start + i * TILE, stop, qk_scale, False,
        )  # fmt: skip
        scores, acc = warpgroup_mma_wait(0, deps=(following, acc))
        _sync()  # the warpgroup's score and P V of this buffer are done
        mbarrier.arrive(empty.index(slot), count=1)
    last = n_tiles - 1
    m_i, l_i, acc = _softmax_and_hand_over(
        scores, m_i, l_i, acc, p_s, row_s, k_own_s.index(last % RING), p_ready, p_free, last,
        start + last * TILE, stop, qk_scale, True,
    )  # fmt: skip
    acc = warpgroup_mma_wait(0, deps=(acc,))
    # the running sum for warpgroup 1's normalisation, once it has read the last rescale
    mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
    row_s.store(l_i)
    _sync()
    mbarrier.arrive(l_ready, count=1)
    _store_columns(acc, l_i, part_out_ptr, row0, split, total_rows, 0, LAT)
    lse = (m_i + gl.log2(l_i)) * LN2
    lse_rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(
        part_lse_ptr + split.to(gl.int64) * total_rows + lse_rows, lse, mask=lse_rows < total_rows
    )


@gluon.jit
def _second_half(buffers, barriers, hand_over, outputs, n_tiles):
    """Warpgroup 1: its 256 columns, each tile's P and rescale from warpgroup 0."""
    _, _, k_own_s, _, p_s = buffers
    _, _, empty = barriers
    row_s, p_ready, p_free, l_ready = hand_over
    part_out_ptr, _, row0, split, total_rows = outputs
    ROWS: gl.constexpr = p_s.type.shape[0]
    LAT: gl.constexpr = k_own_s.type.shape[2]
    HALF: gl.constexpr = LAT // 2
    RING: gl.constexpr = k_own_s.type.shape[0]
    O_LAYOUT: gl.constexpr = _one_warpgroup(HALF)
    acc = gl.zeros([ROWS, HALF], gl.float32, O_LAYOUT)
    for i in range(n_tiles):
        slot = i % RING
        mbarrier.wait(p_ready, i & 1)
        alpha = row_s.load(gl.SliceLayout(1, O_LAYOUT))
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_s, k_own_s.index(slot).slice(HALF, HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        _sync()  # P, the rescale and this buffer are no longer read here
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(empty.index(slot), count=1)
    mbarrier.wait(l_ready, 0)
    l_i = row_s.load(gl.SliceLayout(1, O_LAYOUT))
    _store_columns(acc, l_i, part_out_ptr, row0, split, total_rows, HALF, LAT)


# ---- the kernel: either layout ------------------------------------------------------------


@gluon.jit
def split_kernel(
    q_own_desc,
    q_rp_desc,
    own_desc,
    rp_desc,
    table_ptr,
    part_out_ptr,
    part_lse_ptr,
    n_selected,
    tokens_per_split,
    total_rows,
    scale,
    PAGE: gl.constexpr,
    STAGES: gl.constexpr,
    LOADER_REGS: gl.constexpr,
    LAYOUT: gl.constexpr,
    SECOND_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Grid (query-row tiles, splits): split ``program_id(1)``'s share of the tokens (at
    least one) for 64 query rows, written as ``triton_mla.split_kernel`` writes it.
    ``LAYOUT``: ``"overlap"`` (the default partition is both warpgroups: ``num_warps`` 8)
    or ``"scorer"`` (FlashMLA's: warpgroup 0 the default partition, ``num_warps`` 4, and
    warpgroup 1 a worker with SECOND_REGS registers a thread)."""
    descs = (q_own_desc, q_rp_desc, own_desc, rp_desc)
    ROWS: gl.constexpr = q_own_desc.block_type.shape[0]
    row0 = gl.program_id(0) * ROWS
    split, start, stop, n_tiles = _tokens(
        tokens_per_split, n_selected, own_desc.block_type.shape[0]
    )
    qk_scale = scale * LOG2E
    # where the results go, and this split's tokens (start, end, tiles)
    outputs = (part_out_ptr, part_lse_ptr, row0, split, total_rows)
    span = (start, stop, n_tiles)
    if LAYOUT == "scorer":
        buffers, barriers = _buffers_and_barriers(descs, STAGES, 2)  # both warpgroups give back
        # a row's rescale each step, then its softmax sum; P, the rescale and the sum ready
        # for warpgroup 1, and P and the rescale used by it
        row_s = gl.allocate_shared_memory(gl.float32, [ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(p_ready, count=1)
        mbarrier.init(p_free, count=1)
        mbarrier.init(l_ready, count=1)
        hand_over = (row_s, p_ready, p_free, l_ready)
        gl.warp_specialize(
            [
                (_scorer, (buffers, barriers, hand_over, outputs, span, qk_scale)),
                (_second_half, (buffers, barriers, hand_over, outputs, n_tiles)),
                (_loader, (descs, buffers, barriers, table_ptr, row0, start, n_tiles, PAGE)),
            ],
            [4, LOADER_WARPS],
            [SECOND_REGS, LOADER_REGS],
        )
    else:
        buffers, barriers = _buffers_and_barriers(descs, STAGES, 1)
        gl.warp_specialize(
            [
                (_compute, (buffers, barriers, outputs, span, qk_scale, num_warps)),
                (_loader, (descs, buffers, barriers, table_ptr, row0, start, n_tiles, PAGE)),
            ],
            [LOADER_WARPS],
            [LOADER_REGS],
        )
