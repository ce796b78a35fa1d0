"""Reference shapes from the spec ("Reference shapes (presets)"), and `init`'s random
checkpoint of one (write_random)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .config import DeaMoEConfig
from .errors import UsageError

if TYPE_CHECKING:
    import torch

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


def write_random(
    output: str | Path, preset: str, layers: int, *, seed: int, dtype: torch.dtype, force: bool = False, note=None
) -> Path:
    """`deamoe-trt init`: a stack of `layers` randomly initialised layers of preset, written
    as a layer checkpoint to output (a layer checkpoint there is replaced whole; anything else
    only with force)."""
    from ._io import json_format_is, replaced_directory
    from .checkpoint import FORMAT
    from .layer import DeaMoEStack
    from .resources import check_fits
    from .traffic import layer_bytes

    config = get_preset(preset)
    check_fits(layers * layer_bytes(config, dtype), f"{layers:,} layer(s) of {preset}")
    with replaced_directory(output, json_format_is(FORMAT), "layer checkpoint", force=force, note=note) as staging:
        DeaMoEStack.random(config, layers, seed=seed, dtype=dtype).save_pretrained(staging)
    return Path(output)
