"""The ``gluon`` backend: the triton backend with a warp-specialized split kernel (Hopper).

Where the call is what ``gluon_mla.split_kernel`` covers (a CUDA GPU of compute capability
9.x, bf16 query and cache, a dense page table of pages holding whole 64-token tiles), the
split kernel is the Gluon one: a loader warp copies tiles through the tensor memory
accelerator while two warpgroups keep the tensor cores busy through the softmax, in one of
two layouts (``KERNELS``; ``gluon_mla`` says how). Everything else is the triton backend's: the split count, the
combine of several splits, and, for calls the kernel does not cover (sparse selections,
other dtypes or pages, other GPUs, the interpreter), the triton split kernel itself.
``last_plan`` says which kernel ran and, where triton's did, why.

A candidate: ``benchmarks/gpu_kernels.py --backends gluon,triton`` (gpu_check's ``gluon``
step) times the two side by side; ``tests/test_gluon_kernels.py`` checks its bits on a GPU.
The layouts are candidates; ``XBENCH_GLUON_KERNEL`` picks one.
"""

from __future__ import annotations

import math
import os

from xbench.kernels.backend import BackendUnavailable
from xbench.kernels.selection import DensePages
from xbench.kernels.triton_backend import (
    LATENT,
    ROPE,
    TritonBackend,
    _combine,
    _kernels,
    _outputs,
    _tiles,
    deliver,
    flat_cache,
    interpreting,
    partials,
    tile_fields,
)

# the kernel's layout in the triton backend's terms (rows, tokens, warps, stages, parts):
# its split count is chosen as for triton's preferred tile, which it shares
TILE = (64, 64, 8, 2, 1)
TMA_ROWS = 2**31  # TMA coordinates are int32: a larger cache is read by triton's kernel
# the warp-specialized layouts of ``gluon_mla.split_kernel`` (its LAYOUT), candidates a GPU
# run times one against the other, the default first, each with its computing partitions'
# warps (the default partition's first; the loader's warp comes on top): ``scorer``
# (FlashMLA's: warpgroup 0 scores, both multiply) and ``overlap`` (one partition of both
# warpgroups, which score half the columns each, the next tile's score under the softmax)
KERNELS = {"scorer": (4, 4), "overlap": (8,)}
KERNEL_VARIABLE = "XBENCH_GLUON_KERNEL"


def kernel_name() -> str:
    """The split kernel the backend runs: ``XBENCH_GLUON_KERNEL``, else the first of KERNELS."""
    name = os.environ.get(KERNEL_VARIABLE, "") or next(iter(KERNELS))
    if name not in KERNELS:
        raise BackendUnavailable(
            f"gluon: {KERNEL_VARIABLE}={name} names no kernel",
            f"set it to one of {', '.join(KERNELS)}, or unset it",
        )
    return name


def not_covered(
    *,
    device_type: str,
    capability: tuple[int, int] | None,
    q_dtype: str,
    cache_dtype: str,
    page: int,
    n_selected: int,
    cache_rows: int,
) -> str:
    """Why the warp-specialized kernel does not take a call (a clause), or "" where it does.
    ``page``: tokens a page of a dense page table, 0 for token indices (a sparse selection)."""
    if interpreting():
        return "Gluon has no interpreter"
    if device_type != "cuda":
        return f"a {device_type} tensor"
    if capability is None or capability[0] != 9:
        got = "?" if capability is None else f"{capability[0]}.{capability[1]}"
        return f"warpgroup MMA is Hopper's (compute capability 9.x), this GPU is {got}"
    if q_dtype != "bfloat16" or cache_dtype != "bfloat16":
        return f"bf16 only, not {q_dtype} x {cache_dtype}"
    if page == 0:
        return "token indices (a sparse selection)"
    if page % TILE[1]:
        return f"pages of {page} tokens (it copies whole {TILE[1]}-token tiles of a page)"
    if n_selected < 1:
        return "no token selected"
    if cache_rows >= TMA_ROWS:
        return f"a cache of {cache_rows} rows (TMA coordinates are int32)"
    return ""


def launch_shape(total_rows: int, splits: int) -> tuple[int, int]:
    """The kernel's grid: 64-row tiles of the query rows, then the splits."""
    return math.ceil(total_rows / TILE[0]), splits


