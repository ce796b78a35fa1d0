import pytest
import torch

from configs import GPT_OSS_STYLE, deepseek_style
from deamoe_trt import PRESETS, DeaMoELayer, route_logits, weights_loaded
from deamoe_trt.inputs import random_hidden
from deamoe_trt.routing import router_logits
from deamoe_trt.traffic import compare_traffic, layer_bytes, parameter_count
from spec_reference import spec_bytes, spec_route


@pytest.mark.parametrize("name", ["tiny", "qwen3-30b-a3b-layer", "deepseek-v3-layer"])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_bytes_follow_the_spec_formula(name, tokens):
    config = PRESETS[name]
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, config.num_experts, generator=gen)
    bias = 0.05 * torch.randn(config.num_experts, generator=gen) if config.router_bias else None
    expert_sets = [set(spec_route(row.tolist(), None if bias is None else bias.tolist(), config)[1]) for row in logits]
    for bytes_per_weight, router_bytes in ((2, None), (4, None), (2, 4)):
        routing = route_logits(logits, bias, config)
        traffic = weights_loaded(config, routing, bytes_per_weight, router_bytes_per_weight=router_bytes)
        assert traffic.total == spec_bytes(config, expert_sets, bytes_per_weight, router_bytes)


def test_qwen3_preset_loads_at_most_five_eighths_of_its_twin_per_token():
    config = PRESETS["qwen3-30b-a3b-layer"]
    logits = torch.randn(64, config.num_experts, generator=torch.Generator().manual_seed(0))
    for row in logits:
        traffic = compare_traffic(config, row[None], None, 4)
        routed = traffic["deamoe"].total - traffic["deamoe"].router_bytes
        twin_routed = traffic["expanded"].total - traffic["expanded"].router_bytes
        assert routed <= 0.625 * twin_routed


def test_deepseek_preset_loads_half_of_its_twin_per_token_in_the_experts():
    config = PRESETS["deepseek-v3-layer"]
    logits = torch.randn(1, config.num_experts)
    traffic = compare_traffic(config, logits, torch.zeros(config.num_experts), 2)
    fixed = traffic["deamoe"].router_bytes + traffic["deamoe"].shared_expert_bytes
    # 8 experts in <= 2 departments: 2*1536 + 8*512 = 7168 of 8*2048 = 16384 neurons when both
    # departments are used, 1536 + 4096 when one is.
    ratio = (traffic["deamoe"].total - fixed) / (traffic["expanded"].total - fixed)
    assert ratio in (pytest.approx(7168 / 16384), pytest.approx(5632 / 16384))


def test_expanded_and_vanilla_share_the_expert_width():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=1)
    x = random_hidden(1, 64, seed=1)
    traffic = compare_traffic(layer.config, router_logits(x, layer.router.weight), None, 4)
    # One token: both twins read k full-width experts.
    assert traffic["expanded"].total == traffic["vanilla"].total
    assert traffic["expanded"].experts_used == layer.config.top_k


@pytest.mark.parametrize("name", ["tiny", "deepseek-style-gated"])
def test_parameter_count_is_every_canonical_tensor(name):
    config = PRESETS["tiny"] if name == "tiny" else deepseek_style(shared_expert_gate=True)
    layer = DeaMoELayer(config, device="meta")
    assert parameter_count(config) == sum(t.numel() for t in layer.state_dict().values())
    # Every tensor at its stored width: the selection bias stays float32 in a bf16 layer.
    bf16 = DeaMoELayer(config, dtype=torch.bfloat16, device="meta")
    assert layer_bytes(config, torch.bfloat16) == sum(t.numel() * t.element_size() for t in bf16.state_dict().values())


@pytest.mark.parametrize("name", ["tiny", "qwen3-30b-a3b-layer", "deepseek-v3-layer"])
@pytest.mark.parametrize(("bits", "group_size"), [(4, 16), (8, 128)])
def test_quantized_bytes_count_packed_codes_and_scales(name, bits, group_size):
    from deamoe_trt.quant import QuantConfig
    from spec_reference import spec_quantized_bytes

    config = PRESETS[name]
    logits = torch.randn(4, config.num_experts, generator=torch.Generator().manual_seed(1))
    bias = torch.zeros(config.num_experts) if config.router_bias else None
    expert_sets = [set(spec_route(row.tolist(), None if bias is None else bias.tolist(), config)[1]) for row in logits]
    traffic = weights_loaded(config, route_logits(logits, bias, config), 2, QuantConfig(bits, group_size))
    assert traffic.total == spec_quantized_bytes(config, expert_sets, 2, bits, group_size)


@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize("twin", ["deamoe", "expanded", "vanilla"])
def test_bytes_count_the_biases_of_the_parts_a_step_loads(tokens, twin):
    config = {"deamoe": GPT_OSS_STYLE, "expanded": GPT_OSS_STYLE.expanded(), "vanilla": GPT_OSS_STYLE.vanilla()}[twin]
    logits = torch.randn(tokens, config.num_experts, generator=torch.Generator().manual_seed(tokens))
    expert_sets = [set(spec_route(row.tolist(), None, config)[1]) for row in logits]
    routing = route_logits(logits, None, config)
    for bytes_per_weight, router_bytes in ((2, None), (4, None), (2, 4)):
        traffic = weights_loaded(config, routing, bytes_per_weight, router_bytes_per_weight=router_bytes)
        assert traffic.total == spec_bytes(config, expert_sets, bytes_per_weight, router_bytes)


@pytest.mark.parametrize(("bits", "group_size"), [(4, 16), (8, 16)])
def test_quantized_bytes_count_biases_unquantized(bits, group_size):
    from deamoe_trt.quant import QuantConfig
    from spec_reference import spec_quantized_bytes

    config = GPT_OSS_STYLE
    logits = torch.randn(4, config.num_experts, generator=torch.Generator().manual_seed(2))
    expert_sets = [set(spec_route(row.tolist(), None, config)[1]) for row in logits]
    traffic = weights_loaded(config, route_logits(logits, None, config), 2, QuantConfig(bits, group_size))
    assert traffic.total == spec_quantized_bytes(config, expert_sets, 2, bits, group_size)


def test_parameter_count_and_stored_bytes_include_every_bias():
    config = GPT_OSS_STYLE
    layer = DeaMoELayer(config, device="meta")
    assert parameter_count(config) == sum(t.numel() for t in layer.state_dict().values())
    # The logit bias stays float32 in a bf16 layer; the FFN biases follow the layer's dtype.
    bf16 = DeaMoELayer(config, dtype=torch.bfloat16, device="meta")
    assert layer_bytes(config, torch.bfloat16) == sum(t.numel() * t.element_size() for t in bf16.state_dict().values())
