"""The CPU kernel's AMX path (deamoe_cpu.cpp, "AMX"): int8/int4 FFNs and projections at several
tokens on the tile multiply, against the exactly dequantized reference and against the AVX-512
loops, every scale dtype; batched decoding on it still equals each sequence decoded alone."""

import numpy as np
import pytest
import torch

from configs import DEEPSEEK_STYLE_GROUPED, QUANTIZABLE_MICRO_LM
from deamoe_trt import DeaMoELayer, runtimes
from deamoe_trt.errors import MissingDependencyError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.quant import QuantConfig
from lm_reference import greedy_batch

try:
    from deamoe_trt import cpu
    from deamoe_trt.cpu import layer as cpu_layer

    cpu.load()
except MissingDependencyError as exc:  # no compiler or not x86-64 Linux: nothing to test
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

if not cpu.amx_available():
    pytest.skip("no AMX-BF16 here (CPU, kernel build or OS): the AVX loops are the only path", allow_module_level=True)

# Group sizes of 32 and more take the tiles; 2 departments x 2 experts, so that 16 tokens give
# blocks of many tokens and of few.
LAYER = DEEPSEEK_STYLE_GROUPED.replace(
    hidden_size=128,
    num_departments=2,
    experts_per_department=2,
    top_k=2,
    top_departments=1,
    shared_intermediate_size=64,
    private_intermediate_size=128,
    shared_expert_intermediate_size=64,
)
SCALES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def amx():
    """The AMX switch for a test, the process's default restored after it."""
    before = cpu.amx_mode()
    yield cpu.amx_mode
    cpu.amx_mode(before)


@pytest.mark.parametrize("scales", sorted(SCALES))
@pytest.mark.parametrize(("bits", "group_size"), [(4, 32), (4, 64), (8, 32), (8, 64)])
@torch.no_grad()
def test_ffn_on_tiles_matches_reference_and_avx(bits, group_size, scales, amx, monkeypatch):
    layer = DeaMoELayer.random(LAYER, seed=group_size + bits).quantized(QuantConfig(bits, group_size))
    dtype = SCALES[scales]
    for m in layer.modules():
        if hasattr(m, "scales"):
            m.scales.copy_(m.scales.to(dtype).float())
    monkeypatch.setitem(cpu_layer.SCALE_DTYPES, torch.float32, cpu_layer.SCALE_DTYPES[dtype])
    fast = cpu.CpuDeaMoE(layer)
    for tokens in (1, 2, 4, 16):
        x = random_hidden(tokens, LAYER.hidden_size, seed=tokens)
        want = layer(x)
        assert amx(True)
        tiles = fast(x)
        assert not amx(False)
        loops = fast(x)
        torch.testing.assert_close(tiles, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tiles, loops, rtol=1e-5, atol=1e-5)
        if tokens == 16:  # the tiles sum in another order: other bits, so they did run
            assert not torch.equal(tiles, loops)


@torch.no_grad()
def test_ffn_on_tiles_keeps_precision_across_magnitudes(amx):
    """x is split into three bf16 parts: tokens from 1e-8 to 1e6 keep fp32 precision, relative
    to each token's own output."""
    layer = DeaMoELayer.random(LAYER, seed=7).quantized(QuantConfig(4, 32))
    magnitudes = [1e-8, 1e-3, 1.0, 1e4, 1e6]
    x = random_hidden(len(magnitudes), LAYER.hidden_size, seed=7) * torch.tensor(magnitudes)[:, None]
    amx(True)
    got, want = cpu.CpuDeaMoE(layer)(x), layer(x)
    scale = want.abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(got / scale, want / scale, rtol=0, atol=2e-5)


# Every projection 64 columns wide: attention, dense MLP and head quantize in groups of 32.
MODEL = QUANTIZABLE_MICRO_LM.replace(
    hidden_size=64,
    head_dim=16,
    dense_intermediate_size=64,
    max_position_embeddings=64,
    moe=QUANTIZABLE_MICRO_LM.moe.replace(
        hidden_size=64, shared_intermediate_size=32, private_intermediate_size=32, shared_expert_intermediate_size=32
    ),
)


def quantized_model(bits: int) -> DeaMoELM:
    model = DeaMoELM.random(MODEL, seed=5).eval()
    return model.quantized(QuantConfig(bits, 32), linears=("attention", "dense", "head")).eval()


@pytest.mark.parametrize("bits", [4, 8])
def test_a_batch_on_tiles_equals_each_sequence_alone_and_the_loops(bits, amx):
    """16 sequences of different lengths for 32 steps: logits within 1e-5 of each decoded alone
    (one token a step: the AVX loops) and of the batch on the loops, greedy tokens identical."""
    model = quantized_model(bits)
    cpu_runtime = runtimes.get("cpu")
    gen = torch.Generator().manual_seed(bits)
    prompts = [torch.randint(0, MODEL.vocab_size, (n,), generator=gen).tolist() for n in range(1, 17)]
    steps = 32
    runs = {}
    for on in (True, False):
        amx(on)
        batch = cpu_runtime.batch_decoder(model, max_sequences=len(prompts), threads=1)
        _, logits, tokens = greedy_batch(batch, prompts, steps)
        runs[on] = (logits, tokens)
    (tiles, tiles_tokens), (loops, loops_tokens) = runs[True], runs[False]
    assert tiles_tokens == loops_tokens
    for i in (0, 7, 15):
        amx(True)
        decoder = cpu_runtime.decoder(model, threads=1)
        alone = [decoder.prefill(prompts[i])] + [decoder.step(t) for t in tiles_tokens[i]]
        for got, want, loop in zip(tiles[i], alone, loops[i], strict=True):
            bound = 1e-5 * max(1.0, float(np.abs(want).max()))
            assert np.abs(got - want).max() <= bound and np.abs(got - loop).max() <= bound


@pytest.mark.parametrize("bits", [4, 8])
def test_projections_on_tiles_match_the_reference(bits, amx):
    """A prompt's tokens go through each projection together (on the tiles): logits at every
    position within 1e-5 of the dequantized torch model's."""
    model = quantized_model(bits)
    ids = torch.randint(0, MODEL.vocab_size, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    amx(True)
    got = runtimes.get("cpu").decoder(model, threads=1).prefill(ids)
    assert np.abs(got - want[-1]).max() <= 1e-5 * max(1.0, float(np.abs(want[-1]).max()))


def test_the_switch_reads_and_sets(amx):
    assert amx(True) is True and amx() is True
    assert amx(False) is False and amx() is False
