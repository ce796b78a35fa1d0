import pytest
import torch

from configs import deepseek_style
from deamoe_trt import PRESETS, DeaMoEConfig, route_logits
from deamoe_trt.routing import top_indices
from spec_reference import spec_route

CONFIGS = {
    "tiny": PRESETS["tiny"],
    "deepseek-style": deepseek_style(
        shared_intermediate_size=8, private_intermediate_size=8, shared_expert_intermediate_size=0
    ),
    "sum-no-norm": DeaMoEConfig(
        hidden_size=16,
        num_departments=3,
        experts_per_department=5,
        shared_intermediate_size=0,
        private_intermediate_size=8,
        top_k=3,
        top_departments=2,
        department_score="sum",
        norm_topk_prob=False,
    ),
    "vanilla": PRESETS["tiny"].vanilla(),
}


def assert_matches_spec(logits, bias, config):
    routing = route_logits(logits, bias, config)
    for t in range(logits.shape[0]):
        departments, experts, weights = spec_route(logits[t].tolist(), None if bias is None else bias.tolist(), config)
        assert routing.kept_departments[t].tolist() == departments
        assert routing.expert_ids[t].tolist() == experts
        torch.testing.assert_close(routing.weights[t].double(), torch.tensor(weights, dtype=torch.float64))
        assert routing.department_ids[t].tolist() == [e // config.experts_per_department for e in experts]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_routing_matches_spec_on_random_logits(name):
    config = CONFIGS[name]
    gen = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(64, config.num_experts, generator=gen)
    bias = 0.1 * torch.randn(config.num_experts, generator=gen) if config.router_bias else None
    assert_matches_spec(logits, bias, config)


@pytest.mark.parametrize("name", ["tiny", "deepseek-style", "sum-no-norm"])
def test_ties_go_to_the_lower_index(name):
    config = CONFIGS[name]
    gen = torch.Generator().manual_seed(2)
    # Each department copies one of two value patterns, so equal departments are equal in
    # any precision and summation order; values repeat inside patterns, so experts tie too.
    patterns = torch.randint(0, 3, (2, config.experts_per_department), generator=gen).float()
    choice = torch.randint(0, 2, (64, config.num_departments), generator=gen)
    logits = patterns[choice].reshape(64, config.num_experts)
    bias = torch.zeros(config.num_experts) if config.router_bias else None
    assert_matches_spec(logits, bias, config)
    all_equal = route_logits(torch.zeros(2, config.num_experts), bias, config)
    assert all_equal.expert_ids[0].tolist() == list(range(config.top_k))
    assert all_equal.kept_departments[0].tolist() == list(range(config.top_departments))


def test_bias_chooses_experts_but_does_not_weigh_them():
    config = CONFIGS["deepseek-style"]
    logits = torch.zeros(1, config.num_experts)
    bias = torch.zeros(config.num_experts)
    bias[13] = 1.0  # department 3, expert 13 now wins selection
    routing = route_logits(logits, bias, config)
    assert 13 in routing.expert_ids[0].tolist()
    assert 3 in routing.kept_departments[0].tolist()
    # All sigmoid scores are 0.5, so normalised weights stay equal despite the bias.
    torch.testing.assert_close(routing.weights[0], torch.full((4,), 2.5 / 4))


def test_department_kept_in_stage_one_without_experts_is_not_used():
    config = DeaMoEConfig(
        hidden_size=8,
        num_departments=3,
        experts_per_department=2,
        shared_intermediate_size=4,
        private_intermediate_size=4,
        top_k=2,
        top_departments=2,
        department_score="sum",
    )
    # Department 0 = {0, 1}: sum wins, both experts strong; department 1 = {2, 3}: second by sum
    # but its experts lose to both of department 0's.
    logits = torch.tensor([[3.0, 3.0, 2.5, 2.5, -5.0, -5.0]])
    routing = route_logits(logits, None, config)
    assert routing.kept_departments[0].tolist() == [0, 1]
    assert routing.expert_ids[0].tolist() == [0, 1]
    assert routing.used_departments().tolist() == [0]
    weights = routing.department_weights(3)
    torch.testing.assert_close(weights[0, 1], torch.tensor(0.0))
    torch.testing.assert_close(weights[0, 0], torch.tensor(1.0))


def test_weights_are_normalised_then_scaled():
    config = CONFIGS["deepseek-style"]
    routing = route_logits(torch.randn(8, config.num_experts), torch.zeros(config.num_experts), config)
    torch.testing.assert_close(routing.weights.sum(-1), torch.full((8,), 2.5))


def test_logits_of_the_wrong_width_are_rejected():
    with pytest.raises(ValueError, match="16"):
        route_logits(torch.zeros(2, 15), None, PRESETS["tiny"])


def test_top_indices_is_stable_for_equal_values():
    values = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0]])
    assert top_indices(values, 4).tolist() == [[1, 2, 4, 0]]
