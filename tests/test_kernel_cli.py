"""xbench kernel and xbench models from the command line."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from xbench.core.models import PRESETS, get_model
from xbench.kernels import cpu_bf16
from xbench.kernels.bench import matmul_dtype
from xbench.results.schema import KERNEL_SAMPLES
from xbench.results.store import read_table

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def test_models_json_derives_byte_counts(xbench):
    r = xbench("models", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["model"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(PRESETS)
    v32 = rows["deepseek-v3.2"]
    assert (v32["query_bytes_per_row"], v32["return_bytes_per_row"], v32["kv_bytes_per_token"]) == (
        1152,
        1028,
        1152,
    )
    assert v32["kv_formats"] == {"bf16": 1152, "fp8": 656}
    v4 = rows["deepseek-v4-pro"]
    assert (v4["query_bytes_per_row"], v4["kv_formats"]) == (1024, {"fp8": 528, "fp4": 288})
    assert abs(rows["deepseek-v3"]["softmax_scale"] - 0.1352) < 1e-3
    assert get_model("GLM-5.1").name == "glm-5"
    # the GQA preset says what it is (its KV bytes are every KV head's K and V)
    llama = rows["llama-3.1-8b"]
    assert (llama["attention"], llama["kv_heads"], llama["kv_bytes_per_token"]) == ("GQA", 8, 2048)
    gqa = ("llama-3.1-8b", "mimo-v2-flash")
    assert {row["attention"] for m, row in rows.items() if m not in gqa} == {"MLA"}
    # the hybrid says how many layers hold every token, and the window the others keep
    mimo = rows["mimo-v2-flash"]
    assert (mimo["attention"], mimo["full_attention_layers"], mimo["window_tokens"]) == (
        "GQA",
        9,
        128,
    )
    assert llama["full_attention_layers"] == llama["layers"] and llama["window_tokens"] == 0


def test_kernel_sweep_writes_samples_and_rates(xbench, tmp_path):
    out = tmp_path / "k"
    r = xbench(
        "kernel",
        "--rows",
        "1,2",
        "--heads",
        "8",
        "--chunk",
        "64,256",
        "--samples",
        "3",
        "--min-sample-time",
        "2ms",
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    kinds = {(row["kernel"], row["rows"], row["chunk_tokens"]) for row in summary}
    assert (
        ("partial_attention", 2, 256) in kinds
        and ("merge", 2, 0) in kinds
        and ("gather", 1, 256) in kinds
        and ("splice", 1, 64) in kinds
    )
    for row in summary:
        assert row["ci_low_us"] <= row["median_us"] <= row["ci_high_us"]
        assert 0 < row["copy_share"] and row["gb_per_s"] > 0
    samples = read_table(out, KERNEL_SAMPLES)
    assert {"ceiling_copy", "ceiling_matmul"} <= set(samples.kernel)
    matmul = samples[samples.kernel == "ceiling_matmul"].iloc[0]
    assert matmul["dtype"] == matmul_dtype("cpu", "bf16")
    assert round((matmul["flops"] / 2) ** (1 / 3)) in (256, 512, 1024, 2048)  # n grows to 50 ms
    assert samples.warmup.any() and (~samples.warmup).any()
    # on a CPU the attention at the fewest rows is also timed after 1, 4 and 16 ms idle
    idle = samples[samples.idle_us > 0]
    assert set(idle.idle_us) == {1000, 4000, 16000}
    assert set(idle.kernel) == {"partial_attention"} and set(idle.rows) == {1}
    assert set(idle.chunk_tokens) == {64, 256}
    assert (samples[samples.kernel != "partial_attention"].idle_us == 0).all()
    # and the merge at every rows after spinning 0.5, 2, 8, 32 and 128 ms, after nothing else
    waited = samples[samples.wait_us > 0]
    assert set(waited.wait_us) == {500, 2000, 8000, 32000, 128000}
    assert set(waited.kernel) == {"merge"} and set(waited.rows) == {1, 2}
    assert (waited.after_tokens == 0).all() and (waited.idle_us == 0).all()
    assert {row["wait_us"] for row in summary if row["kernel"] == "merge"} >= {0, 32000}
    # and the attention at the fewest rows right after a splice of its chunk, as a fetch's
    spliced = samples[samples.after_splice_tokens > 0]
    assert set(spliced.kernel) == {"partial_attention"} and set(spliced.rows) == {1}
    assert (spliced.after_splice_tokens == spliced.chunk_tokens).all()
    assert set(spliced.chunk_tokens) == {64, 256} and (spliced.idle_us == 0).all()


def test_cpu_ceiling_is_the_dtype_the_kernels_multiply_in(monkeypatch):
    """Without AVX512-BF16 bf16 attention runs as fp32 products (torch's CPU bf16 matmul ran
    at 1 GFLOP/s there), so the matmul ceiling is fp32's; a GPU keeps the cache dtype."""
    monkeypatch.setattr(cpu_bf16, "cpu_has_bf16", lambda: False)
    assert matmul_dtype("cpu", "bf16") == "fp32"
    assert matmul_dtype("cpu", "fp32") == "fp32"
    assert matmul_dtype("cuda", "bf16") == "bf16"
    monkeypatch.setattr(cpu_bf16, "cpu_has_bf16", lambda: True)
    assert matmul_dtype("cpu", "bf16") == "bf16"


