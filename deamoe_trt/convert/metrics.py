"""What the conversion report measures, on held-out data: output error, expert choices,
bytes per decoding step (deamoe_trt.traffic's count), and for language models perplexity
and greedy next-token agreement."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..config import DeaMoEConfig
from ..routing import Routing
from ..traffic import BYTES_PER_WEIGHT, weights_loaded

# Tokens whose decoding steps are counted for bytes per step.
BYTES_TOKENS = 512
# Tokens per decoding step the report counts bytes at: one stream, and the few streams or
# speculative draft tokens a step verifies where users decode.
STEP_TOKENS = (1, 4, 8)


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """||output - reference|| / ||reference|| over all tokens (Frobenius)."""
    reference = reference.float()
    return float((output.float() - reference).norm() / reference.norm().clamp_min(1e-30))


def step_bytes(config: DeaMoEConfig, routing: Routing, bytes_per_weight: int, tokens: int = 1) -> float:
    """Mean bytes a decoding step of `tokens` tokens reads, over the steps `steps` forms
    from (up to BYTES_TOKENS of) routing's tokens."""
    groups = steps(routing.num_tokens, tokens)
    total = sum(weights_loaded(config, subset(routing, g), bytes_per_weight).total for g in groups)
    return total / max(len(groups), 1)


def steps(num_tokens: int, tokens: int) -> list[torch.Tensor]:
    """The decoding steps of `tokens` tokens each made from the first min(num_tokens,
    BYTES_TOKENS) held-out tokens: step s takes tokens s, s + n, s + 2n, ... (n = count //
    tokens), tokens far apart in the text, as the streams of a batch are; a remainder is
    left out. One step of all of them when there are fewer than `tokens`."""
    if tokens < 1:
        raise ValueError(f"tokens per step must be >= 1, got {tokens}")
    count = min(num_tokens, BYTES_TOKENS)
    n = count // tokens
    if n == 0:
        return [torch.arange(count)] if count else []
    return [torch.arange(s, n * tokens, n) for s in range(n)]


def subset(routing: Routing, index: torch.Tensor) -> Routing:
    """The routing of the tokens at index alone (one decoding step of those tokens)."""
    return Routing(
        expert_ids=routing.expert_ids[index],
        weights=routing.weights[index],
        department_ids=routing.department_ids[index],
        kept_departments=routing.kept_departments[index],
        scores=routing.scores[index],
    )


def one_token(routing: Routing, t: int) -> Routing:
    """Token t's routing alone (a one-token decoding step)."""
    return subset(routing, torch.tensor([t]))


def layer_step_bytes(layer, routing: Routing, tokens: int = 1) -> float:
    """step_bytes for a DeaMoE layer; a layer of another structure (a baseline) counts its own."""
    bytes_per_weight = BYTES_PER_WEIGHT[layer.dtype]
    if hasattr(layer, "step_bytes"):
        return layer.step_bytes(routing, bytes_per_weight, tokens)
    return step_bytes(layer.config, routing, bytes_per_weight, tokens)


@torch.no_grad()
def error_split(layer, source, order: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    """(routing error, weights error) of layer against source on tokens x, both relative to
    ||y_source||: the hybrid y_r = the source's experts run on the layer's expert choices and
    weights (its expert i is source expert order[i]); routing error ||y_r - y_source||, weights
    error ||y - y_r||. The two bound the total error (triangle inequality), not sum to it."""
    x = x.to(source.dtype)
    routing = layer.route(x)
    ids = order.to(routing.expert_ids.device)[routing.expert_ids]
    c = source.config
    hybrid_routing = Routing(
        expert_ids=ids,
        weights=routing.weights,
        department_ids=ids // c.experts_per_department,
        kept_departments=(ids // c.experts_per_department)[:, :1],  # unused: the source has no shared parts
        scores=routing.scores,
    )
    y_source = source.forward_routed(x, source.route(x))
    y_hybrid = source.forward_routed(x, hybrid_routing)
    y = layer.forward_routed(x, routing)
    scale = y_source.norm().clamp_min(1e-30)
    return float((y_hybrid - y_source).norm() / scale), float((y.float() - y_hybrid).norm() / scale)


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
