"""Tiny random Hugging Face MoE blocks and models, built in code (no downloads)."""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN = 32
INPUT_SHAPE = (2, 5, HIDDEN)
TOLERANCE = 1e-5  # max|ours - hf| <= TOLERANCE * max|hf|


@torch.no_grad()
def randomize_(module: nn.Module, seed: int = 0, bias_range: tuple[float, float] = (0.0, 0.2)) -> nn.Module:
    """Every weight ~ N(0, 1/fan_in) (routing spread, outputs of order one); DeepSeek's
    e_score_correction_bias ~ U(bias_range), by default >= 0 so selection scores s + b > 0."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        fan_in = param.shape[-1] if param.dim() > 1 else 1
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
        else:
            param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))
    low, high = bias_range
    for name, buffer in module.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(low + (high - low) * torch.rand(buffer.shape, generator=gen))
    return module.eval()


def inputs(seed: int = 1, shape=INPUT_SHAPE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def errors(ours: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|)."""
    err = (ours.float() - ref.float()).abs().max().item()
    return err, err / ref.float().abs().max().item()


def assert_parity(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err, rel = errors(ours, ref)
    assert rel <= TOLERANCE, f"max abs error {err:.3g} is {rel:.3g} of the output scale (limit {TOLERANCE})"


def id_sets(ids: torch.Tensor) -> list[set[int]]:
    return [set(row) for row in ids.reshape(-1, ids.shape[-1]).tolist()]


# transformers 5.x configs -------------------------------------------------------------------

_ATTENTION = dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=64, experts_implementation="eager")


def mixtral_config(**overrides):
    from transformers import MixtralConfig

    fields = dict(hidden_size=HIDDEN, intermediate_size=16, num_local_experts=8, num_experts_per_tok=2, **_ATTENTION)
    return MixtralConfig(**{**fields, "num_hidden_layers": 2, **overrides})


def qwen2_moe_config(**overrides):
    from transformers import Qwen2MoeConfig

    fields = dict(
        hidden_size=HIDDEN,
        intermediate_size=48,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        **_ATTENTION,
    )
    return Qwen2MoeConfig(**{**fields, "num_hidden_layers": 2, **overrides})


def qwen3_moe_config(**overrides):
    from transformers import Qwen3MoeConfig

    fields = dict(
        hidden_size=HIDDEN,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        head_dim=8,
        **_ATTENTION,
    )
    return Qwen3MoeConfig(**{**fields, "num_hidden_layers": 2, **overrides})


def deepseek_v3_config(**overrides):
    from transformers import DeepseekV3Config

    fields = dict(
        hidden_size=HIDDEN,
        intermediate_size=48,
        moe_intermediate_size=16,
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
        n_shared_experts=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=64,
        experts_implementation="eager",
    )
    return DeepseekV3Config(**{**fields, "num_hidden_layers": 3, **overrides})


def hf_block(family: str, seed: int = 0, **overrides) -> nn.Module:
    """A transformers 5.x MoE block of family with random weights."""
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as cls

        config = mixtral_config(**overrides)
    elif family == "qwen2_moe":
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as cls

        config = qwen2_moe_config(**overrides)
    elif family == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as cls

        config = qwen3_moe_config(**overrides)
    elif family == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as cls

        config = deepseek_v3_config(**overrides)
    else:
        raise ValueError(family)
    return randomize_(cls(config), seed)


def hf_routing(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids, weights) a transformers 5.x block's router picks for x."""
    _, weights, ids = block.gate(x.reshape(-1, x.shape[-1]))
    return ids, weights
