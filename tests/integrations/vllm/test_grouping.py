"""The two grouped-expert problems the vLLM model hands FusedMoE add up to the layer's own output,
and the department GEMM touches only departments that hold one of the token's experts."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.integrations.vllm.grouping import department_slots, department_slots_per_token, expert_slots
from deamoe_trt.layer import DeaMoELayer

CONFIGS = {
    # g < k: a token's k experts spread over up to g departments.
    "softmax g2 k4": DeaMoEConfig(
        hidden_size=32,
        num_departments=4,
        experts_per_department=4,
        shared_intermediate_size=16,
        private_intermediate_size=8,
        top_k=4,
        top_departments=2,
    ),
    # g > k: slots = k, and some kept departments always go without an expert.
    "sigmoid bias g3 k2": DeaMoEConfig(
        hidden_size=32,
        num_departments=4,
        experts_per_department=2,
        shared_intermediate_size=16,
        private_intermediate_size=8,
        top_k=2,
        top_departments=3,
        score_func="sigmoid",
        department_score="sum",
        router_bias=True,
        routed_scaling_factor=2.5,
    ),
    "one department": DeaMoEConfig(
        hidden_size=32,
        num_departments=1,
        experts_per_department=8,
        shared_intermediate_size=16,
        private_intermediate_size=8,
        top_k=2,
        top_departments=1,
    ),
}


def grouped(part, weights: torch.Tensor, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum over slots of weight * group(x), one token and slot at a time (what a grouped GEMM computes)."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, g in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            out[t] += w * part.forward_group(g, x[t : t + 1]).double()[0]
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_department_and_expert_slots_sum_to_the_layer_output(name):
    layer = DeaMoELayer.random(CONFIGS[name], seed=4)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(5))
    routing = layer.route(x)
    dept_w, dept_ids = department_slots(routing, layer.config)
    exp_w, exp_ids = expert_slots(routing)
    assert dept_ids.dtype == exp_ids.dtype == torch.int32 and dept_w.dtype == torch.float32
    assert dept_ids.shape == (40, department_slots_per_token(layer.config))
    y = grouped(layer.departments, dept_w, dept_ids, x) + grouped(layer.experts, exp_w, exp_ids, x)
    torch.testing.assert_close(y.float(), layer.forward_routed(x, routing), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CONFIGS)
def test_department_slots_name_only_departments_holding_an_expert(name):
    config = CONFIGS[name]
    layer = DeaMoELayer.random(config, seed=6)
    with torch.no_grad():
        routing = layer.route(torch.randn(64, 32, generator=torch.Generator().manual_seed(7)))
    weights, ids = department_slots(routing, config)
    for t in range(64):
        holding = set(routing.department_ids[t].tolist())
        assert set(ids[t].tolist()) == holding  # padding repeats one of them, never another
        # Each holding department once with its W_j; a repeat carries weight 0.
        seen = {}
        for w, d in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            if d in seen:
                assert w == 0.0
            else:
                seen[d] = w
        expected = {d: float(routing.weights[t][routing.department_ids[t] == d].sum()) for d in holding}
        assert seen == pytest.approx(expected)


def test_kept_department_without_an_expert_gets_no_slot():
    config = CONFIGS["sigmoid bias g3 k2"]  # 3 departments kept, at most 2 of them hold the 2 experts
    layer = DeaMoELayer.random(config, seed=8)
    routing = layer.route(torch.randn(32, 32, generator=torch.Generator().manual_seed(9)))
    _, ids = department_slots(routing, config)
    empty_kept = 0
    for t in range(32):
        for d in routing.kept_departments[t].tolist():
            if d not in routing.department_ids[t].tolist():
                empty_kept += 1
                assert d not in ids[t].tolist()
    assert empty_kept >= 32  # every token keeps one department that receives no expert
