"""Small configs that several test suites use unchanged. Suites that need other shapes for
their component (kernel alignment, padding, ONNX Runtime layouts) define their own and
say why beside them."""

from deamoe_trt import PRESETS, DeaMoEConfig
from deamoe_trt.lm import LMConfig

# Qwen2-MoE: vanilla top-k (one department, f_s = 0), no renormalisation, and a shared
# expert gated per token by sigmoid(x . gate).
QWEN2_STYLE_GATED_SHARED = DeaMoEConfig(
    hidden_size=32,
    num_departments=1,
    experts_per_department=8,
    shared_intermediate_size=0,
    private_intermediate_size=16,
    top_k=2,
    top_departments=1,
    norm_topk_prob=False,
    shared_expert_intermediate_size=24,
    shared_expert_gate=True,
)

# Departments only: every expert is its department's shared part (f_p = 0).
TINY_SHARED_ONLY = PRESETS["tiny"].replace(private_intermediate_size=0)


def deepseek_style(**sizes) -> DeaMoEConfig:
    """DeepSeek-V3-style routing: sigmoid scores, a selection bias, sum_top2 department
    scores, routed scaling 2.5, k = 4 experts in g = 2 of D = 4 departments of m = 4, and an
    ungated shared expert. Suites pass the sizes their component needs (kernel alignment,
    padding, ONNX Runtime layouts) and say why beside them."""
    fields = {
        "hidden_size": 32,
        "num_departments": 4,
        "experts_per_department": 4,
        "shared_intermediate_size": 32,
        "private_intermediate_size": 16,
        "top_k": 4,
        "top_departments": 2,
        "score_func": "sigmoid",
        "department_score": "sum_top2",
        "routed_scaling_factor": 2.5,
        "router_bias": True,
        "shared_expert_intermediate_size": 48,
    }
    return DeaMoEConfig(**{**fields, **sizes})


def gpt_oss_style(**sizes) -> DeaMoEConfig:
    """gpt-oss's FFN in department form: biases on every part, the clamped SwiGLU with a limit
    small enough (1.0) that random unit-scale inputs clamp many neurons, a router logit bias,
    softmax over the kept experts (norm_topk_prob), and an ungated shared expert so that the
    shared experts' biases are exercised too (gpt-oss itself has none)."""
    fields = {
        "hidden_size": 32,
        "num_departments": 4,
        "experts_per_department": 4,
        "shared_intermediate_size": 16,
        "private_intermediate_size": 16,
        "top_k": 4,
        "top_departments": 2,
        "shared_expert_intermediate_size": 16,
        "ffn_bias": True,
        "activation": "swiglu_clamped",
        "swiglu_alpha": 1.702,
        "swiglu_limit": 1.0,
        "router_logit_bias": True,
    }
    return DeaMoEConfig(**{**fields, **sizes})


GPT_OSS_STYLE = gpt_oss_style()


# Widths in whole quantization groups of 16 and 32 (weight-only int8/int4 tests).
DEEPSEEK_STYLE_GROUPED = deepseek_style(
    hidden_size=64, private_intermediate_size=32, shared_expert_intermediate_size=64
)
# Qwen2-MoE style: one department, a sigmoid-gated shared expert.
QWEN2_STYLE_GROUPED = QWEN2_STYLE_GATED_SHARED.replace(hidden_size=48, shared_expert_intermediate_size=32)


# A micro language model: small enough that every test builds, runs and exports it in well under a second.
# Every part kind (department shared parts, expert private parts, a gated shared expert), all
# widths whole 16-byte rows of int4 codes and of every group size up to 32: the emulated
# quantized kernels' layer.
GATED_QUANTIZABLE = DeaMoEConfig(
    hidden_size=64,
    num_departments=2,
    experts_per_department=4,
    shared_intermediate_size=32,
    private_intermediate_size=32,
    top_k=3,
    top_departments=2,
    shared_expert_intermediate_size=32,
    shared_expert_gate=True,
)

MICRO_LM = LMConfig(
    vocab_size=256,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=48,
    moe=DeaMoEConfig(
        hidden_size=32,
        num_departments=2,
        experts_per_department=2,
        shared_intermediate_size=16,
        private_intermediate_size=8,
        top_k=2,
        top_departments=1,
    ),
)


# A micro language model (MICRO_LM's shape) whose quantized widths are all
# multiples of the smallest group size, 16 (MICRO_LM's f_p = 8 is not), with a dense block, a
# gated shared expert and a router bias, so that "only the DeaMoE FFN weights" is visible.
QUANTIZABLE_MICRO_LM = LMConfig(
    vocab_size=256,
    hidden_size=32,
    num_layers=3,
    num_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=48,
    dense_layers=(1,),
    dense_intermediate_size=24,
    moe=DeaMoEConfig(
        hidden_size=32,
        num_departments=2,
        experts_per_department=2,
        shared_intermediate_size=16,
        private_intermediate_size=16,
        top_k=2,
        top_departments=1,
        shared_expert_intermediate_size=16,
        shared_expert_gate=True,
        router_bias=True,
    ),
)
# QUANTIZABLE_MICRO_LM with its dense block 32 wide: every projection of attention, dense
# MLP and head quantizes in groups of 16.
LINEARS_MICRO_LM = QUANTIZABLE_MICRO_LM.replace(dense_intermediate_size=32)
