"""IBM Granite MoE (GraniteMoeForCausalLM) and Granite MoE Shared (GraniteMoeSharedForCausalLM).

Llama attention and a Mixtral-like top-k MoE, with four scalings deamoe-trt's LMConfig
carries: the embeddings times embedding_multiplier, each residual branch times
residual_multiplier, attention scores times attention_multiplier (instead of
head_dim^-0.5), logits divided by logits_scaling. The router takes the softmax of its
top-k logits, which equals the spec's softmax over all experts with norm_topk_prob.
granitemoeshared adds an ungated shared expert (shared_mlp) of width shared_intermediate_size,
summed with the routed experts before the residual scaling, as the DeaMoE layer's shared
expert is.

Checkpoints keep Granite's fused names: block_sparse_moe.input_linear.weight [E, 2I, d]
(gate rows, then up rows), block_sparse_moe.output_linear.weight [E, d, I] and
block_sparse_moe.router.layer.weight; transformers 5's in-memory names are read too.
"""

from __future__ import annotations

from typing import Any

from ...config import top_k_moe
from ...lm.config import LMConfig
from .common import HFConfig, check_silu, lm_fields, norms, rope_from_hf


def lm_config(hf: dict[str, Any], where: str) -> LMConfig:
    t = hf["model_type"]
    cfg = HFConfig(hf, where, "Granite MoE")
    check_silu(cfg)
    hidden = cfg.int("hidden_size")
    theta, scaling = rope_from_hf(hf, 10000.0, where)
    shared = cfg.int("shared_intermediate_size", 0) if t == "granitemoeshared" else 0
    moe = top_k_moe(
        hidden_size=hidden,
        num_experts=cfg.int("num_local_experts"),
        intermediate_size=cfg.int("intermediate_size"),
        top_k=cfg.int("num_experts_per_tok"),
        norm_topk_prob=True,  # softmax over the top-k logits
        shared_expert_intermediate_size=shared,
    )
    bias = bool(cfg.get("attention_bias", False))
    return LMConfig(
        **lm_fields(cfg, rms_norm_eps=1e-6),
        moe=moe,
        rope_theta=theta,
        qkv_bias=bias,
        o_bias=bias,
        rope_scaling=scaling,
        embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
        attention_multiplier=float(cfg.get("attention_multiplier", 1.0)),
        logits_scaling=float(cfg.get("logits_scaling", 1.0)),
    )


def block_sources(hf: dict[str, Any], config: LMConfig, index: dict, i: int) -> dict[str, Any]:
    src = f"model.layers.{i}."
    out = norms(src)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out[f"self_attn.{proj}.weight"] = src + f"self_attn.{proj}.weight"
        out[f"self_attn.{proj}.bias"] = src + f"self_attn.{proj}.bias"
    moe = src + "block_sparse_moe."
    if moe + "experts.gate_up_proj" in index:  # transformers 5's names
        out["mlp.router.weight"] = moe + "router.weight"
        out["mlp.experts.gate_up"] = ("fused", moe + "experts.gate_up_proj")
        out["mlp.experts.down"] = ("fused", moe + "experts.down_proj")
    else:
        out["mlp.router.weight"] = moe + "router.layer.weight"
        out["mlp.experts.gate_up"] = ("fused", moe + "input_linear.weight")
        out["mlp.experts.down"] = ("fused", moe + "output_linear.weight")
    out["mlp.shared_experts.gate_up"] = src + "shared_mlp.input_linear.weight"
    out["mlp.shared_experts.down"] = src + "shared_mlp.output_linear.weight"
    return out
