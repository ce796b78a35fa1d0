"""Tiny random Granite MoE, ERNIE-4.5-MoE and DeepSeek-V2/V3 models, built with transformers
and saved like downloaded ones (config.json + safetensors + tokenizer), one variant per code
path of the families' import:

- granitemoe: all four Granite scalings away from 1 and attention biases;
- granitemoeshared: plus the shared expert;
- ernie4_5_moe: a dense first block and dense blocks between MoE ones (moe_layer_start_index,
  moe_layer_interval), shared experts, the selection bias, interleaved rotary, tied head;
- deepseek_v2_greedy: q LoRA, greedy routing, a dense first block;
- deepseek_v2_groups: no q LoRA, group_limited_greedy, YaRN with mscale / mscale_all_dim;
- deepseek_v3: no q LoRA, noaux_tc (sigmoid, correction bias, groups), interleaved rotary;
- deepseek_v3_lora: q LoRA, rope_interleave false, YaRN, norm_topk_prob false.

Norm weights, biases and the routers' correction biases are randomised so that a wrong or
missing one shows (transformers initialises them to constants).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .hf_lm_models import CHAT_TEMPLATE, VOCAB, make_tokenizer

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    max_position_embeddings=128,
    initializer_range=0.1,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
MLA = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8)


def hf_config(variant: str):
    import transformers as T

    if variant in ("granitemoe", "granitemoeshared"):
        cls = T.GraniteMoeSharedConfig if variant == "granitemoeshared" else T.GraniteMoeConfig
        extra = {"shared_intermediate_size": 24} if variant == "granitemoeshared" else {}
        return cls(
            **COMMON,
            **extra,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=16,
            num_local_experts=6,
            num_experts_per_tok=2,
            attention_bias=True,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.3,
            logits_scaling=1.7,
        )
    if variant == "ernie4_5_moe":
        return T.Ernie4_5_MoeConfig(
            **COMMON,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=40,
            moe_intermediate_size=16,
            moe_num_experts=8,
            moe_k=3,
            moe_num_shared_experts=2,
            moe_layer_start_index=1,
            moe_layer_interval=2,
            tie_word_embeddings=True,
        )
    if variant.startswith("deepseek_v2"):
        groups = variant == "deepseek_v2_groups"
        return T.DeepseekV2Config(
            **COMMON,
            **MLA,
            num_hidden_layers=3,
            intermediate_size=40,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=2,
            first_k_dense_replace=0 if groups else 1,
            q_lora_rank=None if groups else 24,
            v_head_dim=12,
            topk_method="group_limited_greedy" if groups else "greedy",
            n_group=4 if groups else None,
            topk_group=2 if groups else None,
            routed_scaling_factor=1.5,
            rope_parameters=YARN if groups else None,
        )
    if variant.startswith("deepseek_v3"):
        lora = variant == "deepseek_v3_lora"
        return T.DeepseekV3Config(
            **COMMON,
            **MLA,
            num_hidden_layers=3,
            intermediate_size=40,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            first_k_dense_replace=1,
            q_lora_rank=24 if lora else None,
            v_head_dim=12,
            n_group=4,
            topk_group=2,
            norm_topk_prob=not lora,
            routed_scaling_factor=2.5,
            rope_interleave=not lora,
            rope_parameters=YARN if lora else None,
        )
    raise ValueError(variant)


VARIANTS = (
    "granitemoe",
    "granitemoeshared",
    "ernie4_5_moe",
    "deepseek_v2_greedy",
    "deepseek_v2_groups",
    "deepseek_v3",
    "deepseek_v3_lora",
)
MLA_VARIANTS = tuple(v for v in VARIANTS if v.startswith("deepseek"))


def build_family_model(variant: str, directory: Path, *, seed: int = 0, dtype=torch.float32):
    """A random HF causal LM of variant saved in directory; returns the model (eval, fp32)."""
    import transformers as T

    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(hf_config(variant), attn_implementation="eager")
    with torch.no_grad():
        tensors = dict(model.named_parameters()) | dict(model.named_buffers())
        for name, tensor in tensors.items():
            if name.endswith("norm.weight"):
                tensor.copy_(1 + 0.2 * torch.randn_like(tensor))
            elif name.endswith(".bias"):
                tensor.copy_(0.1 * torch.randn_like(tensor))
            elif name.endswith("e_score_correction_bias"):
                tensor.copy_(0.05 * torch.randn_like(tensor))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model = model.to(dtype).eval()
    model.save_pretrained(directory)
    make_tokenizer().save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "eos_token": "</s>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return model
