"""Weight-only quantization (deamoe_trt.quant) and quantized layers against the spec's math."""

import numpy as np
import pytest
import torch

from configs import DEEPSEEK_STYLE_GROUPED, QWEN2_STYLE_GROUPED
from deamoe_trt import PRESETS, DeaMoELayer, DeaMoEStack, UsageError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig, dequantize, pack, quantize_rtn, unpack
from spec_reference import spec_dequantize, spec_dequantized_tensors, spec_forward

CONFIGS = {"tiny": PRESETS["tiny"], "deepseek-style": DEEPSEEK_STYLE_GROUPED, "qwen2-style": QWEN2_STYLE_GROUPED}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [16, 32])
def test_dequantize_is_the_spec_formula_on_qmoe_packing(bits, group_size):
    gen = torch.Generator().manual_seed(bits + group_size)
    codes = torch.randint(0, 2**bits, (5, 64), generator=gen, dtype=torch.uint8)
    qweight = pack(codes, bits)
    scales = torch.rand(5, 64 // group_size, generator=gen) + 0.1
    assert qweight.shape == (5, 64 * bits // 8)
    assert torch.equal(unpack(qweight, bits), codes)
    want = spec_dequantize(qweight.numpy(), scales.numpy(), bits, group_size)
    np.testing.assert_allclose(dequantize(qweight, scales, bits, group_size).numpy(), want, rtol=1e-7)


@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest_error_is_at_most_half_a_step(bits):
    weight = torch.randn(3, 8, 128, generator=torch.Generator().manual_seed(0))
    config = QuantConfig(bits, 32)
    qweight, scales = quantize_rtn(weight, config)
    assert qweight.dtype == torch.uint8 and scales.shape == (3, 8, 4)
    error = (dequantize(qweight, scales, bits, 32) - weight).abs().view(3, 8, 4, 32)
    assert bool((error <= scales.unsqueeze(-1) / 2 * (1 + 1e-6)).all())
    # The largest |w| of each group is representable exactly: its code is +-qmax.
    codes = unpack(qweight, bits).view(3, 8, 4, 32).int() - 2 ** (bits - 1)
    assert int(codes.abs().amax(-1).min()) == 2 ** (bits - 1) - 1


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("bits", [4, 8])
@torch.no_grad()
def test_quantized_layer_is_the_spec_on_dequantized_weights(name, bits):
    config = CONFIGS[name]
    layer = DeaMoELayer.random(config, seed=1).quantized(QuantConfig(bits, 16))
    tensors = spec_dequantized_tensors(layer.state_dict(), bits, 16)
    x = random_hidden(3, config.hidden_size, seed=2)
    np.testing.assert_allclose(layer(x).numpy(), spec_forward(x.numpy(), tensors, config), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits", [4, 8])
@torch.no_grad()
def test_quantization_keeps_the_router_and_the_expert_sets(bits):
    layer = DeaMoELayer.random(DEEPSEEK_STYLE_GROUPED, seed=0)
    quantized = layer.quantized(QuantConfig(bits, 32))
    assert torch.equal(quantized.router.weight, layer.router.weight)
    assert torch.equal(quantized.router.bias, layer.router.bias)
    x = random_hidden(32, 64, seed=0)
    assert torch.equal(quantized.route(x).expert_ids, layer.route(x).expert_ids)
    y, yq = layer(x), quantized(x)
    relative = float((yq - y).norm() / y.norm())
    assert relative < (0.2 if bits == 4 else 0.01)  # int4 RTN on Gaussian weights: ~15%


@pytest.mark.parametrize("bits", [4, 8])
def test_expanded_twin_of_a_quantized_layer_has_the_same_outputs(bits):
    layer = DeaMoELayer.random(DEEPSEEK_STYLE_GROUPED, seed=0).quantized(QuantConfig(bits, 16))
    twin = layer.expanded()
    assert twin.quant == layer.quant and twin.departments is None
    x = random_hidden(6, 64, seed=1)
    torch.testing.assert_close(twin(x), layer(x), rtol=1e-5, atol=1e-6)
    assert layer.vanilla().quant == layer.quant


def test_checkpoint_round_trip_keeps_codes_and_scales(tmp_path):
    stack = DeaMoEStack.random(DEEPSEEK_STYLE_GROUPED, 2, seed=0).quantized(QuantConfig(4, 32))
    stack.save_pretrained(tmp_path / "q")
    loaded = DeaMoEStack.from_pretrained(tmp_path / "q")
    assert loaded.quant == QuantConfig(4, 32)
    for a, b in zip(stack.layers, loaded.layers, strict=True):
        for (name, t), (name2, u) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert name == name2 and t.dtype == u.dtype and torch.equal(t, u)


def test_fp16_scales_dequantize_to_fp16():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0, dtype=torch.float16).quantized(QuantConfig(8, 16))
    assert layer.experts.gate_up.scales.dtype == torch.float16
    assert layer.experts.gate_up[0].dtype == torch.float16
    x = random_hidden(3, 64, seed=0, dtype=torch.float16)
    assert layer(x).dtype == torch.float16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bits": 3, "group_size": 32}, "unsupported bits 3"),
        ({"bits": 4, "group_size": 48}, "unsupported group size 48"),
        ({"bits": 4, "group_size": 32, "method": "gptq"}, "unsupported quantization method 'gptq'"),
    ],
)
def test_bad_quantization_settings_are_one_line(kwargs, message):
    with pytest.raises(UsageError, match=message):
        QuantConfig(**kwargs)


def test_widths_not_divisible_by_the_group_size_are_refused():
    with pytest.raises(UsageError, match=r"private part \(f_p\) is 16, not divisible by the group size 32"):
        DeaMoELayer.random(PRESETS["tiny"]).quantized(QuantConfig(4, 32))


def test_quantizing_twice_is_refused():
    layer = DeaMoELayer.random(PRESETS["tiny"]).quantized(QuantConfig(4, 16))
    with pytest.raises(UsageError, match="already quantized"):
        layer.quantized(QuantConfig(8, 16))
