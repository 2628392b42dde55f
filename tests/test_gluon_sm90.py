"""The gluon backend's warp-specialized split kernel compiles for Hopper (sm_90), no GPU needed.

Gluon has no interpreter, so what can be checked without a GPU is what the compiler made
of the kernel (Triton's own ptxas, read back from the PTX and the cubin): it fits an SM's
shared memory, its partitions rebalance the registers, it issues both products on
warpgroup MMA, and its loop waits for the tensor cores once a step, after the softmax (the
softmax overlaps the next tile's score). Its numerics are checked on a GPU
(tests/test_gluon_kernels.py, gpu_check's ``gluon`` step).
"""

from __future__ import annotations

import pytest
from test_triton_sm90 import H100_SHARED, compile_in_a_process

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

COMPILE = r"""
import itertools, json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
from xbench.kernels import gluon_mla as g
from xbench.kernels.gluon_backend import KERNELS

def descriptor(cols):
    layout = gl.NVMMASharedLayout.get_default_for([64, cols], gl.bfloat16)
    return f"tensordesc<bf16[64,{cols}],{layout!r}>"

kernel = g.split_kernel
# each layout writing the partials of several splits (fp32), and one split's output
# straight to the caller (bf16)
for (name, partitions), out in itertools.product(KERNELS.items(), ("*fp32", "*bf16")):
    warps = partitions[0]  # the default partition's
    types = {"q_own_desc": descriptor(512), "q_rp_desc": descriptor(64),
             "own_desc": descriptor(512), "rp_desc": descriptor(64), "table_ptr": "*i32",
             "part_out_ptr": out, "part_lse_ptr": "*fp32", "scale": "fp32"}
    constexprs = {"PAGE": 64, "STAGES": g.STAGES, "LOADER_REGS": g.LOADER_REGS,
                  "LAYOUT": name, "SECOND_REGS": g.SECOND_REGS, "num_warps": warps}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "i32")
                 for a in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names)
               if signature[a] in ("i32", "*i32", "*fp32", "*bf16") and a != "n_selected"}
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, aligned),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "maxnreg": g.MAXNREG})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "split.cubin")
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([sys.argv[1], "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    ptx = compiled.asm["ptx"]
    found = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    print(json.dumps({
        "kernel": name, "out": out, "triton": triton.__version__, "shared": compiled.metadata.shared,
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


def test_the_warp_specialized_kernels_fit_an_h100(compiled):
    assert sorted(compiled) == [(k, o) for k in ("overlap", "scorer") for o in ("*bf16", "*fp32")]
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
