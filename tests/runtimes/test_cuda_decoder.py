"""The CUDA runtime's whole-model decoder (runtimes.cuda_decoder) on the SIMT-emulated kernel
library: greedy tokens and logits against the PyTorch reference decoding each sequence alone,
for the shipped tiny LM, its int8 and int4 forms, one model per attention variant, the twins,
and several sequences a step. The emulator runs one host thread per CUDA thread, so the
models are tiny and the step counts small."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.model import DeaMoELM
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.quant import QuantConfig
from deamoe_trt.runtimes.cuda import CudaRuntime
from deamoe_trt.runtimes.torch import TorchDecoder

pytestmark = pytest.mark.usefixtures("one_thread")

# Largest |logits - reference| / max |reference| a step may show: float32 kernels agree to
# rounding; bfloat16 rounds activations between kernels differently from PyTorch's ops.
LOGITS_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module")
def tiny():
    return load_lm(TINY_LM).model


@pytest.fixture
def emulated(emulated_lib):
    return CudaRuntime.emulated(emulated_lib._name)


def gap(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def decode_against_reference(runtime, model, prompts, steps, *, twin="deamoe", **options) -> float:
    """Decodes the prompts together on the runtime's batch decoder, each fed the reference's
    greedy token at every step, and checks that each row's greedy token is the reference's
    (the PyTorch model decoding that sequence alone); the worst relative logits gap."""
    batch = runtime.batch_decoder(model, max_sequences=len(prompts), twin=twin, **options)
    references = [TorchDecoder(model.twin(twin)) for _ in prompts]
    seqs, tokens, worst = [], [], 0.0
    for prompt, reference in zip(prompts, references, strict=True):
        seq, got = batch.open(prompt)
        want = reference.prefill(prompt)
        assert int(np.argmax(got)) == int(np.argmax(want))
        worst = max(worst, gap(got, want))
        seqs.append(seq)
        tokens.append(int(np.argmax(want)))
    for step in range(steps):
        rows = batch.step(seqs, tokens)
        assert rows.shape == (len(prompts), model.config.vocab_size) and rows.dtype == np.float32
        for i, reference in enumerate(references):
            want = reference.step(tokens[i])
            assert int(np.argmax(rows[i])) == int(np.argmax(want)), f"sequence {i}, step {step}"
            worst = max(worst, gap(rows[i], want))
            tokens[i] = int(np.argmax(want))
    for seq, prompt in zip(seqs, prompts, strict=True):
        assert batch.length(seq) == len(prompt) + steps
    return worst


@pytest.mark.slow
def test_the_tiny_lm_decodes_the_reference_tokens_over_32_steps(emulated, tiny):
    worst = decode_against_reference(emulated, tiny, [list(b"The tiny model ")], 32)
    assert worst < LOGITS_TOLERANCE[torch.float32]


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
def test_the_tiny_lm_int8_int4_with_quantized_projections_decode_the_reference_tokens(emulated, tiny, bits):
    # 16 steps, not 32: each emulated step of the tiny LM takes about a second here.
    model = tiny.quantized(QuantConfig(bits=bits, group_size=32), linears=("attention", "head"))
    worst = decode_against_reference(emulated, model, [list(b"The tiny model ")], 16)
    assert worst < LOGITS_TOLERANCE[torch.float32]


@pytest.mark.slow
def test_the_bfloat16_tiny_lm_stays_within_its_tolerance(emulated, tiny):
    import copy

    worst = decode_against_reference(emulated, copy.deepcopy(tiny).to(torch.bfloat16), [list(b"Once upon ")], 4)
    assert worst < LOGITS_TOLERANCE[torch.bfloat16]


def _micro(**changes):
    from configs import MICRO_LM

    return DeaMoELM.random(MICRO_LM.replace(**changes), seed=5).eval()


# One model per attention variant the reference has: grouped-query heads with q/k norms and
# biases (Qwen), sliding windows in some blocks with sinks (gpt-oss), a dense block with full
# q/k norms, clipping and Granite's multipliers (OLMoE, Granite), latent attention (DeepSeek).
VARIANTS = {
    "grouped-qk-norm-bias": dict(qk_norm="head", qkv_bias=True, o_bias=True, head_dim=16),
    "sliding-sinks": dict(sliding_window=3, sliding_window_layers=(0,), attention_sinks=True),
    "dense-clip-multipliers": dict(
        dense_layers=(0,),
        dense_intermediate_size=24,
        qk_norm="full",
        clip_qkv=0.5,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.3,
        logits_scaling=2.0,
    ),
    "latent": dict(
        num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, head_dim=8
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_attention_variant_decodes_two_sequences_as_the_reference_does_alone(emulated, variant):
    model = _micro(**VARIANTS[variant])
    worst = decode_against_reference(emulated, model, [[3, 1, 4, 1, 5], [9, 2]], 6)
    assert worst < LOGITS_TOLERANCE[torch.float32]


@pytest.mark.slow
@pytest.mark.parametrize("twin", ["expanded", "vanilla"])
def test_the_twins_decode_on_the_same_decoder(emulated, twin):
    worst = decode_against_reference(emulated, _micro(), [[7, 7, 8]], 4, twin=twin)
    assert worst < LOGITS_TOLERANCE[torch.float32]


@pytest.mark.slow
def test_sequences_joining_and_leaving_a_batch_match_each_decoded_alone(emulated):
    model = _micro()
    batch = emulated.batch_decoder(model, max_sequences=3)
    a, _ = batch.open([1, 2, 3])
    b, _ = batch.open([4])
    batch.step([a, b], [5, 6])
    batch.close(a)
    c, _ = batch.open([9, 9, 9, 9])
    assert c == a
    rows = batch.step([c, b], [10, 11])
    for prompt, fed, row in (([9, 9, 9, 9], [10], rows[0]), ([4], [6, 11], rows[1])):
        alone = emulated.decoder(model)
        alone.prefill(prompt)
        for token in fed:
            last = alone.step(token)
        np.testing.assert_allclose(row, last, rtol=0, atol=1e-5 * np.abs(last).max())


def test_a_bad_max_context_is_one_line(emulated_lib):
    runtime = CudaRuntime.emulated(emulated_lib._name)
    with pytest.raises(UsageError, match="max_context must be an integer from 2") as caught:
        runtime.batch_decoder(_micro(), max_sequences=1, max_context=10_000)
    assert "\n" not in str(caught.value)


def test_generate_runtime_cuda_without_a_gpu_exits_2_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    code = main(["generate", str(TINY_LM), "--prompt", "The", "--runtime", "cuda"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "needs a CUDA GPU" in err


@pytest.mark.slow
def test_generate_runtime_cuda_emulated_prints_the_reference_text(capsys, monkeypatch, emulated_lib):
    from deamoe_trt import runtimes
    from deamoe_trt.runtimes.decode import generate

    monkeypatch.setattr(runtimes.get("cuda-emulated"), "library", emulated_lib._name)

    code = main(["generate", str(TINY_LM), "--prompt", "The", "--max-new-tokens", "4", "--runtime", "cuda-emulated"])
    out = capsys.readouterr().out
    loaded = load_lm(TINY_LM)
    want = generate(TorchDecoder(loaded.model), list(b"The"), 4).new_ids
    assert code == 0 and "The" + loaded.tokenizer.decode(want) in out and "cuda-emulated" in out


@pytest.mark.slow
@pytest.mark.parametrize("bits", [0, 8])  # int4 needs widths of 32: the micro model's are 16
def test_dense_blocks_run_on_the_kernels_as_one_part_layers(emulated, bits):
    from configs import LINEARS_MICRO_LM

    model = DeaMoELM.random(LINEARS_MICRO_LM, seed=2).eval()
    if bits:
        model = model.quantized(QuantConfig(bits=bits, group_size=16), linears=("dense",))
    batch = emulated.batch_decoder(model, max_sequences=1)
    assert sorted(batch.ffns) == [0, 1, 2]  # block 1 is the dense one
    worst = decode_against_reference(emulated, model, [[5, 6, 7]], 4)
    assert worst < LOGITS_TOLERANCE[torch.float32]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["grouped-qk-norm-bias", "latent"])
def test_projections_on_the_kernels_gemv_decode_the_reference_tokens(emulated, variant):
    from torch import nn

    model = _micro(**VARIANTS[variant], tie_word_embeddings=variant == "latent")
    batch = emulated.batch_decoder(model, max_sequences=2, projections="kernels")
    expected = 4 * model.config.num_layers + 1 if variant != "latent" else None
    assert batch.kernel_projections == expected or (expected is None and batch.kernel_projections > 0)
    worst = decode_against_reference(emulated, model, [[3, 1, 4, 1, 5], [9, 2]], 4, projections="kernels")
    assert worst < LOGITS_TOLERANCE[torch.float32]
    assert isinstance(model.layers[0].self_attn.o_proj, nn.Linear)  # the caller's model is left as it was
