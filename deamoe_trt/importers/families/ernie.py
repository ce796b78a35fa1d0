"""Baidu ERNIE-4.5-MoE (Ernie4_5_MoeForCausalLM), e.g. ERNIE-4.5-21B-A3B.

- Blocks are MoE where (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
  moe_layer_end_index (-1: the last block); the others have a dense MLP of intermediate_size.
- The router: softmax over all experts in float32, selection by probability plus
  moe_statics.e_score_correction_bias (the spec's selection-only router.bias), weights the
  kept probabilities divided by max(their sum, moe_norm_min). The spec divides by sum + 1e-20,
  which is the same number whenever the sum is >= moe_norm_min; configs whose floor could
  matter (above 1e-6) are refused.
- moe_num_shared_experts ungated shared experts of width moe_intermediate_size each, kept as
  one shared expert of their total width.
- Rotary embeddings rotate interleaved pairs (GLM style) over the whole head: the import
  reorders each head's q_proj and k_proj rows into halves (see common.halves_order), so
  deamoe-trt's rotary gives the same scores.
- use_bias (biases on every projection) is refused.
"""

from __future__ import annotations

from typing import Any

from ...config import top_k_moe
from ...errors import UsageError
from ...lm.config import LMConfig
from .common import (
    HFConfig,
    check_silu,
    dense_mlp,
    halves_order,
    lm_fields,
    norms,
    permuted_rows,
    rope_from_hf,
    routed_experts,
    shared_mlp,
    transformed,
)

MAX_NORM_MIN = 1e-6


def moe_blocks(cfg: HFConfig, layers: int) -> list[int]:
    start = cfg.int("moe_layer_start_index", 1)
    end = cfg.int("moe_layer_end_index", -1)
    end = layers - 1 if end == -1 else end
    interval = cfg.int("moe_layer_interval", 1)
    if interval < 1:
        raise cfg.refuse("moe_layer_interval", "it must be >= 1")
    return [i for i in range(layers) if (i + 1) % interval == 0 and start <= i <= end]


def lm_config(hf: dict[str, Any], where: str) -> LMConfig:
    cfg = HFConfig(hf, where, "ERNIE-4.5-MoE")
    check_silu(cfg)
    if cfg.get("use_bias", False):
        raise cfg.refuse("use_bias", "deamoe-trt imports ERNIE-4.5-MoE without projection biases")
    norm_min = float(cfg.get("moe_norm_min", 1e-12))
    if norm_min > MAX_NORM_MIN:
        why = f"deamoe-trt renormalises by sum + 1e-20, the same only for floors <= {MAX_NORM_MIN}"
        raise cfg.refuse("moe_norm_min", why)
    layers = cfg.int("num_hidden_layers")
    hidden = cfg.int("hidden_size")
    theta, scaling = rope_from_hf(hf, 500000.0, where)
    moe = set(moe_blocks(cfg, layers))
    if not moe:
        raise UsageError(f"{where} describes a dense model (no MoE layers); deamoe-trt imports MoE models")
    width = cfg.int("moe_intermediate_size")
    shared = cfg.int("moe_num_shared_experts", 0)
    dense = tuple(i for i in range(layers) if i not in moe)
    return LMConfig(
        **lm_fields(cfg, rms_norm_eps=1e-5, tie_word_embeddings=True),
        moe=top_k_moe(
            hidden_size=hidden,
            num_experts=cfg.int("moe_num_experts"),
            intermediate_size=width,
            top_k=cfg.int("moe_k"),
            norm_topk_prob=True,
            router_bias=True,
            shared_expert_intermediate_size=shared * width,
        ),
        rope_theta=theta,
        rope_scaling=scaling,
        dense_layers=dense,
        dense_intermediate_size=cfg.int("intermediate_size") if dense else 0,
        float32_router=True,  # transformers keeps gate.weight float32 in half models
    )


def block_sources(hf: dict[str, Any], config: LMConfig, index: dict, i: int) -> dict[str, Any]:
    src = f"model.layers.{i}."
    out = norms(src)
    d, hd = config.hidden_size, config.head_dim
    for proj, heads in (("q_proj", config.num_heads), ("k_proj", config.num_key_value_heads)):
        order = halves_order(heads, hd, 0, hd)
        out[f"self_attn.{proj}.weight"] = permuted_rows(src + f"self_attn.{proj}.weight", (heads * hd, d), order)
    for proj in ("v_proj", "o_proj"):
        out[f"self_attn.{proj}.weight"] = src + f"self_attn.{proj}.weight"
    if config.is_dense(i):
        return {**out, **dense_mlp(src)}
    moe = src + "mlp."
    n = config.moe.num_experts
    out["mlp.router.weight"] = moe + "gate.weight"
    bias = moe + "moe_statics.e_score_correction_bias"
    if moe + "gate.moe_statics.e_score_correction_bias" in index:  # transformers 5's in-memory name
        bias = moe + "gate.moe_statics.e_score_correction_bias"
    out["mlp.router.bias"] = transformed(bias, (1, n), lambda t: t.reshape(-1))
    out.update(routed_experts(moe, index, n))
    out.update(shared_mlp(moe + "shared_experts."))
    return out
