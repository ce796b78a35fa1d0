"""Vanilla MoE language models made here to test the conversion on, from the shipped text.

(a) upcycled: a dense model (one expert, top-1: its FFN) trained first, then every expert
    starts as a copy of that FFN with a fresh router, and the MoE trains on (how Mixtral-
    and Qwen-MoE-style models were made);
(b) scratch: the same MoE trained from a random init for the same total steps (unlike
    experts: the hard case).
Both are deamoe-trt language models whose FFNs are vanilla MoEs (one department, f_s = 0).
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import top_k_moe
from ..lm import LMConfig
from ..train.compare import upcycle
from ..train.lm import TrainResult, TrainSettings, train

EXPERTS, TOP_K, WIDTH = 16, 4, 64

MOE = LMConfig(
    vocab_size=256,
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    moe=top_k_moe(hidden_size=128, num_experts=EXPERTS, intermediate_size=WIDTH, top_k=TOP_K, norm_topk_prob=True),
)
DENSE = MOE.replace(moe=MOE.moe.replace(experts_per_department=1, top_k=1))
SETTINGS = TrainSettings(steps=300, batch_size=16, seq_len=128, lr=3e-3, warmup=20, eval_batches=4, log_every=25)


def settings_for(steps: int, seed: int = 0) -> TrainSettings:
    return dataclasses.replace(SETTINGS, steps=steps, seed=seed)


@torch.no_grad()
def make_upcycled(dense_steps: int, moe_steps: int, *, seed: int = 0, progress: bool = True) -> TrainResult:
    dense = train(DENSE, settings_for(dense_steps, seed), progress=progress, label="train dense")
    moe = upcycle(dense.model, MOE, seed=seed)  # every expert a copy of the dense FFN
    return train(settings=settings_for(moe_steps, seed), model=moe, progress=progress, label="train upcycled MoE")


def make_scratch(steps: int, *, seed: int = 0, progress: bool = True, corpus: str = "persuasion") -> TrainResult:
    """MOE trained from a random init on the shipped text `corpus`."""
    return train(MOE, settings_for(steps, seed), progress=progress, label="train MoE from scratch", corpus=corpus)


def fine_grained(
    *, layers: int = 6, hidden: int = 256, experts: int = 32, width: int = 128, top_k: int = 4, context: int = 256
) -> LMConfig:
    """A byte-level MoE LM of more realistic proportions than MOE (default 6 blocks, d = 256,
    32 fine-grained experts of width 128, top-4: an eighth of the expert neurons per token),
    vanilla (one department, f_s = 0): a conversion source trained from scratch."""
    return LMConfig(
        vocab_size=256,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=context,
        moe=top_k_moe(
            hidden_size=hidden, num_experts=experts, intermediate_size=width, top_k=top_k, norm_topk_prob=True
        ),
    )


FINE_GRAINED = fine_grained()
# About 1.9 s a step on 2 threads of this project's 2-vCPU CI machine: 1200 steps (4.9M
# tokens, 1.4 passes over the training part of the "austen" text) in about 40 minutes.
FINE_GRAINED_SETTINGS = TrainSettings(
    steps=1200, batch_size=16, seq_len=256, lr=2e-3, warmup=60, eval_batches=16, log_every=50, threads=2
)
FINE_GRAINED_CORPUS = "austen"


def make_fine_grained(
    steps: int = FINE_GRAINED_SETTINGS.steps,
    *,
    config: LMConfig = FINE_GRAINED,
    seed: int = 0,
    progress: bool = True,
    seq_len: int = FINE_GRAINED_SETTINGS.seq_len,
) -> TrainResult:
    """config trained from a random init on the shipped six novels (seeded, two threads)."""
    settings = dataclasses.replace(FINE_GRAINED_SETTINGS, steps=steps, seed=seed, seq_len=seq_len)
    return train(config, settings, progress=progress, label="train fine-grained MoE", corpus=FINE_GRAINED_CORPUS)
