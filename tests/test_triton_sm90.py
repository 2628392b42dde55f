"""The triton backend's GPU tiles compile for Hopper (sm_90) here, without a GPU.

Triton compiles a kernel down to a cubin with its own ptxas and no GPU driver; what the
interpreter tests cannot see, this does: a tile that needs more shared memory than an H100
has fails on the GPU at its first call, and one that spills registers runs partly from local
memory (a bounded spill is allowed where the GPU timed it faster). Each candidate of ``triton_mla.GPU_TILES`` is compiled as a launch specializes it
(16-byte aligned tensors, every integer but the selection's length a multiple of 16) in a
process without the interpreter, and its resource use read back from the cubin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install '.[test]')")
pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
if not (BIN / "cuobjdump").exists():
    pytest.skip(
        "this triton has no NVIDIA backend tools (ptxas, cuobjdump)", allow_module_level=True
    )

H100_SHARED = 227 * 1024  # bytes of shared memory a thread block may use on sm_90

COMPILE = r"""
import itertools, json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from xbench.kernels import triton_mla

kernel = triton_mla.split_kernel
constexprs = {"UPCAST": False, "PRECISION": "tf32", "DIM": 576, "LAT": 512, "RP": 64}
def lookup_feeds_copy(ttgir):
    # whether, in the loop that issues the TMA copies, a page looked up in a step feeds that
    # step's copy (through address arithmetic), so the copy's issue waits for the load
    lines = ttgir.splitlines()
    for i, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth, body = 0, []
        for text in lines[i:]:
            depth += text.count("{") - text.count("}")
            body.append(text)
            if depth <= 0:
                break
        if not any("async_tma_copy_global_to_local" in t for t in body[1:]):
            continue
        tainted = set()
        for text in body[1:]:
            lhs, eq, rhs = text.partition(" = ")
            if not eq:
                continue
            name = re.match(r"\s*(%\w+)", lhs)
            uses = set(re.findall(r"%\w+", rhs))
            if re.search(r"tt\.load .*: !tt\.ptr<i32>", rhs) or uses & tainted:
                tainted.add(name.group(1))
        coordinates = [re.search(r"\[([^]]*)\]", t).group(1) for t in body
                       if "async_tma_copy_global_to_local" in t]
        return any(set(re.findall(r"%\w+", c)) & tainted for c in coordinates)
    return None

# token indices (a sparse selection) and a page table of 64-token pages (a dense one, whose
# whole tiles the tensor memory accelerator copies)
for (m, n, warps, stages, parts, ahead), page in itertools.product(triton_mla.GPU_TILES, (0, 64)):
    types = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "part_out_ptr": "*fp32",
             "part_lse_ptr": "*fp32", "scale": "fp32",
             "own_desc": f"tensordesc<bf16[{n},{512 // parts}]>",
             "rp_desc": f"tensordesc<bf16[{n},64]>"}
    signature = {a: "constexpr" if a.isupper() else types.get(a, "i32") for a in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names)
               if signature[a] in ("i32", "*bf16", "*i32", "*fp32") and a != "n_selected"}
    tile = {"BLOCK_M": m, "BLOCK_N": n, "VSPLIT": parts, "PAGE": page, "TMA": page > 0,
            "LOOKAHEAD": bool(ahead)}
    source = ASTSource(kernel, signature, {**constexprs, **tile}, aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "split.cubin")
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([sys.argv[1], "--dump-resource-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    print(json.dumps({"tile": [m, n, warps, stages, parts, ahead], "page": page,
                      "lookup_feeds_copy": lookup_feeds_copy(compiled.asm["ttgir"]),
                      "shared": compiled.metadata.shared,
                      "wgmma": "wgmma" in compiled.asm["ptx"],
                      "tma": "cp.async.bulk.tensor" in compiled.asm["ptx"],
                      "gdc": "griddepcontrol" in compiled.asm["ptx"],
                      **{k.lower(): int(v) for k, v in found.items()}}))
