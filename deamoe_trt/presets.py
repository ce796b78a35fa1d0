"""Reference shapes from the spec ("Reference shapes (presets)")."""

from __future__ import annotations

from .config import DeaMoEConfig
from .errors import UsageError

PRESETS: dict[str, DeaMoEConfig] = {
    # Small enough for every test; softmax, max department score.
    "tiny": DeaMoEConfig(
        hidden_size=64,
        num_departments=4,
        experts_per_department=4,
        shared_intermediate_size=32,
        private_intermediate_size=16,
        top_k=4,
        top_departments=2,
        score_func="softmax",
        department_score="max",
    ),
    # Qwen3-30B-A3B's MoE layer in DeaMoE form: 128 experts of width 768 as 16 departments
    # of 8, half of each expert's width shared within its department.
    "qwen3-30b-a3b-layer": DeaMoEConfig(
        hidden_size=2048,
        num_departments=16,
        experts_per_department=8,
        shared_intermediate_size=384,
        private_intermediate_size=384,
        top_k=8,
        top_departments=2,
        score_func="softmax",
        department_score="max",
        norm_topk_prob=True,
    ),
    # DeepSeek-V3's MoE layer in DeaMoE form: 256 experts of width 2048 as 8 departments
    # (its routing groups) of 32, 1536 of each expert's 2048 neurons shared.
    "deepseek-v3-layer": DeaMoEConfig(
        hidden_size=7168,
        num_departments=8,
        experts_per_department=32,
        shared_intermediate_size=1536,
        private_intermediate_size=512,
        top_k=8,
        top_departments=2,
        score_func="sigmoid",
        department_score="sum_top2",
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        router_bias=True,
        shared_expert_intermediate_size=2048,
    ),
}


def get_preset(name: str) -> DeaMoEConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
