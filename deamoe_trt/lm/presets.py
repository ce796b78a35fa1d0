"""Language-model shapes: one to train and decode on a CPU in seconds, one shaped for GPUs."""

from __future__ import annotations

from ..config import DeaMoEConfig
from ..errors import UsageError
from .config import LMConfig

LM_PRESETS: dict[str, LMConfig] = {
    # Trains on 2 CPU cores in a couple of minutes on a byte-level text; the shipped tiny-lm
    # (deamoe_trt.lm.shipped).
    # DeaMoE FFN: 4 departments of 4 experts, each expert 96 wide of which 64 are its
    # department's shared part (f_s = 2 * f_p); 4 experts per token from the top 2 departments.
    "tiny-lm": LMConfig(
        vocab_size=256,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        moe=DeaMoEConfig(
            hidden_size=128,
            num_departments=4,
            experts_per_department=4,
            shared_intermediate_size=64,
            private_intermediate_size=32,
            top_k=4,
            top_departments=2,
            score_func="softmax",
            department_score="max",
            norm_topk_prob=True,
        ),
    ),
    # Four blocks shaped like a 7B-class MoE decoder (Llama/Mistral attention: d=4096, 32
    # heads of 128, 8 KV heads, 32k vocabulary) with a Qwen3-style DeaMoE FFN: 64 experts
    # of width 1024 as 8 departments of 8, half of each expert shared in its department,
    # top-8 from the top-2 departments, softmax, norm_topk_prob. Per token the FFN loads at
    # most 62.5% of its expanded twin's bytes, as qwen3-30b-a3b-layer. About 2.2e9
    # parameters (4.4 GB in bf16; the expanded twin 3.6e9, 7.3 GB): a GPU shape.
    "moe-7b-4l": LMConfig(
        vocab_size=32000,
        hidden_size=4096,
        num_layers=4,
        num_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        moe=DeaMoEConfig(
            hidden_size=4096,
            num_departments=8,
            experts_per_department=8,
            shared_intermediate_size=512,
            private_intermediate_size=512,
            top_k=8,
            top_departments=2,
            score_func="softmax",
            department_score="max",
            norm_topk_prob=True,
        ),
    ),
}


def get_lm_preset(name: str) -> LMConfig:
    try:
        return LM_PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown language-model preset {name!r}; choose one of: {', '.join(LM_PRESETS)}") from None
