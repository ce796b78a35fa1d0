"""The CPU kernel on int8/int4 layers against the exactly dequantized PyTorch reference."""

import copy
import ctypes
import dataclasses
import subprocess

import pytest
import torch

from configs import DEEPSEEK_STYLE_GROUPED, QWEN2_STYLE_GROUPED
from deamoe_trt import PRESETS, DeaMoEError, DeaMoELayer, DeaMoEStack, MissingDependencyError, UsageError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig
from deamoe_trt.routing import Routing

try:
    from deamoe_trt import cpu
    from deamoe_trt.cpu import layer as cpu_layer

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


@pytest.mark.parametrize("tokens", (1, 5))
def test_deterministic_and_thread_counts_agree(pair, tokens):
    """A step's slices are the same on 1 and 2 threads, and summed in slice order, whichever
    thread ran which: the same bits."""
    layer, fast = pair
    x = random_hidden(tokens, layer.config.hidden_size, seed=0)
    assert torch.equal(fast(x), fast(x))
    one, two = cpu.CpuDeaMoE(layer, threads=1)(x), cpu.CpuDeaMoE(layer, threads=2)(x)
    assert torch.equal(one, two)
    torch.testing.assert_close(two, layer(x), rtol=1e-5, atol=1e-5)


# Every bits x group size x pass shape, int4 in both code-to-float modes: 256 columns are
# 2..16 quantization groups, 16 tokens are 8 passes of 2 (AVX2: 16 of 1), 3 ends on a pass
# of 1. Few experts: quantizing and the reference are what take the time.
WIDE = CONFIGS["deepseek-style"].replace(
    hidden_size=256,
    num_departments=2,
    experts_per_department=2,
    top_k=2,
    top_departments=1,
    shared_intermediate_size=128,
    private_intermediate_size=128,
    shared_expert_intermediate_size=128,
)


@pytest.fixture(scope="module", params=[(bits, gs) for bits in (4, 8) for gs in (16, 32, 64, 128)], ids=str)
def wide(request):
    """A quantized layer, and its reference outputs for 1, 3 and 16 tokens (computed once for
    both int4 modes: the reference takes 0.3-1 s a call)."""
    bits, group_size = request.param
    layer = DeaMoELayer.random(WIDE, seed=group_size).quantized(QuantConfig(bits, group_size))
    with torch.no_grad():
        xs = [random_hidden(tokens, WIDE.hidden_size, seed=tokens) for tokens in (1, 3, 16)]
        return layer, [(x, layer(x)) for x in xs]


@pytest.fixture
def int4_mode():
    """Set the kernel's int4 mode for a test, and restore the process's default after it."""
    default = cpu.int4_mode()
    yield cpu.int4_mode
    cpu.int4_mode(default)


@pytest.mark.parametrize("mode", cpu.INT4_MODES)
@torch.no_grad()
def test_group_sizes_and_passes(wide, mode, int4_mode):
    layer, references = wide
    fast = cpu.CpuDeaMoE(layer)
    int4_mode(mode)  # int8 ignores it: both runs must match
    for x, want in references:
        torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", cpu.INT4_MODES)
@torch.no_grad()
def test_each_token_of_many_gets_the_bits_it_gets_alone(wide, mode, int4_mode):
    """17 tokens on one routing, in passes of several tokens: each token's sums are taken in the
    order of its own step."""
    layer, _ = wide
    fast = cpu.CpuDeaMoE(layer)
    int4_mode(mode)
    x = random_hidden(17, WIDE.hidden_size, seed=17)
    routing = layer.route(x)
    together = fast.forward_routed(x, routing)
    for t in (0, 5, 15, 16):
        alone = Routing(*(getattr(routing, f.name)[t : t + 1] for f in dataclasses.fields(Routing)))
        assert torch.equal(together[t : t + 1], fast.forward_routed(x[t : t + 1], alone))