"""

# Programmatic dependent launch: the preferred tile with PDL set, and the combine's first
# layout without and with it (launched with the launch option, as the backend launches it)
COMPILE_PDL = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from xbench.kernels import triton_mla

def compile_(kernel, types, constexprs, options):
    signature = {a: "constexpr" if a.isupper() else types.get(a, "i32") for a in kernel.arg_names}
    source = ASTSource(kernel, signature, constexprs, {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

m, n, warps, stages, parts, _ = triton_mla.GPU_TILES[0]
split = compile_(
    triton_mla.split_kernel,
    {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "part_out_ptr": "*fp32",
     "part_lse_ptr": "*fp32", "scale": "fp32",
     "own_desc": f"tensordesc<bf16[{n},{512 // parts}]>", "rp_desc": f"tensordesc<bf16[{n},64]>"},
    {"UPCAST": False, "PRECISION": "tf32", "DIM": 576, "LAT": 512, "RP": 64, "BLOCK_M": m,
     "BLOCK_N": n, "VSPLIT": parts, "PAGE": 64, "TMA": True, "PDL": True},
    {"num_warps": warps, "num_stages": stages},
)
print(json.dumps({"kernel": "split", "pdl": True, "ptx": split.asm["ptx"].count("griddepcontrol"),
                  "launch": "griddepcontrol.launch_dependents" in split.asm["ptx"],
                  "shared": split.metadata.shared}))
c, s, warps = triton_mla.COMBINE_TILES[0]
for pdl in (False, True):
    combine = compile_(
        triton_mla.combine_kernel,
        {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32"},
        {"LAT": 512, "BLOCK_C": c, "BLOCK_S": s, "UPCAST": False, "PDL": pdl},
        {"num_warps": warps, "launch_pdl": pdl},
    )
    print(json.dumps({"kernel": "combine", "pdl": pdl,
                      "ptx": combine.asm["ptx"].count("griddepcontrol"),
                      "wait": "griddepcontrol.wait" in combine.asm["ptx"],
                      "launch_pdl": bool(combine.metadata.launch_pdl)}))
"""


def compile_in_a_process(script: str) -> list[dict]:
    """Each JSON line ``script`` prints, run without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, without its warning
    done = subprocess.run(
        [sys.executable, "-c", script, str(BIN / "cuobjdump")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def compiled_tiles():
    return compile_in_a_process(COMPILE)


# What a thread of a candidate may spill (to L1 through local memory): the preferred tile
# holds the whole 64 x 512 accumulator and spills a few hundred bytes, and on an H200 that
# beat every tile that spills nothing (tests cannot time; benchmarks/triton_tiles.py does)
MOST_SPILLED = 512


def test_every_gpu_tile_fits_an_h100_within_the_registers_and_a_bounded_spill(compiled_tiles):
    from xbench.kernels import triton_mla

    compiled = [(tuple(t["tile"]), t["page"]) for t in compiled_tiles]
    assert compiled == [(t, page) for t in triton_mla.GPU_TILES for page in (0, 64)]
    for tile in compiled_tiles:
        assert 0 < tile["shared"] <= H100_SHARED, tile
        assert tile["reg"] <= 255 and tile["local"] == 0, tile
        assert tile["stack"] <= MOST_SPILLED, tile
    # the preferred tile, without and with its page lookahead: 64 query rows with the whole
    # 512-wide accumulator (the score once), on Hopper's warpgroup MMA
    for preferred in compiled_tiles[:4]:
        assert preferred["tile"][0] == 64 and preferred["tile"][4] == 1 and preferred["wgmma"]
    # a page table's whole tiles arrive through the tensor memory accelerator; token
    # indices gather row by row
    # (64-row tiles: a 16-row tile's partial last tile spills in registers)
    assert all(t["tma"] == (t["page"] > 0 and t["tile"][0] >= 64) for t in compiled_tiles)
    # the small tile for a decode row's few heads spills nothing on token indices (on a
    # page table, its int64 address arithmetic spills a little, within the bound above)
    small = [t for t in compiled_tiles if t["tile"][0] == 16]
    assert small and small[0]["page"] == 0 and small[0]["stack"] == 0, small


def test_the_page_lookahead_takes_the_lookup_off_the_copys_issue(compiled_tiles):
    """In the TMA loop the pipeliner issues the next tile's copy at the end of a step. Without
    lookahead the page it starts from is loaded right there, so the copy's issue waits an L2
    round trip; with it (``LOOKAHEAD``, a candidate a GPU run times) the page was loaded a
    step earlier and no load of the step feeds the copy. Read off the compiled TTGIR."""
    copied = {tuple(t["tile"]): t for t in compiled_tiles if t["tma"]}
    plain, ahead = copied[(64, 64, 8, 2, 1, 0)], copied[(64, 64, 8, 2, 1, 1)]
    assert plain["lookup_feeds_copy"] is True, plain
    assert ahead["lookup_feeds_copy"] is False, ahead
    # the same shared memory: the lookahead is a register, not a buffer
    assert ahead["shared"] == plain["shared"]


def test_the_combine_launched_dependent_on_the_split_kernel_compiles_for_hopper(compiled_tiles):
    """Programmatic dependent launch (``triton_mla.COMBINE_PDL``, a candidate a GPU run
    times): with PDL the split kernel lets the combine launch, and the combine waits for the
    split kernel's writes before it reads them; without, neither instruction is there."""
    assert not any(t["gdc"] for t in compiled_tiles)  # PDL off: no grid dependency control
    split, plain, dependent = compile_in_a_process(COMPILE_PDL)
    assert split["kernel"] == "split" and split["launch"], split
    assert 0 < split["shared"] <= H100_SHARED
    assert plain == {"kernel": "combine", "pdl": False, "ptx": 0, "wait": False,
                     "launch_pdl": False}  # fmt: skip
    assert dependent["wait"] and dependent["launch_pdl"], dependent
