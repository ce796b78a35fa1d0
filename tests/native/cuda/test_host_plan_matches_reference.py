"""The kernels' plan step (deamoePlan.cuh, compiled for the host): the distinct departments
and experts a tile uses are torch.unique over the reference routing, each with exactly
the tokens that use it and their weights (W_j for departments, w_e for experts)."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.presets import PRESETS
from deamoe_trt.routing import Routing, route_logits
from native.cuda.host_bindings import max_tile_tokens, plan


def reference_routing(c: DeaMoEConfig, num_tokens: int, seed: int) -> Routing:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, c.num_experts, generator=gen)
    bias = 0.05 * torch.randn(c.num_experts, generator=gen) if c.router_bias else None
    return route_logits(logits, bias, c)


def check_plan(lib, c: DeaMoEConfig, r: Routing) -> None:
    p = plan(lib, c, r.expert_ids.numpy(), r.weights.numpy(), r.kept_departments.numpy())
    assert p is not None
    num_tokens = r.num_tokens

    # Distinct parts, ascending: exactly what the spec's U_d and U_e count.
    assert p.experts == r.used_experts().tolist()
    assert p.departments == r.used_departments().tolist()

    for e, entries in zip(p.experts, p.expert_entries, strict=True):
        tokens, slots = (r.expert_ids == e).nonzero(as_tuple=True)
        assert [t for t, _, _ in entries] == tokens.tolist()  # ascending tokens
        assert [s for _, s, _ in entries] == slots.tolist()  # the token's slot for e
        assert [w for _, _, w in entries] == r.weights[tokens, slots].tolist()  # w_e, exactly

    department_weights = r.department_weights(c.num_departments)
    for j, entries in zip(p.departments, p.department_entries, strict=True):
        tokens = (r.department_ids == j).any(dim=-1).nonzero().squeeze(-1)
        assert [t for t, _, _ in entries] == tokens.tolist()
        torch.testing.assert_close(
            torch.tensor([w for _, _, w in entries]), department_weights[tokens, j], rtol=1e-6, atol=0
        )

    # Department slots: the token's departments holding experts, in stage-1 order.
    for t in range(num_tokens):
        holding = [j for j in r.kept_departments[t].tolist() if j in r.department_ids[t].tolist()]
        assert p.department_slots[t] == len(holding)
        for j, entries in zip(p.departments, p.department_entries, strict=True):
            for token, slot, _ in entries:
                if token == t:
                    assert holding[slot] == j


CONFIGS = {
    "tiny": PRESETS["tiny"],
    "qwen3-30b-a3b-layer": PRESETS["qwen3-30b-a3b-layer"],
    "deepseek-v3-layer": PRESETS["deepseek-v3-layer"],
    "vanilla": PRESETS["qwen3-30b-a3b-layer"].vanilla(),
    "k-below-g": DeaMoEConfig(
        hidden_size=8,
        num_departments=5,
        experts_per_department=4,
        shared_intermediate_size=8,
        private_intermediate_size=8,
        top_k=2,
        top_departments=4,
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("num_tokens", [1, 2, 7, 16])
def test_plan_lists_every_used_part_once_with_its_tokens(host_lib, name, num_tokens):
    c = CONFIGS[name]
    for seed in range(3):
        check_plan(host_lib, c, reference_routing(c, num_tokens, seed))


def test_kept_department_without_experts_is_not_in_the_plan(host_lib):
    c = DeaMoEConfig(
        hidden_size=8,
        num_departments=3,
        experts_per_department=3,
        shared_intermediate_size=8,
        private_intermediate_size=8,
        top_k=2,
        top_departments=2,
    )
    logits = torch.tensor([[2.5, -5.0, -5.0, 3.0, 2.9, -5.0, -1.0, -1.0, -1.0]])
    r = route_logits(logits, None, c)
    assert r.kept_departments.tolist() == [[1, 0]] and r.department_ids.tolist() == [[1, 1]]
    p = plan(host_lib, c, r.expert_ids.numpy(), r.weights.numpy(), r.kept_departments.numpy())
    assert p.departments == [1]  # department 0 was kept in stage 1 but is not loaded
    assert p.department_slots == [1]
    check_plan(host_lib, c, r)


def test_shared_experts_make_every_token_share_each_part_row(host_lib):
    # All tokens route alike: one plan entry list per part holding every token.
    c = PRESETS["tiny"]
    logits = torch.randn(1, c.num_experts).repeat(16, 1)
    r = route_logits(logits, None, c)
    p = plan(host_lib, c, r.expert_ids.numpy(), r.weights.numpy(), r.kept_departments.numpy())
    assert len(p.experts) == c.top_k
    assert all([t for t, _, _ in entries] == list(range(16)) for entries in p.expert_entries)
    check_plan(host_lib, c, r)


def test_plan_rejects_more_tokens_than_a_tile(host_lib):
    c = PRESETS["tiny"]
    r = reference_routing(c, max_tile_tokens(host_lib) + 1, 0)
    assert plan(host_lib, c, r.expert_ids.numpy(), r.weights.numpy(), r.kept_departments.numpy()) is None
