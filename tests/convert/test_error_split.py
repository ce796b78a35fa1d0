"""The split of a layer's error into what its routing causes and what its weights cause."""

from __future__ import annotations

import torch

from deamoe_trt import DeaMoELayer
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.convert import baselines
from deamoe_trt.convert.metrics import error_split, relative_error
from deamoe_trt.inputs import random_hidden

SOURCE = DeaMoEConfig(
    hidden_size=32,
    num_departments=1,
    experts_per_department=8,
    shared_intermediate_size=0,
    private_intermediate_size=24,
    top_k=4,
    top_departments=1,
)


@torch.no_grad()
def test_fewer_experts_with_the_same_weights_is_all_routing_error():
    source = DeaMoELayer.random(SOURCE, seed=0)
    x = random_hidden(128, 32, seed=1)
    layer = baselines.lowered_topk_layer(source, 2)
    routing, weights = error_split(layer, source, torch.arange(8), x)
    assert weights < 1e-6
    assert abs(routing - relative_error(layer(x), source(x))) < 1e-6 and routing > 0.1


@torch.no_grad()
def test_narrower_experts_with_the_same_routing_is_all_weights_error():
    source = DeaMoELayer.random(SOURCE, seed=0)
    x, held = random_hidden(2048, 32, seed=1), random_hidden(128, 32, seed=2)
    layer = baselines.pruned_layer(source, x, 12)
    routing, weights = error_split(layer, source, torch.arange(8), held)
    assert routing == 0.0
    assert abs(weights - relative_error(layer(held), source(held))) < 1e-6 and weights > 0.01


def test_a_permuted_copy_of_the_source_has_no_error_of_either_kind():
    source = DeaMoELayer.random(SOURCE, seed=0)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    permuted = DeaMoELayer(SOURCE)
    with torch.no_grad():
        permuted.router.weight.copy_(source.router.weight[order])
        permuted.experts.gate_up.copy_(source.experts.gate_up[order])
        permuted.experts.down.copy_(source.experts.down[order])
    routing, weights = error_split(permuted, source, order, random_hidden(64, 32, seed=4))
    assert routing < 1e-6 and weights < 1e-6