def test_kernel_sparse_fp32(xbench, tmp_path):
    r = xbench(
        "kernel",
        "--kernels",
        "partial_attention,gather",
        "--sparse",
        "--dtype",
        "fp32",
        "--rows",
        "2",
        "--heads",
        "4",
        "--chunk",
        "128",
        "--samples",
        "2",
        "--rounds",
        "2",
        "--no-ceilings",
        "--min-sample-time",
        "1ms",
        "--idle",
        "none",
        "--out",
        tmp_path / "s",
        "--format",
        "csv",
    )
    assert r.returncode == 0, r.stderr
    assert "partial_attention" in r.stdout and ",True," in r.stdout
    samples = read_table(tmp_path / "s", KERNEL_SAMPLES)
    measured = samples[~samples.warmup].groupby(["kernel", "round"]).size()
    assert measured.to_dict() == {
        (k, r): 2 for k in ("gather", "partial_attention") for r in (0, 1)
    }


def test_kernel_bad_input(xbench, tmp_path):
    """Each bad option is one line naming it; those torch is not needed to check are
    refused before torch is imported (here torch and scipy cannot be imported at all)."""
    import torch

    without_torch = [
        (["--model", "gpt-9"], "unknown model"),
        (["--dtype", "int4"], "unknown dtype"),
        (["--rounds", "0"], "nothing would be measured"),
        (["--np", "3"], "--np 3"),
        (["--runs", "0"], "--runs 0"),
        (["--idle", "2s"], "outside 1us-1s"),
        (["--idle", "soon"], "bad duration"),
        (["--merge-wait", "5s"], "--merge-wait 5s is outside 1us-1s"),
        (["--rows", "0"], "--rows must be integers of 1 or more"),
        (["--chunk", "0,64"], "--chunk must be integers of 1 or more"),
        (["--launch", "lazy"], "unknown --launch"),
    ]
    cases = [
        (["--kernels", "fft"], "unknown kernel"),
        (["--backend", "nosuch"], "unknown kernel backend"),
        (["--cpu-attention", "fast"], "unknown CPU attention path"),
        # times asked of a kernel the sweep leaves out were silently not timed
        (["--kernels", "merge", "--idle", "1ms"], "add partial_attention to --kernels"),
        (["--kernels", "gather", "--merge-wait", "2ms"], "add merge to --kernels"),
    ]
    if cpu_bf16.unavailable_because():
        cases.append((["--cpu-attention", "c-bf16"], "--cpu-attention c-bf16"))
    if not torch.cuda.is_available():  # on a GPU machine the cuda backend runs
        cases.append((["--backend", "cuda-ref"], "cuda backend"))
    blocked = tmp_path / "blocked"
    for name in ("torch", "scipy"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} imported')\n")
    env = {"PYTHONPATH": str(blocked)}
    runs = [(args, words, None) for args, words in cases]
    runs += [(args, words, env) for args, words in without_torch]
    # two at a time: a start that imports torch takes seconds, and none of them writes
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda run: xbench("kernel", *run[0], env=run[2]), runs))
    for (args, words, _), r in zip(runs, done, strict=True):
        assert r.returncode != 0 and "Traceback" not in r.stderr, args
        assert words in r.stderr, r.stderr
    # fit refuses a path that is not there before it imports the fit (scipy, torch)
    r = xbench("fit", tmp_path / "nothing", env=env)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr


