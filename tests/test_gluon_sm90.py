"""The gluon backend's warp-specialized split kernel compiles for Hopper (sm_90), no GPU needed.

Gluon has no interpreter, so what can be checked without a GPU is what the compiler made
of the kernel, compiled from the backend's own call as on a GPU (Triton's own ptxas, read
back from the PTX and the cubin): it fits an SM's shared memory, its partitions rebalance
the registers, it issues both products on warpgroup MMA, and its loop waits for the tensor
cores once a step, after the softmax (the softmax overlaps the next tile's score). Its
numerics are checked on a GPU (tests/test_gluon_kernels.py, gpu_check's ``gluon`` step).
"""

from __future__ import annotations

import pytest
from test_triton_sm90 import H100_SHARED, compile_in_a_process

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

COMPILE = r"""
import json, os, re, subprocess, sys, tempfile
from pathlib import Path
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

# The kernel is compiled as the backend launches it on a GPU (its own descriptors, page
# table, partials and launch options, bound and specialized by Triton's JIT), stopping
# short of the launch: a driver that reports a Hopper GPU (the one part that cannot run
# here) and records what it is asked; anything else it is asked fails the script.
class Hopper:
    asked = set()
    def get_current_device(self):
        self.asked.add("device"); return 0
    def get_current_stream(self, device=None):
        self.asked.add("stream"); return 0
    def get_current_target(self):
        self.asked.add("target"); return GPUTarget("cuda", 90, 32)
    def __getattr__(self, name):
        raise AttributeError(f"the fake driver was asked for {name}")

driver.set_active(Hopper())
torch.cuda.is_available = lambda: True  # the backend's own check, as on the GPU
from xbench.kernels import gluon_mla, gluon_backend
from xbench.kernels.selection import DensePages

class Compiled(Exception):
    pass

class CompileOnly:  # split_kernel[grid](...): compiled (JIT warmup), then the call stops
    def __init__(self, kernel):
        self.kernel = kernel
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise Compiled(grid, self.kernel.warmup(*args, grid=grid, **kwargs))
        return launch

gluon_mla.split_kernel = CompileOnly(gluon_mla.split_kernel)
backend = gluon_backend.GluonBackend()
# each layout writing the partials of several splits (fp32), and one split's output
# straight to the caller's bf16 buffer; one decode row (128 heads) over 32K tokens less 3
rows, heads, pages, tokens = 1, 128, 512, 512 * 64 - 3
q = torch.randn(rows, heads, 576).bfloat16()
cache = torch.randn(pages, 64, 576).bfloat16()
selection = DensePages(torch.randperm(pages), tokens)
for name in gluon_backend.KERNELS:
    os.environ[gluon_backend.KERNEL_VARIABLE] = name
    for splits in (8, 1):
        buffer = torch.empty(rows, heads, 512, dtype=torch.bfloat16)
        try:
            backend._attend(q, cache, selection, 0.04, buffer, None, splits)
            raise SystemExit("the backend returned without launching its kernel")
        except Compiled as launched:
            grid, compiled = launched.args
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp, "split.cubin")
            cubin.write_bytes(compiled.asm["cubin"])
            usage = subprocess.run([sys.argv[1], "--dump-resource-usage", str(cubin)],
                                   capture_output=True, text=True, check=True).stdout
        ptx = compiled.asm["ptx"]
        found = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
        print(json.dumps({
            "kernel": name, "splits": splits, "out": compiled.src.signature["part_out_ptr"],
            "triton": triton.__version__, "grid": list(grid),
            "asked": sorted(Hopper.asked), "shared": compiled.metadata.shared,
            "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
            "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
            "waits": re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx),
            "tma": ptx.count("cp.async.bulk.tensor"),
            **{k.lower(): int(v) for k, v in found.items()}}))
"""

# What a thread may spill: none with the Triton 3.6 of the GPU machines; with Triton 3.9
# 40 bytes (overlap) and 80 (scorer): its ptxas keeps a few loop scalars in L1
MOST_SPILLED = 256


@pytest.fixture(scope="module")
def compiled():
    pytest.importorskip("triton.experimental.gluon", reason="this triton has no Gluon")
    return {(c["kernel"], c["out"]): c for c in compile_in_a_process(COMPILE)}


def test_the_backend_launches_them_as_compiled_for_sm_90(compiled):
    """The backend's own call binds and compiles them for Hopper: its descriptors, page
    table and launch options as a GPU run passes them, on the grid ``launch_shape`` says."""
    assert sorted(compiled) == [(k, o) for k in ("overlap", "scorer") for o in ("*bf16", "*fp32")]
    for (_, out), kernel in compiled.items():
        # 128 rows; several splits write fp32 partials, one the caller's bf16 buffer
        assert kernel["grid"] == [2, kernel["splits"]], kernel
        assert out == ("*fp32" if kernel["splits"] > 1 else "*bf16"), kernel
        assert kernel["asked"] == ["device", "stream", "target"], kernel


def test_the_warp_specialized_kernels_fit_an_h100(compiled):
    for kernel in compiled.values():
        # the query tile, two 64-token tiles and P: 224 KB of the 227
        assert 224 * 1024 < kernel["shared"] <= H100_SHARED, kernel
        assert kernel["reg"] <= 255 and kernel["local"] == 0, kernel
        assert kernel["stack"] <= MOST_SPILLED, kernel
    for out in ("*bf16", "*fp32"):
        # the loader's warpgroup gives its registers to the computing ones: to the two
        # warpgroups of the default partition, 240 each (overlap); to the second warpgroup,
        # 224, the first (the default partition) keeping the most a thread may hold, 256
        assert compiled["overlap", out]["setmaxnreg"] == [
            ["dec", "24"], ["inc", "24"], ["inc", "240"]
        ], compiled["overlap", out]  # fmt: skip
        found = compiled["scorer", out]["setmaxnreg"]
        assert ["dec", "24"] in found and ["inc", "224"] in found, found
        assert ["inc", "256"] in found and not any(int(n) > 256 for _, n in found), found


def test_their_products_run_on_warpgroup_mma_and_the_softmax_overlaps_the_next_score(compiled):
    for out in ("*bf16", "*fp32"):
        overlap, scorer = compiled["overlap", out], compiled["scorer", out]
        # overlap: the score, each warpgroup 32 of a tile's 64 columns; P V, each 256 of
        # the 512. Its waits: one for the first score, one a step (the next score and P V
        # together, after the softmax the next score overlapped), one for the last P V: a
        # wait between a score and its softmax inside the loop would show as a fourth
        assert overlap["wgmma"] == ["m64n256k16", "m64n32k16"], overlap
        assert overlap["waits"] == ["0", "0", "0"], overlap
        # scorer: warpgroup 0 scores whole tiles (m64n64) and waits as overlap does;
        # warpgroup 1 waits once a step for its P V
        assert scorer["wgmma"] == ["m64n256k16", "m64n64k16"], scorer
        assert scorer["waits"] == ["0", "0", "0", "0"], scorer
        for kernel in (overlap, scorer):
            # the query tile and each cache tile: 8 copies of 64 latent columns and the RoPE's
            assert kernel["tma"] == 18, kernel
