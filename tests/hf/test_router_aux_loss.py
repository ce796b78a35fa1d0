"""The load-balancing loss as transformers' Trainer takes it (Mixtral's fields): with
output_router_logits the model's loss is the next-token cross-entropy plus
router_aux_loss_coef times the Switch-Transformer term, averaged over the DeaMoE blocks,
here recomputed from the spec's routing of each block's FFN input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from deamoe_trt.hf.modeling import DeaMoEForCausalLM
from spec_reference import spec_route

from .models import model

pytestmark = pytest.mark.slow  # transformers loads: seconds


def balancing_term(hidden: torch.Tensor, mlp) -> float:
    """N * sum_e f_e * P_e from the spec's per-token routing of hidden [T, d], in float64."""
    cfg, n = mlp.config, mlp.config.num_experts
    logits = (hidden.double() @ mlp.router.weight.double().t()).tolist()
    bias = None if mlp.router.bias is None else mlp.router.bias.tolist()
    counts, score_sums = [0] * n, [0.0] * n
    for row in logits:
        _, experts, _ = spec_route(row, bias, cfg)
        for e in experts:
            counts[e] += 1
        if cfg.score_func == "softmax":
            total = sum(math.exp(v - max(row)) for v in row)
            scores = [math.exp(v - max(row)) / total for v in row]
        else:
            scores = [1 / (1 + math.exp(-v)) for v in row]
        score_sums = [a + b for a, b in zip(score_sums, scores, strict=True)]
    slots, tokens = sum(counts), len(logits)
    return n * sum(counts[e] / slots * score_sums[e] / tokens for e in range(n))


def test_the_loss_adds_the_coefficient_times_the_load_balancing_term():
    lm = model("shared_expert_dense_block")  # two DeaMoE blocks and a dense one
    hf = DeaMoEForCausalLM.from_lm(lm)
    hf.config.router_aux_loss_coef = 0.3
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    inputs: list[torch.Tensor] = []
    hooks = [
        block.post_attention_layernorm.register_forward_hook(
            lambda _m, _i, out: inputs.append(out.reshape(-1, out.shape[-1]).detach())
        )
        for block in hf.model.layers
        if block.is_moe
    ]
    with torch.no_grad():
        plain = hf(input_ids=ids, labels=ids)
        out = hf(input_ids=ids, labels=ids, output_router_logits=True)
    for hook in hooks:
        hook.remove()
    moe = [block.mlp for block in hf.model.layers if block.is_moe]
    assert len(moe) == 2 and len(inputs) == 4
    terms = [balancing_term(x, mlp) for x, mlp in zip(inputs[2:], moe, strict=True)]
    aux = sum(terms) / len(terms)
    ce = F.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]), ids[:, 1:].reshape(-1))
    assert plain.aux_loss is None and torch.equal(plain.loss, ce)
    assert out.aux_loss.item() == pytest.approx(aux, rel=1e-5)
    assert out.loss.item() == pytest.approx(ce.item() + 0.3 * aux, rel=1e-6)
    assert 0.3 * aux > 1e-2  # the term moves the loss: the sum above tells the two apart
    assert [s.shape for s in out.router_logits] == [(24, mlp.config.num_experts) for mlp in moe]


def test_the_balancing_term_trains_the_routers():
    hf = DeaMoEForCausalLM.from_lm(model("gqa"))
    hf.config.output_router_logits, hf.config.router_aux_loss_coef = True, 1.0
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    out = hf(input_ids=ids, labels=ids)
    (router,) = [b.mlp.router.weight for b in hf.model.layers if b.is_moe][:1]
    (grad_aux,) = torch.autograd.grad(out.aux_loss, router)
    assert grad_aux.abs().max() > 1e-4  # the term reaches the router through its mean scores
