"""DeepSeek-V2 (DeepseekV2ForCausalLM: DeepSeek-V2, V2-Lite) and DeepSeek-V3
(DeepseekV3ForCausalLM: DeepSeek-V3, Moonlight-16B-A3B) as transformers 5 runs them.

Attention is multi-head latent attention (deamoe_trt.lm.mla): optional q LoRA (q_lora_rank;
null: one q_proj), kv_lora_rank, split nope/rope query and key heads, v_head_dim, RMSNorms on
the two latents (eps 1e-6, as transformers builds them), softmax scale
(qk_nope_head_dim + qk_rope_head_dim)^-0.5 times YaRN's mscale(factor, mscale_all_dim)^2.
The rotary part rotates interleaved pairs (V2 always, V3 with rope_interleave): the import
reorders the rope rows of the query projection and of kv_a_proj_with_mqa into halves
(common.halves_order), so the cached rotated key part is in deamoe-trt's order.

Blocks below first_k_dense_replace have a dense MLP of intermediate_size; the others are MoE
with n_shared_experts ungated shared experts (one of their total width) and routing:
- V2 topk_method greedy: softmax, top-k over all experts (one department);
- V2 group_limited_greedy: softmax, n_group departments scored by their best expert,
  topk_group kept (department_score max);
- V3 noaux_tc: sigmoid, selection bias e_score_correction_bias, departments scored by their
  two best (sum_top2), norm_topk_prob as configured;
all times routed_scaling_factor. transformers' V2 router never renormalises, so a V2 config
with norm_topk_prob true (which DeepSeek's own code would honour) is refused rather than
guessed; so are DeepSeek's original fields that transformers ignores when they ask for
something else (moe_layer_freq != 1, scoring_func other than the family's).
V3's multi-token-prediction layers (num_nextn_predict_layers, stored as blocks after the last
one) are not part of the model: transformers skips them, and so does the import.
"""

from __future__ import annotations

import math
from typing import Any

from ...config import DeaMoEConfig
from ...errors import UsageError
from ...lm.config import LMConfig
from .common import (
    HFConfig,
    check_silu,
    dense_mlp,
    halves_order,
    norms,
    permuted_rows,
    rope_from_hf,
    routed_experts,
    shared_mlp,
)


def softmax_scale(qk_head_dim: int, scaling: dict[str, Any] | None) -> float:
    """transformers' yarn_apply_mscale over qk_head_dim^-0.5."""
    scale = qk_head_dim**-0.5
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        m_all = scaling.get("mscale_all_dim", 0)
        factor = float(scaling["factor"])
        if m_all and factor > 1:
            mscale = 0.1 * m_all * math.log(factor) + 1.0
            scale = scale * mscale * mscale
    return scale


def v3_routing(experts: int, n_group: int, topk_group: int, top_k: int, norm: bool, scale: float) -> dict[str, Any]:
    """DeepSeek-V3's noaux_tc routing as DeaMoE fields (the spec's DeepSeek-V3 special case):
    n_group departments scored by the sum of their two best selection scores, topk_group kept,
    sigmoid scores; the selection bias is router_bias (whether the checkpoint has one)."""
    return dict(
        num_departments=n_group,
        experts_per_department=experts // n_group,
        top_k=top_k,
        top_departments=topk_group,
        score_func="sigmoid",
        department_score="sum_top2",
        norm_topk_prob=norm,
        routed_scaling_factor=scale,
    )


def _routing(cfg: HFConfig, v3: bool, experts: int) -> dict[str, Any]:
    top_k = cfg.int("num_experts_per_tok")
    scale = float(cfg.get("routed_scaling_factor", 2.5 if v3 else 1.0))
    if v3:
        cfg.require("scoring_func", ("sigmoid",), "sigmoid", "DeepSeek-V3 scores experts with sigmoid")
        cfg.require("topk_method", ("noaux_tc",), "noaux_tc", "DeepSeek-V3 routes with noaux_tc")
        groups, kept = cfg.int("n_group", 1), cfg.int("topk_group", 1)
    else:
        cfg.require("scoring_func", ("softmax",), "softmax", "DeepSeek-V2 scores experts with softmax")
        methods = ("greedy", "group_limited_greedy")
        method = cfg.require("topk_method", methods, "greedy", "DeepSeek-V2 routes greedy or group_limited_greedy")
        if cfg.get("norm_topk_prob", False):
            raise cfg.refuse("norm_topk_prob", "transformers' DeepSeek-V2 router never renormalises its top-k weights")
        groups, kept = (cfg.int("n_group"), cfg.int("topk_group")) if method == "group_limited_greedy" else (1, 1)
    if groups < 1 or experts % groups:
        raise cfg.refuse("n_group", f"{experts} experts must split into n_group equal groups")
    if v3:
        norm = bool(cfg.get("norm_topk_prob", True))
        return {**v3_routing(experts, groups, kept, top_k, norm, scale), "router_bias": True}
    return dict(
        num_departments=groups,
        experts_per_department=experts // groups,
        top_k=top_k,
        top_departments=kept,
        score_func="softmax",
        department_score="max",
        norm_topk_prob=False,
        routed_scaling_factor=scale,
        router_bias=False,
    )