class GluonBackend(TritonBackend):
    """The triton backend, its split kernel Gluon's where ``not_covered`` says nothing."""

    name = "gluon"

    def __init__(self):
        try:
            super().__init__()
        except BackendUnavailable as exc:  # triton's reason, said of this backend
            raise BackendUnavailable(
                "gluon" + exc.problem.removeprefix("triton"), exc.fix
            ) from None
        kernel_name()  # a bad choice is said before any call
        try:
            from triton.experimental.gluon import language  # noqa: F401  (Triton >= 3.4)
        except ImportError as exc:
            raise BackendUnavailable(
                f"gluon: this Triton has no Gluon ({exc})",
                "pip install 'triton>=3.6', or use --backend triton",
            ) from None
        self._why_not = ""
        self._gluon_plan = None

    @property
    def last_plan(self) -> str:
        if self._gluon_plan is None:
            return f"triton ({self._why_not}): {super().last_plan}"
        from xbench.kernels import gluon_mla

        name, splits, combine = self._gluon_plan
        warps = "+".join(map(str, (*KERNELS[name], gluon_mla.LOADER_WARPS.value)))
        plan = (
            f"gluon {name} {TILE[0]}x{TILE[1]} w{warps} s{gluon_mla.STAGES}, "
            f"{splits} split{'s' * (splits > 1)}"
        )
        if combine is not None:
            plan += f", combine {combine.kwargs['BLOCK_C']}x{combine.kwargs['BLOCK_S']}"
        return plan

    def partial_attention(
        self, q, kv_cache, indices, scale, v_dim, *, out=None, lse=None, splits=None
    ):
        """As the triton backend's (``splits`` fixes the count); its tile and the combine's
        launch are triton's where triton's kernel runs."""
        torch = self.torch
        dev = q.device
        if v_dim != LATENT or q.shape[-1] != LATENT + ROPE:  # triton's refusal says which
            return super().partial_attention(q, kv_cache, indices, scale, v_dim)
        page = kv_cache.shape[1] if isinstance(indices, DensePages) else 0
        n_selected = indices.num_tokens if isinstance(indices, DensePages) else 0
        capability = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        self._why_not = not_covered(
            device_type=dev.type,
            capability=capability,
            q_dtype=str(q.dtype).removeprefix("torch."),
            cache_dtype=str(kv_cache.dtype).removeprefix("torch."),
            page=page,
            n_selected=n_selected,
            cache_rows=kv_cache.shape[0] * kv_cache.shape[1],
        )
        if self._why_not:
            self._gluon_plan = None
            return super().partial_attention(
                q, kv_cache, indices, scale, v_dim, out=out, lse=lse, splits=splits
            )
        return self._attend(q, kv_cache, indices, scale, out, lse, splits)

    def _attend(self, q, kv_cache, indices, scale, out, lse, splits):
        import triton
        from triton.compiler.errors import CompilationError
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from xbench.kernels import gluon_mla

        torch = self.torch
        dev = q.device
        rows, heads, dim = q.shape
        total_rows = rows * heads
        idx, _, _, _, n_selected, page = self._selection(
            indices, rows, heads, kv_cache.shape[1], dev
        )
        splits, per_split = self._split_tokens(
            (tile_fields(TILE),), splits, n_selected, 1, total_rows, total_rows, dev
        )
        q_flat = q.reshape(total_rows, dim).contiguous()
        kv_flat = flat_cache(kv_cache, dim)

        def descriptor(tensor, cols):
            layout = gl.NVMMASharedLayout.get_default_for([TILE[0], cols], gl.bfloat16)
            return TensorDescriptor.from_tensor(tensor, [TILE[0], cols], layout)

        result, result_lse, out_view, lse_view = _outputs(torch, out, lse, rows, heads, dev)
        part_out, part_lse = partials(torch, splits, total_rows, out_view, lse_view)
        name = kernel_name()
        try:
            gluon_mla.split_kernel[launch_shape(total_rows, splits)](
                descriptor(q_flat, LATENT),
                descriptor(q_flat, ROPE),
                descriptor(kv_flat, LATENT),
                descriptor(kv_flat, ROPE),
                idx,
                part_out,
                part_lse,
                n_selected,
                per_split,
                total_rows,
                float(scale),
                PAGE=page,
                STAGES=gluon_mla.STAGES,
                LOADER_REGS=gluon_mla.LOADER_REGS,
                LAYOUT=name,
                SECOND_REGS=gluon_mla.SECOND_REGS,
                num_warps=KERNELS[name][0],
                maxnreg=gluon_mla.MAXNREG,
            )
        except CompilationError as exc:  # a Gluon that has moved on (an experimental language)
            raise BackendUnavailable(
                f"gluon: its kernel does not build with Triton {triton.__version__}: "
                + str(exc).strip().splitlines()[-1],
                "use --backend triton",
            ) from None
        combine = None
        if splits > 1:
            _, combine_kernel = _kernels(_tiles())
            _combine(combine_kernel, part_out, part_lse, out_view, lse_view, False, False)
            combine = combine_kernel.best_config
        # what ran, kept as it is: the text is made only when a sample asks
        self._gluon_plan = (name, splits, combine)
        return deliver(result, result_lse, out_view, lse_view)
