import copy

import numpy as np
import pytest
import torch

from configs import GPT_OSS_STYLE, QWEN2_STYLE_GATED_SHARED, TINY_SHARED_ONLY, deepseek_style
from deamoe_trt import PRESETS, DeaMoELayer, DeaMoEStack, UsageError
from deamoe_trt.inputs import random_hidden
from spec_reference import spec_forward

CONFIGS = {
    "tiny": PRESETS["tiny"],
    "deepseek-style": deepseek_style(
        shared_intermediate_size=24, private_intermediate_size=8, shared_expert_intermediate_size=16
    ),
    "qwen2-style-gated-shared": QWEN2_STYLE_GATED_SHARED,
    "shared-only": TINY_SHARED_ONLY,
    "gpt-oss-style": GPT_OSS_STYLE,
    "gpt-oss-style-vanilla": GPT_OSS_STYLE.vanilla(),
}


def canonical(layer):
    return {name: t.detach().double().numpy() for name, t in layer.state_dict().items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_spec_math(name):
    layer = DeaMoELayer.random(CONFIGS[name], seed=3)
    x = random_hidden(9, layer.config.hidden_size, seed=3)
    with torch.no_grad():
        y = layer(x)
    expected = spec_forward(x.numpy(), canonical(layer), layer.config)
    np.testing.assert_allclose(y.double().numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_state_dict_holds_the_canonical_tensors():
    c = CONFIGS["deepseek-style"].replace(shared_expert_gate=True)
    shapes = {name: list(t.shape) for name, t in DeaMoELayer(c).state_dict().items()}
    d, D, N, fs, fp, fsh = 32, 4, 16, 24, 8, 16
    assert shapes == {
        "router.weight": [N, d],
        "router.bias": [N],
        "departments.gate_up": [D, 2 * fs, d],
        "departments.down": [D, d, fs],
        "experts.gate_up": [N, 2 * fp, d],
        "experts.down": [N, d, fp],
        "shared_experts.gate_up": [2 * fsh, d],
        "shared_experts.down": [d, fsh],
        "shared_experts.gate": [1, d],
    }


def test_parts_of_width_zero_are_absent():
    names = set(DeaMoELayer(CONFIGS["qwen2-style-gated-shared"]).state_dict())
    assert not any(n.startswith("departments.") for n in names)
    assert "router.bias" not in names


@pytest.mark.parametrize("name", list(CONFIGS))
def test_expanded_twin_gives_the_same_outputs_without_sharing(name):
    layer = DeaMoELayer.random(CONFIGS[name], seed=4)
    twin = layer.expanded()
    assert twin.config.shared_intermediate_size == 0
    assert twin.config.private_intermediate_size == layer.config.expert_intermediate_size
    x = random_hidden(17, layer.config.hidden_size, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), layer(x), rtol=1e-5, atol=1e-5)
        assert torch.equal(twin.route(x).expert_ids, layer.route(x).expert_ids)


def test_vanilla_twin_routes_in_one_stage_over_all_experts():
    layer = DeaMoELayer.random(CONFIGS["tiny"], seed=5)
    vanilla = layer.vanilla()
    x = random_hidden(32, 64, seed=5)
    scores = torch.softmax(x @ layer.router.weight.t(), dim=-1)
    expected = scores.topk(4, dim=-1).indices.sort(dim=-1).values
    assert torch.equal(vanilla.route(x).expert_ids.sort(dim=-1).values, expected)
    expected_y = spec_forward(x.numpy(), canonical(vanilla), vanilla.config)
    np.testing.assert_allclose(vanilla(x).detach().double().numpy(), expected_y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_forward_stays_close_to_fp32(dtype):
    layer = DeaMoELayer.random(CONFIGS["tiny"], seed=6)
    x = random_hidden(8, 64, seed=6)
    with torch.no_grad():
        reference = layer(x)
        half = layer.to(dtype)
        y = half(x.to(dtype))
    assert y.dtype == dtype
    scale = reference.abs().max()
    assert (y.float() - reference).abs().max() <= (0.02 if dtype == torch.bfloat16 else 0.005) * scale


def test_forward_keeps_leading_dimensions():
    layer = DeaMoELayer.random(CONFIGS["tiny"], seed=7)
    x = random_hidden(6, 64, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(layer(x.reshape(2, 3, 64)).reshape(6, 64), layer(x))


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.zeros(3, 63), r"\[\.\.\., 64\]"),
        (torch.zeros(3, 64, dtype=torch.float64), "float32, float16 or bfloat16"),
        (torch.full((3, 64), float("nan")), "NaN"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_error(x, message):
    layer = DeaMoELayer.random(CONFIGS["tiny"])
    with pytest.raises(UsageError, match=message):
        layer(x)


def test_random_init_spreads_routing_over_experts():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    routing = layer.route(random_hidden(256, 64, seed=0))
    counts = torch.bincount(routing.expert_ids.flatten(), minlength=16)
    assert (counts > 0).all()
    assert routing.weights[:, 0].mean() < 0.9  # no token is sent to a single expert alone


@pytest.mark.slow
def test_stack_applies_layers_with_residuals():
    stack = DeaMoEStack.random(CONFIGS["tiny"], 2, seed=8)
    x = random_hidden(5, 64, seed=8)
    with torch.no_grad():
        h = x + stack.layers[0](x)
        torch.testing.assert_close(stack(x), h + stack.layers[1](h))
        torch.testing.assert_close(stack.expanded()(x), stack(x), rtol=1e-5, atol=1e-5)


def test_router_keeps_its_precision_through_dtype_conversions():
    """Spec "Router precision": router.bias always float32, a float32 router weight stays
    float32 and bit-exact when the layer is converted; any other weight follows the layer."""
    small = dict(hidden_size=16, shared_intermediate_size=8, private_intermediate_size=8)
    layer = DeaMoELayer.random(PRESETS["deepseek-v3-layer"].replace(**small, shared_expert_intermediate_size=8), seed=1)
    weight, bias = layer.router.weight.detach().clone(), layer.router.bias.detach().clone()
    for dtype in (torch.float16, torch.bfloat16):
        half = copy.deepcopy(layer).to(dtype)
        assert half.dtype == dtype and half.router_dtype == torch.float32
        assert torch.equal(half.router.weight, weight) and torch.equal(half.router.bias, bias)
        narrow = DeaMoELayer.random(layer.config, seed=1, dtype=dtype)
        assert narrow.router_dtype == dtype and narrow.router.bias.dtype == torch.float32
        assert narrow.float().router_dtype == torch.float32  # widening follows the layer


def test_low_memory_random_draws_the_same_distribution_in_dtype():
    config = CONFIGS["deepseek-style"]  # departments, experts, bias and shared experts
    direct = DeaMoELayer.random(config, seed=5, dtype=torch.bfloat16, low_memory=True)
    converted = DeaMoELayer.random(config, seed=5, dtype=torch.bfloat16)
    assert direct.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(direct.state_dict().items(), converted.state_dict().items(), strict=True):
        assert a.shape == b.shape, name
        assert float(a.float().std()) == pytest.approx(float(b.float().std()), rel=0.1), name


def test_biased_clamped_layer_holds_the_spec_tensors_in_their_dtypes():
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=1, dtype=torch.bfloat16)
    shapes = {name: (list(t.shape), t.dtype) for name, t in layer.state_dict().items()}
    d, D, N, fs, fp, fsh = 32, 4, 16, 16, 16, 16
    bf16, f32 = torch.bfloat16, torch.float32
    assert shapes == {
        "router.weight": ([N, d], bf16),
        "router.logit_bias": ([N], f32),
        "departments.gate_up": ([D, 2 * fs, d], bf16),
        "departments.down": ([D, d, fs], bf16),
        "departments.gate_up_bias": ([D, 2 * fs], bf16),
        "experts.gate_up": ([N, 2 * fp, d], bf16),
        "experts.down": ([N, d, fp], bf16),
        "experts.gate_up_bias": ([N, 2 * fp], bf16),
        "experts.down_bias": ([N, d], bf16),
        "shared_experts.gate_up": ([2 * fsh, d], bf16),
        "shared_experts.down": ([d, fsh], bf16),
        "shared_experts.gate_up_bias": ([2 * fsh], bf16),
        "shared_experts.down_bias": ([d], bf16),
    }


def test_clamp_limit_is_reached_by_the_test_layers_inputs():
    """Guards the other tests: with limit 1.0 the clamp changes many pre-activations, so a
    backend that ignores it fails them."""
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=3)
    x = random_hidden(9, GPT_OSS_STYLE.hidden_size, seed=3)
    pre = torch.nn.functional.linear(x, layer.experts.gate_up[0], layer.experts.gate_up_bias[0])
    assert (pre.abs() > GPT_OSS_STYLE.swiglu_limit).float().mean() > 0.2


def test_logit_bias_changes_both_choice_and_weights():
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=5)
    x = random_hidden(16, GPT_OSS_STYLE.hidden_size, seed=5)
    with torch.no_grad():
        biased = layer.route(x)
        layer.router.logit_bias.zero_()
        plain = layer.route(x)
    assert not torch.equal(biased.expert_ids, plain.expert_ids)
    assert not torch.allclose(biased.weights, plain.weights)


def test_quantizing_keeps_biases_and_logit_bias_exact():
    from deamoe_trt.quant import QuantConfig

    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=2)
    q = layer.quantized(QuantConfig(bits=4, group_size=16))
    before, after = layer.state_dict(), q.state_dict()
    for name in before:
        if name.endswith("bias"):
            assert torch.equal(before[name], after[name]), name
