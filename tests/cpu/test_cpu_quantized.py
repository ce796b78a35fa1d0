"""The CPU kernel on int8/int4 layers against the exactly dequantized PyTorch reference."""

import ctypes
import subprocess

import pytest
import torch

from configs import DEEPSEEK_STYLE_GROUPED, QWEN2_STYLE_GROUPED
from deamoe_trt import PRESETS, DeaMoELayer, DeaMoEStack, MissingDependencyError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig

try:
    from deamoe_trt import cpu

    cpu.load()
except MissingDependencyError as exc:  # no compiler or not x86-64 Linux: nothing to test
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

CONFIGS = {"tiny": PRESETS["tiny"], "deepseek-style": DEEPSEEK_STYLE_GROUPED, "qwen2-style": QWEN2_STYLE_GROUPED}
TOKENS = (1, 5)  # one pass, and passes of 2 + 2 + 1 tokens


@pytest.fixture(scope="module", params=[(name, bits) for name in CONFIGS for bits in (4, 8)], ids=str)
def pair(request):
    name, bits = request.param
    layer = DeaMoELayer.random(CONFIGS[name], seed=3).quantized(QuantConfig(bits, 16))
    return layer, cpu.CpuDeaMoE(layer)


@pytest.mark.parametrize("tokens", TOKENS)
@torch.no_grad()
def test_forward_matches_dequantized_reference(pair, tokens):
    layer, fast = pair
    x = random_hidden(tokens, layer.config.hidden_size, seed=tokens)
    torch.testing.assert_close(fast(x), layer(x), rtol=1e-5, atol=1e-5)


def test_deterministic_and_thread_counts_agree(pair):
    layer, fast = pair
    x = random_hidden(5, layer.config.hidden_size, seed=0)
    assert torch.equal(fast(x), fast(x))
    one = cpu.CpuDeaMoE(layer, threads=1)(x)
    torch.testing.assert_close(one, fast(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@torch.no_grad()
def test_group_sizes(group_size):
    config = CONFIGS["deepseek-style"].replace(
        hidden_size=128,
        shared_intermediate_size=128,
        private_intermediate_size=128,
        shared_expert_intermediate_size=128,
    )
    layer = DeaMoELayer.random(config, seed=1).quantized(QuantConfig(4, group_size))
    x = random_hidden(3, 128, seed=1)
    torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), layer(x), rtol=1e-5, atol=1e-5)


def test_holds_packed_bytes_only():
    config = CONFIGS["deepseek-style"]
    layer = DeaMoELayer.random(config, seed=0)
    for bits in (4, 8):
        quantized = layer.quantized(QuantConfig(bits, 16))
        codes = sum(m.qweight.numel() for m in quantized.modules() if hasattr(m, "qweight"))
        scales = sum(m.scales.numel() * 4 for m in quantized.modules() if hasattr(m, "scales"))
        router = config.num_experts * config.hidden_size * 4
        # Each allocation rounds up to 2 MiB pages: compare what the kernel asked for.
        fast = cpu.CpuDeaMoE(quantized)
        asked = sum(
            int(fast.lib.dm_pack_q_bytes(n, w, config.hidden_size, 16, bits)) for n, w in ((4, 32), (16, 32), (1, 64))
        )
        assert asked == codes + scales
        assert fast.quant.bits == bits and router > 0


@torch.no_grad()
def test_fp16_quantized_layer():
    layer = DeaMoELayer.random(CONFIGS["tiny"], seed=2, dtype=torch.float16).quantized(QuantConfig(4, 16))
    x = random_hidden(3, 64, seed=3, dtype=torch.float16)
    # The reference rounds dequantized weights to fp16, the kernel keeps them in fp32.
    torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), layer(x), rtol=1e-2, atol=1e-2)


@torch.no_grad()
def test_quantized_stack_and_expanded_twin():
    stack = DeaMoEStack.random(CONFIGS["deepseek-style"], 2, seed=4).quantized(QuantConfig(4, 16))
    x = random_hidden(4, 64, seed=4)
    torch.testing.assert_close(cpu.CpuDeaMoEStack(stack)(x), stack(x), rtol=1e-5, atol=1e-5)
    twin = stack.layers[0].expanded()
    torch.testing.assert_close(cpu.CpuDeaMoE(twin)(x), stack.layers[0](x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@torch.no_grad()
def test_avx2_build_matches_reference(tmp_path, monkeypatch):
    """The AVX2 code path (8-wide vectors, fma dequantization), built for Haswell and run here."""
    from deamoe_trt.cpu import _build

    cxx = _build.compiler()
    flags = [f for f in _build.FLAGS if f != "-march=native"] + ["-march=haswell"]
    lib_path = tmp_path / "libdeamoe_cpu_avx2.so"
    subprocess.run(_build.compile_command(cxx, lib_path, flags), check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib_path))
    _build._declare(lib)
    assert lib.dm_simd().decode() == "avx2"
    monkeypatch.setattr(_build, "_lib", lib)
    monkeypatch.setattr(cpu, "_pools", {})
    for bits in (4, 8):
        layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=5).quantized(QuantConfig(bits, 16))
        for tokens in (1, 3):
            x = random_hidden(tokens, 64, seed=tokens)
            torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), layer(x), rtol=1e-5, atol=1e-5)
