"""The CPU kernel on gpt-oss-style layers (biases on every part, the clamped SwiGLU, a router
logit bias), float and int4/int8, against the PyTorch reference and the spec's math."""

import copy

import numpy as np
import pytest
import torch

from configs import GPT_OSS_STYLE, gpt_oss_style
from deamoe_trt import DeaMoELayer, MissingDependencyError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig
from deamoe_trt.routing import router_logits
from spec_reference import spec_dequantized_tensors, spec_forward

try:
    from deamoe_trt import cpu

    cpu.load()
except MissingDependencyError as exc:  # no compiler or not x86-64 Linux: nothing to test
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("one_thread")

# Widths that are not multiples of the kernel's neuron group (padding neurons must stay 0
# through their biases) and a hidden size that is not a multiple of its row padding.
UNALIGNED = gpt_oss_style(
    hidden_size=40, shared_intermediate_size=22, private_intermediate_size=9, shared_expert_intermediate_size=13
)
TOKENS = (1, 4, 16)


def layers(config) -> dict[str, DeaMoELayer]:
    layer = DeaMoELayer.random(config, seed=3)
    return {"deamoe": layer, "expanded": layer.expanded(), "vanilla": layer.vanilla()}


@pytest.mark.parametrize("config", [GPT_OSS_STYLE, UNALIGNED], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("twin", ["deamoe", "expanded", "vanilla"])
@torch.no_grad()
def test_float_layer_and_twins_match_reference(config, twin):
    layer = layers(config)[twin]
    fast = cpu.CpuDeaMoE(layer)
    for tokens in TOKENS:
        x = random_hidden(tokens, config.hidden_size, seed=tokens)
        torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_clamped_biased_layer_computes_the_spec_math():
    layer = layers(GPT_OSS_STYLE)["deamoe"]
    x = random_hidden(16, GPT_OSS_STYLE.hidden_size, seed=5)
    tensors = {k: v.numpy() for k, v in layer.state_dict().items()}
    np.testing.assert_allclose(cpu.CpuDeaMoE(layer)(x).numpy(), spec_forward(x.numpy(), tensors, GPT_OSS_STYLE),
                               rtol=1e-4, atol=1e-5)  # fmt: skip


@torch.no_grad()
def test_logits_include_the_logit_bias_and_route_as_the_reference():
    layer = layers(GPT_OSS_STYLE)["deamoe"]
    fast = cpu.CpuDeaMoE(layer)
    x = random_hidden(16, GPT_OSS_STYLE.hidden_size, seed=6)
    want = router_logits(x, layer.router.weight, layer.router.logit_bias)
    torch.testing.assert_close(fast.logits(x), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(fast.route(x).expert_ids, layer.route(x).expert_ids)


@torch.no_grad()
def test_fp16_biased_layer_matches_reference():
    layer = copy.deepcopy(layers(GPT_OSS_STYLE)["deamoe"]).half()
    fast = cpu.CpuDeaMoE(layer)
    for tokens in TOKENS:
        x = random_hidden(tokens, GPT_OSS_STYLE.hidden_size, seed=tokens).half()
        torch.testing.assert_close(fast(x).float(), layer(x).float(), rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("twin", ["deamoe", "vanilla"])
@torch.no_grad()
def test_quantized_layer_keeps_float_biases_and_matches_dequantized_reference(bits, twin):
    layer = layers(GPT_OSS_STYLE)[twin].quantized(QuantConfig(bits, 16))
    fast = cpu.CpuDeaMoE(layer)
    tensors = spec_dequantized_tensors(layer.state_dict(), bits, 16)
    for tokens in TOKENS:
        x = random_hidden(tokens, GPT_OSS_STYLE.hidden_size, seed=tokens)
        torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast(x).numpy(), spec_forward(x.numpy(), tensors, layer.config), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("quant", [None, QuantConfig(4, 16)], ids=["float", "int4"])
@torch.no_grad()
def test_down_biases_are_added_once_whatever_the_thread_count(quant):
    """Three threads cut a step into 6 slices, more than a block's 4 neuron groups: some
    slices get no group of a block, and exactly one adds its down bias."""
    layer = layers(GPT_OSS_STYLE)["deamoe"]
    layer = layer if quant is None else layer.quantized(quant)
    x = random_hidden(4, GPT_OSS_STYLE.hidden_size, seed=7)
    one, two, three = (cpu.CpuDeaMoE(layer, threads=n)(x) for n in (1, 2, 3))
    assert torch.equal(one, two)
    torch.testing.assert_close(three, layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", cpu.INT4_MODES)
@torch.no_grad()
def test_int4_biased_layer_in_both_code_modes(mode):
    """kSubnormal keeps partial outputs in 2^-53 units: the down biases must be added in them."""
    layer = layers(GPT_OSS_STYLE)["deamoe"].quantized(QuantConfig(4, 16))
    default = cpu.int4_mode()
    try:
        cpu.int4_mode(mode)
        x = random_hidden(4, GPT_OSS_STYLE.hidden_size, seed=8)
        torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), layer(x), rtol=1e-5, atol=1e-5)
    finally:
        cpu.int4_mode(default)
