"""Model presets: the attention shapes that set routed and fetched byte counts.

Figures come from the models' public configuration files (tabled in ``docs/cost-model.md``).
In absorbed MLA decode one query row per head has ``qk_dim`` elements (512 latent + 64
RoPE = 576 for DeepSeek-V3), the partial result per head is ``v_dim`` elements plus one
fp32 log-sum-exp, and one cached token per layer is ``qk_dim`` elements in the chosen KV
format. DeepSeek-V4 keeps one 512-wide KV head (448 + 64 RoPE) that serves as key and
value, so its query row is 512 elements and its output is 512 wide. A GQA model (Llama-3.1-8B)
caches ``kv_heads`` keys and values of ``qk_dim`` each per token and layer, shared by groups
of query heads: its query row and partial are one head's, its KV bytes a token are all
heads' K and V. xbench's kernels and the profiles' device terms are MLA's (one KV head
serving every query head): a GQA preset prices shared-KV batching (``core.sharing``) and is
refused by ``kernel``, ``decide`` and a scenario's model (``mla_model``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from xbench.errors import XbenchError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
LSE_BYTES = 4  # the fp32 log-sum-exp returned with each partial row


@dataclass(frozen=True)
class ModelPreset:
    name: str
    q_heads: int  # query heads per token (before tensor parallelism)
    qk_dim: int  # elements per query row and per cached token (latent + RoPE)
    v_dim: int  # elements of the partial output per head
    rope_dim: int  # trailing RoPE elements of qk_dim
    layers: int
    index_topk: int | None  # tokens a DSA indexer selects per query; None = dense
    kv_formats: dict[str, int] = field(default_factory=dict)  # format -> bytes per token per layer
    softmax_scale: float = 0.0
    notes: str = ""
    # Prefill attends unabsorbed: per head a query and key of prefill_qk_dim (128 no-RoPE +
    # 64 RoPE in DeepSeek-V3's MLA) and a value of prefill_v_dim.
    prefill_qk_dim: int = 192
    prefill_v_dim: int = 128
    # parameters active per token (MoE): the FLOPs of a layer's matmuls are about
    # 2 * active_params / layers per token; None where not published
    active_params: float | None = None
    # KV heads a token caches: 1 for MLA (one latent serves every query head), the group
    # count for GQA
    kv_heads: int = 1
    # the dtype of its linear layers' matmuls as released: "fp8" where the published weights
    # are FP8 (block-scaled e4m3, run on FP8 tensor cores), else "bf16"
    matmul_dtype: str = "bf16"
    # parameters in all (the weights a GPU holds, MoE's experts included); None where not
    # published
    total_params: float | None = None
    # hybrid attention: the layers whose KV grows with the context (None: every layer); the
    # others attend a sliding window of ``window_tokens`` and cache a token's K and V in
    # ``window_kv_bytes`` (bf16) while it is in the window
    full_attention_layers: int | None = None
    window_tokens: int = 0
    window_kv_bytes: int = 0

    @property
    def full_layers(self) -> int:
        """The layers whose KV grows with the context."""
        return self.layers if self.full_attention_layers is None else self.full_attention_layers

    def prefill_flops(self) -> tuple[float, float, float]:
        """A prefill's FLOPs a layer on average: (a token's matmuls, a token pair's causal
        attention in a full-attention layer, a token's attention to one windowed token):
        2 x active parameters / layers; q_heads x (prefill_qk + prefill_v), which the causal
        mask's half of the pairs doubles back; 2 x window heads x (prefill_qk + prefill_v).
        Each averaged over the layers (a hybrid's full layers are a share of them; its
        windowed layers' query heads taken as its full layers'); the first nan where the
        active parameters are not published."""
        width = self.prefill_qk_dim + self.prefill_v_dim
        full = self.full_layers / self.layers
        return (
            2 * self.active_params / self.layers if self.active_params else math.nan,
            full * self.q_heads * width,
            (1 - full) * 2 * self.q_heads * width,
        )

    @property
    def attention(self) -> str:
        return "MLA" if self.kv_heads == 1 else "GQA"

    def flops_per_row_token(self) -> int:
        """FLOPs one query row spends on one cached token: q.k over qk_dim and p.v over
        v_dim, a multiply and an add each (absorbed MLA: 2 x (576 + 512))."""
        return 2 * (self.qk_dim + self.v_dim)

    def query_bytes_per_row(self, dtype: str = "bf16") -> int:
        """S_q per query row (one head of one decode token)."""
        return self.qk_dim * DTYPE_BYTES[dtype]

    def return_bytes_per_row(self, dtype: str = "bf16") -> int:
        """S_o per row: the partial output plus its fp32 LSE."""
        return self.v_dim * DTYPE_BYTES[dtype] + LSE_BYTES

    def kv_bytes_per_token(self, kv_format: str | None = None) -> int:
        fmt = kv_format or next(iter(self.kv_formats))
        if fmt not in self.kv_formats:
            raise XbenchError(
                f"{self.name} has no KV format {fmt!r}", f"pick one of {', '.join(self.kv_formats)}"
            )
        return self.kv_formats[fmt]

    def as_row(self) -> dict:
        return {
            "model": self.name,
            "q_heads": self.q_heads,
            "qk_dim": self.qk_dim,
            "v_dim": self.v_dim,
            "rope_dim": self.rope_dim,
            "layers": self.layers,
            "index_topk": self.index_topk,
            "kv_formats": dict(self.kv_formats),
            "query_bytes_per_row": self.query_bytes_per_row(),
            "return_bytes_per_row": self.return_bytes_per_row(),
            "kv_bytes_per_token": self.kv_bytes_per_token(),
            "softmax_scale": self.softmax_scale,
            "attention": self.attention,
            "kv_heads": self.kv_heads,
            "active_params": self.active_params,
            "matmul_dtype": self.matmul_dtype,
            "full_attention_layers": self.full_layers,
            "window_tokens": self.window_tokens,
            "window_kv_bytes": self.window_kv_bytes,
        }


# DeepSeek-V3's scale: 1/sqrt(192) times the YaRN factor (0.1 ln 40 + 1)^2.
_V3_SCALE = (1 / 192**0.5) * (0.1 * __import__("math").log(40) + 1) ** 2
_MLA_FORMATS = {"bf16": 1152, "fp8": 656}  # fp8: FlashMLA layout (512 fp8 + scales + 64 bf16 RoPE)
_V4_FORMATS = {"fp8": 528, "fp4": 288}

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        ModelPreset(
            "deepseek-v3",
            128,
            576,
            512,
            64,
            61,
            None,
            {"bf16": 1152},
            _V3_SCALE,
            "also DeepSeek-R1",
            active_params=37e9,
            matmul_dtype="fp8",
            total_params=671e9,
        ),
        ModelPreset(
            "deepseek-v3.2",
            128,
            576,
            512,
            64,
            61,
            2048,
            dict(_MLA_FORMATS),
            _V3_SCALE,
            "DSA indexer 64 heads x 128",
            active_params=37e9,
            matmul_dtype="fp8",
            total_params=671e9,
        ),
        ModelPreset(
            "glm-5",
            64,
            576,
            512,
            64,
            78,
            2048,
            dict(_MLA_FORMATS),
            1 / 192**0.5,
            "also GLM-5.1; DSA indexer 32 heads x 128",
        ),
        ModelPreset(
            "kimi-k2",
            64,
            576,
            512,
            64,
            61,
            None,
            {"bf16": 1152},
            1 / 192**0.5,
            "dense MLA",
            active_params=32e9,
            total_params=1.0e12,  # "1T total parameters" (its model card)
            matmul_dtype="fp8",
        ),
        ModelPreset(
            "deepseek-v4-flash",
            64,
            512,
            512,
            64,
            43,
            512,
            dict(_V4_FORMATS),
            1 / 512**0.5,
            "1 KV head of 512 (448 + 64 RoPE), K = V; top-512 over 4x-compressed entries",
        ),
        ModelPreset(
            "deepseek-v4-pro",
            128,
            512,
            512,
            64,
            61,
            1024,
            dict(_V4_FORMATS),
            1 / 512**0.5,
            "1 KV head of 512 (448 + 64 RoPE), K = V; top-1024 over 4x-compressed entries",
        ),
        # Llama-3.1-8B (MoSKA's model): 32 query heads, 8 KV heads of 128, RoPE over the
        # whole head; a token's K and V in every KV head: 2 x 8 x 128 elements a layer
        ModelPreset(
            "llama-3.1-8b",
            32,
            128,
            128,
            128,
            32,
            None,
            {"fp8": 2048, "bf16": 4096},
            1 / 128**0.5,
            "GQA: 8 KV heads of 128 for 32 query heads (MoSKA's model, FP8 KV)",
            prefill_qk_dim=128,
            prefill_v_dim=128,
            active_params=8.0e9,
            kv_heads=8,
            total_params=8.03e9,
        ),
        # MiMo-V2-Flash (one of the study's hybrid models: 4.66 Gb/s of KV at 32K on 8 H200):
        # 48 layers, one full-attention GQA layer to each five sliding-window ones (9 full:
        # hybrid_layer_pattern), full layers 64 query heads and 4 KV heads, windowed ones 8 KV
        # heads, head dims 192 (K) and 128 (V), a 128-token window; 309e9 parameters, 15e9
        # active, FP8 weights (SGLang's and Xiaomi's release notes; its config as ports read it)
        ModelPreset(
            "mimo-v2-flash",
            64,
            192,
            128,
            64,
            48,
            None,
            {"bf16": 2 * 4 * (192 + 128)},
            1 / 192**0.5,
            "hybrid: 9 full-attention GQA layers (4 KV heads), 39 of a 128-token window",
            prefill_qk_dim=192,
            prefill_v_dim=128,
            active_params=15e9,
            kv_heads=4,
            matmul_dtype="fp8",
            total_params=309e9,
            full_attention_layers=9,
            window_tokens=128,
            window_kv_bytes=2 * 8 * (192 + 128),
        ),
    ]
}
ALIASES = {"deepseek-r1": "deepseek-v3", "glm-5.1": "glm-5"}


def alias_words() -> str:
    """The other names of presets, as a reader finds them: "deepseek-r1 for deepseek-v3"."""
    return ", ".join(f"{alias} for {name}" for alias, name in ALIASES.items())


def get_model(name: str) -> ModelPreset:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise XbenchError(
            f"unknown model {name!r}",
            f"pick one of {', '.join(PRESETS)}, or {alias_words()} (xbench models lists them)",
        )
    return PRESETS[key]


def mla_model(name: str, use: str) -> ModelPreset:
    """``get_model``, refusing a GQA preset where MLA kernels' terms would price it (``use``
    names the option or file that asked)."""
    preset = get_model(name)
    if preset.kv_heads != 1:
        raise XbenchError(
            f"{use} {name}: {preset.name} is {preset.attention} ({preset.kv_heads} KV heads), "
            "and xbench's kernels and the profiles' device terms are MLA's",
            "pick an MLA preset (xbench models lists them); a GQA preset prices shared-KV "
            "batching in a scenario's [workload] sharing report",
        )
    return preset