def lm_config(hf: dict[str, Any], where: str) -> LMConfig:
    v3 = hf["model_type"] == "deepseek_v3"
    cfg = HFConfig(hf, where, "DeepSeek-V3" if v3 else "DeepSeek-V2")
    check_silu(cfg)
    for name in ("attention_bias", "mlp_bias"):
        if cfg.get(name, False):
            raise cfg.refuse(name, "DeepSeek's released models have no projection biases; deamoe-trt's MLA has none")
    if cfg.int("moe_layer_freq", 1) != 1:
        raise cfg.refuse("moe_layer_freq", "transformers makes every block from first_k_dense_replace on MoE")
    layers = cfg.int("num_hidden_layers")
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", heads)
    if kv_heads != heads:
        raise cfg.refuse("num_key_value_heads", f"MLA expands its latent to all {heads} heads (set it to {heads})")
    theta, scaling = rope_from_hf(hf, 10000.0, where)
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim"), cfg.int("v_head_dim")
    first_dense = cfg.int("first_k_dense_replace", 0)
    dense = tuple(range(min(first_dense, layers)))
    if len(dense) == layers:
        raise UsageError(f"{where} describes a dense model (no MoE layers); deamoe-trt imports MoE models")
    experts, width = cfg.int("n_routed_experts"), cfg.int("moe_intermediate_size")
    shared = cfg.int("n_shared_experts", 0) * width
    moe = DeaMoEConfig(
        hidden_size=hidden,
        shared_intermediate_size=0,
        private_intermediate_size=width,
        shared_expert_intermediate_size=shared,
        **_routing(cfg, v3, experts),
    )
    return LMConfig(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=cfg.int("max_position_embeddings"),
        moe=moe,
        rope_theta=theta,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_scaling=scaling,
        dense_layers=dense,
        dense_intermediate_size=cfg.int("intermediate_size") if dense else 0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_multiplier=softmax_scale(nope + rope, scaling),
        kv_lora_rank=cfg.int("kv_lora_rank"),
        q_lora_rank=cfg.int("q_lora_rank", 0),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v,
        float32_router=True,  # transformers keeps gate.weight float32 in half models
    )


def block_sources(hf: dict[str, Any], config: LMConfig, index: dict, i: int) -> dict[str, Any]:
    interleave = hf["model_type"] == "deepseek_v2" or bool(hf.get("rope_interleave", True))
    src = f"model.layers.{i}."
    att = src + "self_attn."
    out = norms(src)
    c = config
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim

    def rope_rows(name: str, heads: int, width: int, start: int, cols: int) -> Any:
        if not interleave:
            return att + name
        order = halves_order(heads, width, start, c.qk_rope_head_dim)
        return permuted_rows(att + name, (heads * width, cols), order)

    if c.q_lora_rank:
        out["self_attn.q_a_proj.weight"] = att + "q_a_proj.weight"
        out["self_attn.q_a_layernorm.weight"] = att + "q_a_layernorm.weight"
        q_b = rope_rows("q_b_proj.weight", c.num_heads, qk, c.qk_nope_head_dim, c.q_lora_rank)
        out["self_attn.q_b_proj.weight"] = q_b
    else:
        out["self_attn.q_proj.weight"] = rope_rows("q_proj.weight", c.num_heads, qk, c.qk_nope_head_dim, c.hidden_size)
    kv_rows = c.kv_lora_rank + c.qk_rope_head_dim
    out["self_attn.kv_a_proj_with_mqa.weight"] = rope_rows(
        "kv_a_proj_with_mqa.weight", 1, kv_rows, c.kv_lora_rank, c.hidden_size
    )
    for name in ("kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"):
        out[f"self_attn.{name}"] = att + name
    if config.is_dense(i):
        return {**out, **dense_mlp(src)}
    moe = src + "mlp."
    out["mlp.router.weight"] = moe + "gate.weight"
    out["mlp.router.bias"] = moe + "gate.e_score_correction_bias"
    out.update(routed_experts(moe, index, config.moe.num_experts))
    out.update(shared_mlp(moe + "shared_experts."))
    return out


def ignored(hf: dict[str, Any]) -> tuple[str, ...]:
    """DeepSeek-V3's multi-token-prediction blocks, model.layers.{L}... after the L blocks."""
    layers, extra = int(hf.get("num_hidden_layers") or 0), int(hf.get("num_nextn_predict_layers") or 0)
    return tuple(f"model.layers.{layers + k}." for k in range(extra))
