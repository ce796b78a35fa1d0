"""The kernels' routing logic (deamoeRouting.cuh, compiled for the host) makes exactly the
decisions of deamoe_trt.routing.route_logits: same experts in the same order, same kept
departments, ties to the lower index; weights equal to float32 rounding."""

from __future__ import annotations

import itertools

import pytest
import torch

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.presets import PRESETS
from deamoe_trt.routing import route, route_logits
from native.cuda.host_bindings import route as host_route
from native.cuda.host_bindings import route_logits as host_route_logits

BASE = dict(hidden_size=16, shared_intermediate_size=8, private_intermediate_size=8)


def config(**overrides) -> DeaMoEConfig:
    fields = dict(BASE, num_departments=6, experts_per_department=5, top_k=4, top_departments=3)
    fields.update(overrides)
    return DeaMoEConfig(**fields)


def assert_same_routing(host, ref) -> None:
    assert torch.equal(host.kept_departments, ref.kept_departments)
    assert torch.equal(host.expert_ids, ref.expert_ids)
    assert torch.equal(host.department_ids, ref.department_ids)
    torch.testing.assert_close(host.weights, ref.weights, rtol=2e-6, atol=1e-7)


def random_bias(c: DeaMoEConfig, seed: int) -> torch.Tensor | None:
    if not c.router_bias:
        return None
    return 0.05 * torch.randn(c.num_experts, generator=torch.Generator().manual_seed(seed + 1000))


MODES = list(itertools.product(["softmax", "sigmoid"], ["max", "sum_top2", "sum"], [False, True], [False, True]))


@pytest.mark.parametrize(("score_func", "department_score", "bias", "norm"), MODES)
def test_random_logits_route_like_reference(host_lib, score_func, department_score, bias, norm):
    c = config(
        score_func=score_func,
        department_score=department_score,
        router_bias=bias,
        norm_topk_prob=norm,
        routed_scaling_factor=1.5,
    )
    logits = 2.0 * torch.randn(200, c.num_experts, generator=torch.Generator().manual_seed(7))
    b = random_bias(c, 7)
    assert_same_routing(host_route_logits(host_lib, c, logits, b), route_logits(logits, b, c))


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_departments=1, experts_per_department=16, top_k=3, top_departments=1),  # vanilla top-k
        dict(num_departments=8, experts_per_department=1, top_k=3, top_departments=5),  # m = 1
        dict(num_departments=4, experts_per_department=3, top_k=12, top_departments=4),  # k = g*m = N
        dict(num_departments=40, experts_per_department=2, top_k=5, top_departments=33),  # D > warp width
        dict(num_departments=2, experts_per_department=70, top_k=9, top_departments=1),  # m > warp width
    ],
)
def test_edge_shapes_route_like_reference(host_lib, shape):
    c = config(**shape)
    logits = torch.randn(64, c.num_experts, generator=torch.Generator().manual_seed(3))
    assert_same_routing(host_route_logits(host_lib, c, logits, None), route_logits(logits, None, c))


@pytest.mark.parametrize("department_score", ["max", "sum_top2", "sum"])
@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_ties_go_to_the_lower_index(host_lib, score_func, department_score):
    c = config(score_func=score_func, department_score=department_score, router_bias=True)
    gen = torch.Generator().manual_seed(11)
    m = c.experts_per_department
    batches = []
    # Every expert equal: the lowest departments, then their lowest experts.
    batches.append(torch.zeros(3, c.num_experts))
    # Duplicated experts inside and across departments.
    dup = torch.randn(40, c.num_experts, generator=gen)
    dup[:, 1] = dup[:, 0]
    dup[:, 2 * m + 3] = dup[:, 0]
    dup[:, 4 * m] = dup[:, m + 1]
    batches.append(dup)
    # Duplicated departments (same values in the same order): equal department scores.
    depts = torch.randn(40, c.num_experts, generator=gen)
    depts[:, 3 * m : 4 * m] = depts[:, 1 * m : 2 * m]
    depts[:, 5 * m : 6 * m] = depts[:, 1 * m : 2 * m]
    batches.append(depts)
    # Few distinct values: ties everywhere. Not for `sum`: there two departments holding the
    # same values in different orders have sums that differ in the last bit depending on
    # the summation order (PyTorch's is unspecified; the kernels sum in expert order), so
    # they are not float ties. Identical sequences (above) are, and do tie exactly.
    if department_score != "sum":
        batches.append(torch.randint(0, 3, (40, c.num_experts), generator=gen).float())
    # A bias that ties exactly as the scores do (pairs of experts share one bias value).
    bias = 0.01 * torch.arange(c.num_experts).div(2, rounding_mode="floor").float()
    for logits in batches:
        for b in (torch.zeros(c.num_experts), bias):
            assert_same_routing(host_route_logits(host_lib, c, logits, b), route_logits(logits, b, c))


def test_all_equal_scores_pick_the_lowest_experts(host_lib):
    c = config(top_k=4, top_departments=3, department_score="sum")
    host = host_route_logits(host_lib, c, torch.zeros(1, c.num_experts), None)
    assert host.kept_departments.tolist() == [[0, 1, 2]]
    assert host.expert_ids.tolist() == [[0, 1, 2, 3]]


def test_deepseek_v3_layer_routes_like_reference(host_lib):
    c = PRESETS["deepseek-v3-layer"]
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(128, c.num_experts, generator=gen)
    bias = 0.02 * torch.randn(c.num_experts, generator=gen)
    host = host_route_logits(host_lib, c, logits, bias)
    assert_same_routing(host, route_logits(logits, bias, c))
    # routed_scaling_factor 2.5 on normalised weights: each row sums to 2.5.
    torch.testing.assert_close(host.weights.sum(-1), torch.full((128,), 2.5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("department_score", ["max", "sum_top2", "sum"])
def test_department_kept_in_stage_one_can_receive_no_expert(host_lib, department_score):
    # Department 1 scores best and also holds the two best experts; department 0 is kept
    # second in stage 1 but receives no expert in stage 2.
    c = config(
        num_departments=3, experts_per_department=3, top_k=2, top_departments=2, department_score=department_score
    )
    logits = torch.tensor([[2.5, -5.0, -5.0, 3.0, 2.9, -5.0, -1.0, -1.0, -1.0]])
    ref = route_logits(logits, None, c)
    assert ref.kept_departments.tolist() == [[1, 0]]
    assert ref.department_ids.tolist() == [[1, 1]]
    assert_same_routing(host_route_logits(host_lib, c, logits, None), ref)


def test_logits_from_hidden_states_match_torch_within_float32_rounding(host_lib):
    c = PRESETS["qwen3-30b-a3b-layer"].replace(hidden_size=256)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(32, c.hidden_size, generator=gen)
    weight = torch.randn(c.num_experts, c.hidden_size, generator=gen) / c.hidden_size**0.5
    host = host_route(host_lib, c, x, weight, None)
    ref_logits = x @ weight.t()
    torch.testing.assert_close(host.logits, ref_logits, rtol=1e-5, atol=1e-5)
    # Decisions from those logits are the reference's decisions (no near-ties in this data).
    assert_same_routing(host, route(x, weight, None, c))
