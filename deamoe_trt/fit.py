"""Which models fit which edge devices, at fp16, int8 and int4 FFN weights.

Whole-model sizes come from the models' published config numbers alone (no weights): the
MoE layers through DeaMoEConfig and deamoe_trt.quant's byte counts, everything else
(attention, embeddings, dense FFN layers, norms) counted from the same config and kept in
fp16, as deamoe-trt quantizes only FFN weights. A model fits a device when its weights,
a KV cache of KV_TOKENS tokens (batch 1, fp16) and RESERVE_BYTES for the OS and the runtime
fit its memory (Jetson's CPU and GPU share one memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import DeaMoEConfig, top_k_moe
from .console import format_bytes, format_table
from .errors import UsageError
from .presets import PRESETS
from .quant import QuantConfig
from .traffic import parameter_count, stored_bytes

GIB = 1 << 30
# (name, memory in bytes): the Jetson modules' LPDDR5 and Thor's, as sold.
DEVICES = (
    ("Orin Nano 8 GB", 8 * GIB),
    ("Orin NX 16 GB", 16 * GIB),
    ("AGX Orin 32 GB", 32 * GIB),
    ("AGX Orin 64 GB", 64 * GIB),
    ("Thor 128 GB", 128 * GIB),
)
# The OS, CUDA, TensorRT and activations: about what JetPack leaves unavailable to a process.
RESERVE_BYTES = 2 * GIB
KV_TOKENS = 4096
FP16 = 2
# Each build target's memory: the smallest device it is for (--device-memory overrides), and
# whether CPU and GPU share it (Jetson). The names are deamoe_trt.trt.targets' profiles.
TARGET_MEMORY = {
    "orin-nano": (8 * GIB, True),
    "orin": (16 * GIB, True),
    "thor": (128 * GIB, True),
    "a40": (48 * GIB, False),
    "h100": (80 * GIB, False),
    "h200": (141 * GIB, False),
}
# The precisions compared: (label, quantization of the FFN weights or None for fp16).
PRECISIONS = (("fp16", None), ("int8", QuantConfig(8, 64)), ("int4", QuantConfig(4, 64)))


@dataclass(frozen=True)
class WholeModel:
    name: str
    moe: DeaMoEConfig  # the shape of each MoE layer
    moe_layers: int
    other_params: int  # everything outside the MoE layers' FFN weights and routers, kept fp16
    kv_bytes_per_token: int  # fp16 KV cache, all layers
    kv_fixed_bytes: int = 0  # fp16 caches that stop growing: sliding-window layers keep their window

    def weight_bytes(self, quant: QuantConfig | None) -> int:
        return self.moe_layers * stored_bytes(self.moe, FP16, quant) + self.other_params * FP16

    @property
    def params(self) -> int:
        return self.moe_layers * parameter_count(self.moe) + self.other_params


def qwen3_moe(
    name: str,
    *,
    hidden_size: int = 2048,
    num_hidden_layers: int = 48,
    num_attention_heads: int = 32,
    num_key_value_heads: int = 4,
    head_dim: int = 128,
    vocab_size: int = 151936,
    num_experts: int = 128,
    moe_intermediate_size: int = 768,
    num_experts_per_tok: int = 8,
    tie_word_embeddings: bool = False,
    moe: DeaMoEConfig | None = None,
) -> WholeModel:
    """A Qwen3-MoE model from its config.json numbers (defaults: Qwen3-30B-A3B's); moe
    replaces its MoE layers by another shape (its DeaMoE form)."""
    d = hidden_size
    attention = d * num_attention_heads * head_dim + 2 * d * num_key_value_heads * head_dim
    attention += num_attention_heads * head_dim * d + 2 * head_dim  # o_proj, q_norm, k_norm
    per_layer = attention + 2 * d  # two RMSNorms
    embeddings = vocab_size * d * (1 if tie_word_embeddings else 2)
    vanilla = top_k_moe(
        hidden_size=d,
        num_experts=num_experts,
        intermediate_size=moe_intermediate_size,
        top_k=num_experts_per_tok,
        norm_topk_prob=True,
    )
    kv = 2 * num_hidden_layers * num_key_value_heads * head_dim * FP16
    return WholeModel(name, moe or vanilla, num_hidden_layers, num_hidden_layers * per_layer + embeddings + d, kv)


def deepseek_v3(
    name: str,
    *,
    hidden_size: int = 7168,
    num_hidden_layers: int = 61,
    first_k_dense_replace: int = 3,
    intermediate_size: int = 18432,
    moe_intermediate_size: int = 2048,
    n_routed_experts: int = 256,
    n_shared_experts: int = 1,
    num_experts_per_tok: int = 8,
    n_group: int = 8,
    topk_group: int = 4,
    num_attention_heads: int = 128,
    q_lora_rank: int | None = 1536,
    kv_lora_rank: int = 512,
    qk_nope_head_dim: int = 128,
    qk_rope_head_dim: int = 64,
    v_head_dim: int = 128,
    vocab_size: int = 129280,
    moe: DeaMoEConfig | None = None,
    routed_scaling_factor: float = 2.5,
    routing: str = "noaux_tc",
) -> WholeModel:
    """DeepSeek-V3 from its config.json numbers (MLA attention, 3 dense layers; no MTP module);
    q_lora_rank None: one q_proj (V2-Lite, Moonlight); routing "greedy": DeepSeek-V2's softmax
    top-k over all experts (n_group 1)."""
    d, h = hidden_size, num_attention_heads
    qk = qk_nope_head_dim + qk_rope_head_dim
    attention = d * q_lora_rank + q_lora_rank + q_lora_rank * h * qk if q_lora_rank else d * h * qk
    attention += d * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank
    attention += kv_lora_rank * h * (qk_nope_head_dim + v_head_dim) + h * v_head_dim * d
    per_layer = attention + 2 * d
    dense = first_k_dense_replace * 3 * d * intermediate_size
    moe_layers = num_hidden_layers - first_k_dense_replace
    vanilla = DeaMoEConfig(
        hidden_size=d,
        num_departments=n_group,
        experts_per_department=n_routed_experts // n_group,
        shared_intermediate_size=0,
        private_intermediate_size=moe_intermediate_size,
        top_k=num_experts_per_tok,
        top_departments=topk_group,
        score_func="sigmoid" if routing == "noaux_tc" else "softmax",
        department_score="sum_top2" if routing == "noaux_tc" else "max",
        norm_topk_prob=routing == "noaux_tc",
        routed_scaling_factor=routed_scaling_factor,
        router_bias=routing == "noaux_tc",
        shared_expert_intermediate_size=n_shared_experts * moe_intermediate_size,
    )
    other = num_hidden_layers * per_layer + dense + 2 * vocab_size * d + d
    kv = num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * FP16  # MLA caches the latent
    return WholeModel(name, moe or vanilla, moe_layers, other, kv)


def gpt_oss(
    name: str,
    *,
    hidden_size: int = 2880,
    num_hidden_layers: int = 24,
    num_attention_heads: int = 64,
    num_key_value_heads: int = 8,
    head_dim: int = 64,
    vocab_size: int = 201088,
    num_local_experts: int = 32,
    intermediate_size: int = 2880,
    num_experts_per_tok: int = 4,
    sliding_window: int = 128,
    moe: DeaMoEConfig | None = None,
) -> WholeModel:
    """A gpt-oss model from its config.json numbers (defaults: gpt-oss-20b's): q/k/v/o
    biases, one sink per head, every other layer (half of them) sliding over 128 tokens,
    whose KV cache keeps only its window (deamoe_trt.lm.config.LMConfig.cache_keep)."""
    d, q, kv = hidden_size, num_attention_heads * head_dim, num_key_value_heads * head_dim
    attention = d * q + q + 2 * (d * kv + kv) + q * d + d + num_attention_heads
    per_layer = attention + 2 * d
    vanilla = top_k_moe(
        hidden_size=d,
        num_experts=num_local_experts,
        intermediate_size=intermediate_size,
        top_k=num_experts_per_tok,
        norm_topk_prob=True,
        ffn_bias=True,
        activation="swiglu_clamped",
        router_logit_bias=True,
    )
    sliding, full = num_hidden_layers // 2, num_hidden_layers - num_hidden_layers // 2
    per_layer_token = 2 * kv * FP16
    other = num_hidden_layers * per_layer + 2 * vocab_size * d + d
    return WholeModel(
        name,
        moe or vanilla,
        num_hidden_layers,
        other,
        full * per_layer_token,
        sliding * (sliding_window - 1) * per_layer_token,
    )


# gpt-oss-20b's MoE layer in DeaMoE form: 32 experts of width 2880 as 4 departments of 8,
# 1536 of each expert's neurons shared in its department (1536 and 1344: whole groups of 64),
# top-4 from the top-2 departments.
GPT_OSS_20B_DEAMOE = DeaMoEConfig(
    hidden_size=2880,
    num_departments=4,
    experts_per_department=8,
    shared_intermediate_size=1536,
    private_intermediate_size=1344,
    top_k=4,
    top_departments=2,
    norm_topk_prob=True,
    ffn_bias=True,
    activation="swiglu_clamped",
    router_logit_bias=True,
)


def gqa_moe(
    name: str,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    vocab_size: int,
    num_experts: int,
    moe_intermediate_size: int,
    num_experts_per_tok: int,
    shared_intermediate_size: int = 0,
    dense_layers: int = 0,
    intermediate_size: int = 0,
    tie_word_embeddings: bool = False,
    router_bias: bool = False,
) -> WholeModel:
    """A Llama-attention MoE (ERNIE-4.5-MoE, Granite MoE) from its config.json numbers:
    dense_layers blocks with a dense MLP of intermediate_size, the others MoE."""
    d, hd = hidden_size, hidden_size // num_attention_heads
    attention = 2 * d * num_attention_heads * hd + 2 * d * num_key_value_heads * hd
    per_layer = attention + 2 * d
    embeddings = vocab_size * d * (1 if tie_word_embeddings else 2)
    moe = top_k_moe(
        hidden_size=d,
        num_experts=num_experts,
        intermediate_size=moe_intermediate_size,
        top_k=num_experts_per_tok,
        norm_topk_prob=True,
        router_bias=router_bias,
        shared_expert_intermediate_size=shared_intermediate_size,
    )
    other = num_hidden_layers * per_layer + dense_layers * 3 * d * intermediate_size + embeddings + d
    kv = 2 * num_hidden_layers * num_key_value_heads * hd * FP16
    return WholeModel(name, moe, num_hidden_layers - dense_layers, other, kv)


def edge_models() -> list[WholeModel]:
    """The edge-sized members of the imported families, shapes typed from their public config.json."""
    lite = dict(
        hidden_size=2048,
        num_hidden_layers=27,
        first_k_dense_replace=1,
        moe_intermediate_size=1408,
        n_routed_experts=64,
        n_shared_experts=2,
        num_experts_per_tok=6,
        n_group=1,
        topk_group=1,
        num_attention_heads=16,
        q_lora_rank=None,
    )
    return [
        deepseek_v3(
            "DeepSeek-V2-Lite (16B)",
            **lite,
            intermediate_size=10944,
            vocab_size=102400,
            routed_scaling_factor=1.0,
            routing="greedy",
        ),
        deepseek_v3(
            "Moonlight-16B-A3B", **lite, intermediate_size=11264, vocab_size=163840, routed_scaling_factor=2.446
        ),
        gqa_moe(
            "ERNIE-4.5-21B-A3B",
            hidden_size=2560,
            num_hidden_layers=28,
            num_attention_heads=20,
            num_key_value_heads=4,
            vocab_size=103424,
            num_experts=64,
            moe_intermediate_size=1536,
            num_experts_per_tok=6,
            shared_intermediate_size=2 * 1536,
            dense_layers=1,
            intermediate_size=12288,
            tie_word_embeddings=True,
            router_bias=True,
        ),
        gqa_moe(
            "Granite-3.0-3B-A800M",
            hidden_size=1536,
            num_hidden_layers=32,
            num_attention_heads=24,
            num_key_value_heads=8,
            vocab_size=49155,
            num_experts=40,
            moe_intermediate_size=512,
            num_experts_per_tok=8,
            tie_word_embeddings=True,
        ),
    ]


def whole_models() -> list[WholeModel]:
    return [
        qwen3_moe("Qwen3-30B-A3B"),
        qwen3_moe("Qwen3-30B-A3B, DeaMoE form (qwen3-30b-a3b-layer x 48)", moe=PRESETS["qwen3-30b-a3b-layer"]),
        deepseek_v3("DeepSeek-V3 (671B)"),
        deepseek_v3("DeepSeek-V3, DeaMoE form (deepseek-v3-layer x 58)", moe=PRESETS["deepseek-v3-layer"]),
        gpt_oss("gpt-oss-20b"),
        gpt_oss("gpt-oss-20b, DeaMoE form (4 departments of 8, f_s 1536, f_p 1344)", moe=GPT_OSS_20B_DEAMOE),
        *edge_models(),
    ]


def preset_layers() -> list[WholeModel]:
    """Each preset as one layer alone (no attention, no KV cache)."""
    return [WholeModel(f"{name} (one layer)", config, 1, 0, 0) for name, config in PRESETS.items()]


@dataclass(frozen=True)
class MemoryNeed:
    """What running a model, or building its TensorRT engine, takes on a device, by part.

    Device: the weights, the activations (KV cache, per-step tensors), the builder's
    workspace pool and the reserve for the OS and runtime. Host: the builder holds the
    parsed weights and the serialized engine (about the weights again) in host memory; on a
    shared-memory device (Jetson) host and device are one memory, so both count there."""

    weights: int
    activations: int
    workspace: int = 0
    reserve: int = RESERVE_BYTES
    shared: bool = True

    @property
    def device(self) -> int:
        return self.weights + self.activations + self.workspace + self.reserve

    @property
    def host(self) -> int:
        return 2 * self.weights + self.reserve

    @property
    def total(self) -> int:
        """What the device's own memory must hold: the device part, plus the host part when shared."""
        return self.device + (2 * self.weights if self.shared else 0)

    def fits(self, memory: int) -> bool:
        return self.total <= memory

    def text(self) -> str:
        parts = (
            f"weights {format_bytes(self.weights)} + activations {format_bytes(self.activations)} + "
            f"workspace {format_bytes(self.workspace)} + reserve {format_bytes(self.reserve)}"
        )
        host = f"host {format_bytes(self.host)} (parsed weights and the engine)"
        if self.shared:
            device = f"device {format_bytes(self.device)} ({parts})"
            return f"{device} and {host}, in one shared memory: {format_bytes(self.total)}"
        return f"device {format_bytes(self.device)} ({parts}); {host}"

    def check(self, memory: int, where: str) -> None:
        """A one-line UsageError when the need exceeds memory bytes of `where`."""
        if not self.fits(memory):
            raise UsageError(
                f"{where} has {format_bytes(memory)}; this needs {format_bytes(self.total)}: {self.text()}"
            )


def run_need(model: WholeModel, quant: QuantConfig | None) -> MemoryNeed:
    """Decoding model on a shared-memory device: weights and a KV_TOKENS-token cache (what --fit counts)."""
    kv = model.kv_bytes_per_token * KV_TOKENS + model.kv_fixed_bytes
    return MemoryNeed(model.weight_bytes(quant), kv, shared=False)


def format_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def fit_table(models: list[WholeModel] | None = None) -> str:
    """Per model and precision: weights, and per device 'yes (free)' or 'no (short by)'."""
    models = (preset_layers() + whole_models()) if models is None else models
    rows = []
    for model in models:
        for label, quant in PRECISIONS:
            weights = model.weight_bytes(quant)
            need = run_need(model, quant)
            cells = [f"{'yes' if need.fits(memory) else 'no'}" for _, memory in DEVICES]
            rows.append((model.name, label, format_count(model.params), format_bytes(weights), *cells))
    return format_table(
        ("model", "FFN weights", "params", "weights", *(name for name, _ in DEVICES)),
        rows,
        title=(
            f"Fits with a {KV_TOKENS}-token fp16 KV cache and {RESERVE_BYTES // GIB} GiB for OS and runtime "
            "(int8/int4: FFN weights, group size 64, fp16 scales; the rest fp16)"
        ),
        align="ll" + "r" * (len(DEVICES) + 2),
    )