def test_prefill_sweep_fits_the_quadratic_recompute_term(xbench, tmp_path):
    """xbench kernel --kernels prefill times causal attention over each length at the
    model's prefill shapes; fit turns it into T_recompute = c p1 + c^2 p2 (per layer, the
    model's every head) and the prefill scenario runs on the fitted profile."""
    from xbench.core.profile import load_profile

    out = tmp_path / "prefill"
    r = xbench(
        "kernel",
        "--kernels",
        "prefill",
        "--heads",
        "2",
        "--chunk",
        "64,128,256,512",
        "--samples",
        "2",
        "--min-sample-time",
        "2ms",
        "--out",
        out,
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["kernel"] for row in rows} == {"prefill"} and len(rows) == 4
    assert all(
        row["flops"] == 2 * row["chunk_tokens"] * (row["chunk_tokens"] + 1) * 320 for row in rows
    )
    profile = tmp_path / "fitted.toml"
    r = xbench("fit", out, "--base", "profiles/h100-priors.toml", "--out", profile)
    assert r.returncode == 0, r.stderr
    fitted = load_profile(profile)
    d = fitted.device
    assert d.recompute_per_token2 is not None and not d.recompute_per_token2.prior
    assert d.recompute_per_token2.value > 0
    # the layer's matmuls at the matmul rate this run measured (deepseek-v3.2: 37e9 active)
    assert not d.recompute_per_token.prior and d.recompute_per_token.value > 1e-6
    assert "of 2 heads, scaled to 128" in fitted.provenance["device_notes"]["recompute"]
    # a CPU fit keeps no GPU's [ceilings], which decode reads: the shipped scenario says so
    # in one line, and its prefill-only copy runs on the fitted prefill terms
    shipped = Path("scenarios/prefill-as-a-service.toml")
    r = xbench("simulate", str(shipped), "--profile", profile, "--requests", "200")
    assert r.returncode == 2 and "set output_tokens = 0 (prefill only)" in r.stderr
    scenario = tmp_path / "prefill-only.toml"
    scenario.write_text(shipped.read_text().replace("output_tokens = 1024", "output_tokens = 0"))
    r = xbench("simulate", str(scenario), "--profile", profile, "--requests", "200")
    assert r.returncode == 0, r.stderr
    assert "offload threshold (tcp):" in r.stdout
    # fitted on CPU kernels: a decode simulation runs gather and splice on the compute
    agentic = "scenarios/agentic-codebase.toml"
    r = xbench("simulate", agentic, "--profile", profile, "--requests", "200", "--fabric", "ib")
    assert r.returncode == 0, r.stderr
    assert "T_move runs on the compute" in " ".join(r.stdout.split())


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("dtype", "int4", "unknown dtype 'int4'"),
        ("rounds", 0, "nothing would be measured"),
        ("ranks", 3, "--np 3: the sweep runs alone or beside one peer"),
        ("launch", "auto", "unknown launch 'auto'"),  # stored resolved: graph or eager
    ],
)
def test_a_stored_sweep_keeps_the_command_lines_rules(key, value, words):
    """A kernel sweep's or validate's configuration read back (--config-from, xbench check,
    the ranks) is checked as the command line's is."""
    import dataclasses

    from xbench.errors import XbenchError
    from xbench.kernels.worker import SweepConfig
    from xbench.validate import ValidateConfig

    good = SweepConfig("x", "r", "deepseek-v3.2", "torch", "cpu", "eager", ["merge"], [1], [64])
    assert SweepConfig(**json.loads(good.to_json())) == good
    with pytest.raises(XbenchError, match=re.escape(words)):
        SweepConfig(**{**json.loads(good.to_json()), key: value})
    checked = ValidateConfig(out_dir="x", run_id="r")
    assert ValidateConfig.from_json(checked.to_json()) == checked
    with pytest.raises(XbenchError, match="unknown --fetch-layout 'scattered'"):
        dataclasses.replace(checked, fetch_layout="scattered")
