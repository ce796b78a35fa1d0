"""What the conversion report measures, on held-out data: output error, expert choices,
bytes per decoding step (deamoe_trt.traffic's count), and for language models perplexity
and greedy next-token agreement."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..config import DeaMoEConfig
from ..routing import Routing
from ..traffic import weights_loaded

# Tokens whose one-token decoding steps are counted for bytes per step.
BYTES_TOKENS = 512


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """||output - reference|| / ||reference|| over all tokens (Frobenius)."""
    reference = reference.float()
    return float((output.float() - reference).norm() / reference.norm().clamp_min(1e-30))


def step_bytes(config: DeaMoEConfig, routing: Routing, bytes_per_weight: int) -> float:
    """Mean bytes a one-token decoding step reads, over (up to BYTES_TOKENS of) routing's tokens."""
    total = 0
    count = min(routing.num_tokens, BYTES_TOKENS)
    for t in range(count):
        one = Routing(
            expert_ids=routing.expert_ids[t : t + 1],
            weights=routing.weights[t : t + 1],
            department_ids=routing.department_ids[t : t + 1],
            kept_departments=routing.kept_departments[t : t + 1],
            scores=routing.scores[t : t + 1],
        )
        total += weights_loaded(config, one, bytes_per_weight).total
    return total / max(count, 1)


def departments_per_token(routing: Routing) -> float:
    """Mean number of distinct departments among a token's kept experts."""
    ids = torch.sort(routing.department_ids, dim=1).values
    return float(1 + (ids[:, 1:] != ids[:, :-1]).sum(1).float().mean())


@torch.no_grad()
def lm_quality(model, source_logits: torch.Tensor, windows: torch.Tensor) -> dict[str, float]:
    """Held-out perplexity of model on windows [W, L] (next token) and how often its greedy
    next token equals the source's (source_logits [W, L, V])."""
    logits = model(windows[:, :-1]).logits
    ce = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    same = (logits.argmax(-1) == source_logits.argmax(-1)).float().mean()
    return {"perplexity": math.exp(ce.item()), "next_token_agreement": float(same)}
