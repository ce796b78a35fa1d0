"""The tiny DeaMoE language models the transformers tests export, one per attention variant,
and the reference's greedy tokens (recomputed from the whole sequence at every step, no cache)."""

from __future__ import annotations

import torch

from configs import MICRO_LM, QUANTIZABLE_MICRO_LM
from deamoe_trt.lm.model import DeaMoELM

MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
VARIANTS = {
    "gqa": MICRO_LM,
    "sliding_window_tied_head": MICRO_LM.replace(
        sliding_window=4, sliding_window_layers=(0,), tie_word_embeddings=True
    ),
    "sinks_head_qk_norm_biases": MICRO_LM.replace(attention_sinks=True, qk_norm="head", qkv_bias=True, o_bias=True),
    "full_qk_norm_clip": MICRO_LM.replace(qk_norm="full", clip_qkv=0.5),
    "mla": QUANTIZABLE_MICRO_LM.replace(**MLA, q_lora_rank=8, attention_multiplier=16**-0.5),
    "shared_expert_dense_block": QUANTIZABLE_MICRO_LM,
}
PROMPT_TOKENS = 8
NEW_TOKENS = 32


def model(variant: str) -> DeaMoELM:
    lm = DeaMoELM.random(VARIANTS[variant], seed=7)
    with torch.no_grad():  # sinks and biases start at zero; move them so a mix-up shows
        for name, p in lm.named_parameters():
            if name.endswith(("sinks", ".bias")):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return lm.eval()


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def reference_greedy(lm: DeaMoELM, ids: torch.Tensor, steps: int = NEW_TOKENS) -> list[int]:
    seq = ids
    for _ in range(steps):
        nxt = lm(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat((seq, nxt), dim=1)
    return seq[0, ids.shape[1] :].tolist()