@pytest.mark.parametrize("mode", cpu.INT4_MODES)
@torch.no_grad()
def test_int4_modes_keep_precision_across_magnitudes(mode, int4_mode):
    """Tokens from 1e-8 to 1e6: the subnormal mode scales x by 2^64, h by up to 2^96 and its
    codes sit 2^-149 low (1e6 makes some h exceed 2^32: those groups take the conversion);
    each token's output must still match the reference to fp32 rounding, relative to its
    own scale. Then a token of 2e18 (over 2^60: the whole step takes the conversion), with
    weights scaled down by 1e-12 so that the reference stays finite."""
    layer = DeaMoELayer.random(WIDE.replace(shared_expert_intermediate_size=0), seed=7).quantized(QuantConfig(4, 32))
    int4_mode(mode)
    small = copy.deepcopy(layer)
    for module in small.modules():
        if hasattr(module, "scales"):
            module.scales.mul_(1e-12)
    for model, magnitudes in ((layer, [1e-8, 1e-3, 1.0, 1e4, 1e6]), (small, [1.0, 1e3, 2e18])):
        x = random_hidden(len(magnitudes), WIDE.hidden_size, seed=7) * torch.tensor(magnitudes)[:, None]
        got, want = cpu.CpuDeaMoE(model)(x), model(x)
        assert torch.isfinite(want).all()
        # Scale each token's error by that token's output.
        scale = want.abs().amax(dim=1, keepdim=True)
        torch.testing.assert_close(got / scale, want / scale, rtol=0, atol=2e-5)
    assert int4_mode() == mode


def test_int4_mode_rejects_unknown_names():
    with pytest.raises(UsageError, match="int4 mode"):
        cpu.int4_mode("lookup")


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
            int(fast.lib.dm_pack_q_bytes(n, w, config.hidden_size, 16, bits, 0))
            for n, w in ((4, 32), (16, 32), (1, 64))
        )
        assert asked == codes + scales
        assert fast.quant.bits == bits and router > 0


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@torch.no_grad()
def test_16_bit_scales_are_packed_as_stored_and_give_the_same_bits(bits, dtype, monkeypatch):
    """Scales a 16-bit dtype holds exactly are packed in it (two bytes each instead of four)
    and widened exactly when read: the step's outputs are the fp32-scale step's, bit for bit."""
    layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=3).quantized(QuantConfig(bits, 16))
    for m in layer.modules():
        if hasattr(m, "scales"):
            m.scales.copy_(m.scales.to(dtype).float())
    x = random_hidden(5, layer.config.hidden_size, seed=1)
    wide = cpu.CpuDeaMoE(layer)
    monkeypatch.setitem(cpu_layer.SCALE_DTYPES, torch.float32, cpu_layer.SCALE_DTYPES[dtype])
    narrow = cpu.CpuDeaMoE(layer)
    scales = sum(m.scales.numel() for m in layer.modules() if hasattr(m, "scales"))
    assert wide.nbytes - narrow.nbytes == 2 * scales
    assert torch.equal(narrow(x), wide(x))
    torch.testing.assert_close(narrow(x), layer(x), rtol=1e-5, atol=1e-5)


def test_scales_a_16_bit_dtype_cannot_hold_are_refused(monkeypatch):
    layer = DeaMoELayer.random(CONFIGS["tiny"], seed=3).quantized(QuantConfig(4, 16))
    monkeypatch.setitem(cpu_layer.SCALE_DTYPES, torch.float32, cpu_layer.SCALE_DTYPES[torch.float16])
    with pytest.raises(DeaMoEError, match="pack quantized weights"):
        cpu.CpuDeaMoE(layer)


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
    monkeypatch.setattr(cpu.runtime, "_pools", {})
    for bits, mode in [(4, "convert"), (4, "subnormal"), (8, None)]:
        if mode:
            cpu.int4_mode(mode)
        layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=5).quantized(QuantConfig(bits, 16))
        for tokens in (1, 3):
            x = random_hidden(tokens, 64, seed=tokens)
            torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), layer(x), rtol=1e-5, atol=1e-5)
