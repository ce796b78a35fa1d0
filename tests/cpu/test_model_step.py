"""The native decode step of a whole language model (deamoe_trt.cpu.model_step) against the
PyTorch reference (deamoe_trt.lm.model): logits at every position of a decode, greedy
tokens, every attention variant LMConfig has, dense blocks, fp16 weights, quantized
projections, and bad input as one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import MICRO_LM, QUANTIZABLE_MICRO_LM
from deamoe_trt.cpu import INT4_MODES, int4_mode
from deamoe_trt.cpu.model_step import NativeDecoder, NativeModel, unsupported
from deamoe_trt.errors import MissingDependencyError, UsageError
from deamoe_trt.lm import DeaMoELM, LMConfig
from deamoe_trt.quant import QuantConfig
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

try:
    from deamoe_trt.cpu import load

    load()
except MissingDependencyError as exc:
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = MICRO_LM.replace(max_position_embeddings=96)
VARIANTS = {
    "gqa": BASE,
    "mha": BASE.replace(num_key_value_heads=4),
    "qk_norm_head": BASE.replace(qk_norm="head", head_dim=16),
    "heads_of_64": BASE.replace(head_dim=64),
    "qk_norm_full": BASE.replace(qk_norm="full"),
    "biases_and_clip": BASE.replace(qkv_bias=True, o_bias=True, clip_qkv=0.5),
    "sliding_window_and_sinks": BASE.replace(
        num_layers=3, sliding_window=4, sliding_window_layers=(0, 2), attention_sinks=True
    ),
    "every_block_slides": BASE.replace(sliding_window=5),
    "rope_yarn": BASE.replace(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    ),
    "rope_linear_tied_head": BASE.replace(
        rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True
    ),
    "granite_scalings": BASE.replace(
        embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=2.5
    ),
    "dense_block": BASE.replace(num_layers=3, dense_layers=(1,), dense_intermediate_size=20),
    "rows_not_in_fours": BASE.replace(vocab_size=250, num_heads=6, num_key_value_heads=3, head_dim=6),
}


def random_model(config: LMConfig, seed: int = 3, dtype=torch.float32) -> DeaMoELM:
    """Random weights, with the biases, norms and sinks that reset_parameters leaves at 0 or 1
    drawn too, so that each shows in the logits."""
    model = DeaMoELM.random(LMConfig.from_dict(config.to_dict()), seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=gen))
            elif name.startswith("layers.") and ".self_attn." in name and name.endswith(".bias"):
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return model.to(dtype).eval()


def reference_logits(model: DeaMoELM, ids: list[int]) -> np.ndarray:
    """Logits [T, vocab] of the whole sequence in one causal forward (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def ids_of(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_native_logits_match_the_reference_at_every_position(variant):
    model = random_model(VARIANTS[variant])
    ids = ids_of(24, model.config.vocab_size)
    want = reference_logits(model, ids)
    decoder = NativeDecoder(model, threads=1)
    errors = [relative_error(decoder.prefill(ids[:1]), want[0])]
    errors += [relative_error(decoder.step(token), want[t]) for t, token in enumerate(ids[1:], start=1)]
    assert max(errors) <= 1e-5, (variant, errors)
    # A 16-token prefill (each projection streamed once for all 16) ends where 16 steps end,
    # and decoding goes on from its cache.
    assert relative_error(decoder.prefill(ids[:16]), want[15]) <= 1e-5
    assert relative_error(decoder.step(ids[16]), want[16]) <= 1e-5


@pytest.mark.parametrize("variant", ["gqa", "sliding_window_and_sinks", "dense_block"])
def test_native_greedy_tokens_equal_the_reference_over_64_steps(variant):
    model = random_model(VARIANTS[variant], seed=7)
    prompt = ids_of(5, model.config.vocab_size, seed=1)
    want = generate(TorchDecoder(model), prompt, 64).new_ids
    got = generate(NativeDecoder(model, threads=1), prompt, 64).new_ids
    assert len(want) == 64
    assert got == want


def test_fp16_weights_are_read_as_they_are_and_match_the_fp16_model():
    half = random_model(VARIANTS["dense_block"], seed=4, dtype=torch.float16)
    ids = ids_of(12, half.config.vocab_size)
    decoder = NativeDecoder(half, threads=1)
    got = [decoder.prefill(ids[:1])] + [decoder.step(t) for t in ids[1:]]
    # The same fp16 weights in fp32 arithmetic: the native step's own rounding only.
    exact = reference_logits(half.float(), ids)
    assert max(relative_error(g, w) for g, w in zip(got, exact, strict=True)) <= 1e-5
    # The fp16 model itself rounds every activation to fp16.
    fp16 = reference_logits(half, ids)
    assert max(relative_error(g, w) for g, w in zip(got, fp16, strict=True)) <= 2e-2


# Quantized projections' widths are whole groups of 16; 250 head rows are not whole quads of four.
QUANTIZED = QUANTIZABLE_MICRO_LM.replace(dense_intermediate_size=32, vocab_size=250, max_position_embeddings=80)


def test_a_bf16_model_runs_its_attention_exactly_and_its_ffns_in_fp16():
    bf16 = random_model(VARIANTS["dense_block"], seed=2, dtype=torch.bfloat16)
    # What the step holds: every weight widened exactly, the DeaMoE FFNs rounded to fp16 first.
    held = bf16.float()
    for i in held.moe_layers():
        held.layers[i].mlp = bf16.layers[i].mlp.to(torch.float16).float()
    ids = ids_of(10, bf16.config.vocab_size)
    want = reference_logits(held, ids)
    decoder = NativeDecoder(bf16, threads=1)
    got = [decoder.prefill(ids[:1])] + [decoder.step(t) for t in ids[1:]]
    assert max(relative_error(g, w) for g, w in zip(got, want, strict=True)) <= 1e-5


@pytest.fixture(params=INT4_MODES)
def int4_in(request):
    """Each of the kernel's ways of turning int4 codes into floats, the process's own restored after."""
    before = int4_mode()
    int4_mode(request.param)
    yield request.param
    int4_mode(before)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_projections_run_as_the_dequantized_reference(bits, int4_in):
    float_model = random_model(QUANTIZED, seed=5)
    model = float_model.quantized(QuantConfig(bits, 16), linears=("attention", "dense", "head")).eval()
    ids = ids_of(10, model.config.vocab_size)
    want = reference_logits(model, ids)
    decoder = NativeDecoder(model, threads=1)
    got = [decoder.prefill(ids[:3])] + [decoder.step(t) for t in ids[3:]]
    assert max(relative_error(g, w) for g, w in zip(got, want[2:], strict=True)) <= 1e-5
    # The codes are what the step holds, not float copies of them.
    only_ffns = float_model.quantized(QuantConfig(bits, 16)).eval()
    assert decoder.model.nbytes < NativeModel(only_ffns, threads=1).nbytes
    prompt = ids_of(5, model.config.vocab_size, seed=1)
    assert (
        generate(NativeDecoder(model, threads=1), prompt, 64).new_ids
        == generate(TorchDecoder(model), prompt, 64).new_ids
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_16_bit_scales_are_read_as_stored(bits, dtype, int4_in):
    model = random_model(QUANTIZED, seed=5, dtype=dtype)
    model = model.quantized(QuantConfig(bits, 16), linears=("attention", "dense", "head")).eval()
    assert model.state_dict()["lm_head.weight.scales"].dtype == dtype
    ids = ids_of(8, model.config.vocab_size)
    # The same codes and scales in float32 arithmetic: every stored value widens exactly.
    want = reference_logits(model.float(), ids)
    decoder = NativeDecoder(model, threads=1)
    got = [decoder.prefill(ids[:3])] + [decoder.step(t) for t in ids[3:]]
    assert max(relative_error(g, w) for g, w in zip(got, want[2:], strict=True)) <= 1e-5


def test_scales_a_16_bit_format_cannot_hold_are_refused_not_rounded():
    import ctypes

    lib = NativeModel(random_model(BASE, seed=1), threads=1).lib
    rows, cols, gs = 4, 32, 16
    codes = torch.full((rows, cols), 8, dtype=torch.uint8)
    out = ctypes.create_string_buffer(int(lib.dm_pack_linear_q_bytes(rows, cols, gs, 4, 0)))
    for scale, dtype, code in [(0.5, 1, 0), (0.5, 2, 0), (0.1, 1, -2), (0.1, 2, -2), (0.1, 0, 0), (0.5, 3, -1)]:
        scales = torch.full((rows, cols // gs), scale)
        got = lib.dm_pack_linear_q(codes.data_ptr(), scales.data_ptr(), dtype, rows, cols, gs, 4, out)
        assert got == code, (scale, dtype)


@pytest.mark.parametrize("bits", [None, 4])
def test_two_threads_give_the_same_bits_as_one(bits):
    model = random_model(QUANTIZED, seed=6)
    if bits:
        model = model.quantized(QuantConfig(bits, 16), linears=("attention", "dense", "head")).eval()
    ids = ids_of(9, model.config.vocab_size)
    one, two = NativeDecoder(model, threads=1), NativeDecoder(model, threads=2)
    np.testing.assert_array_equal(one.prefill(ids), two.prefill(ids))
    np.testing.assert_array_equal(one.step(3), two.step(3))


def test_forked_sequences_keep_caches_of_their_own():
    model = random_model(BASE, seed=8)
    a = NativeDecoder(NativeModel(model, threads=1))
    b = a.fork()
    ids = ids_of(6, BASE.vocab_size, seed=2)
    want = reference_logits(model, ids)
    a.prefill(ids[:3])
    b.prefill(ids[:1])
    assert relative_error(a.step(ids[3]), want[3]) <= 1e-5
    assert relative_error(b.step(ids[1]), want[1]) <= 1e-5
    assert (a.position, b.position) == (4, 2)


def test_stepping_past_the_context_is_one_line_and_changes_nothing():
    model = random_model(BASE.replace(max_position_embeddings=8), seed=9)
    decoder = NativeDecoder(model, threads=1)
    ids = ids_of(8, BASE.vocab_size)
    logits = decoder.prefill(ids)
    assert decoder.position == 8
    with pytest.raises(UsageError, match="8 cached \\+ 1 new tokens exceed the model's context of 8") as info:
        decoder.step(1)
    assert "\n" not in str(info.value)
    assert decoder.position == 8
    with pytest.raises(UsageError, match="exceed the model's context of 8"):
        decoder.prefill(ids_of(9, BASE.vocab_size))
    np.testing.assert_array_equal(decoder.prefill(ids), logits)


def test_a_token_outside_the_vocabulary_is_one_line():
    decoder = NativeDecoder(random_model(BASE), threads=1)
    with pytest.raises(UsageError, match=f"token id {BASE.vocab_size} is outside the vocabulary of 256"):
        decoder.prefill([1, BASE.vocab_size])
    assert decoder.position == 0


def test_mla_models_are_refused_with_the_reason():
    mla = BASE.replace(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
    assert unsupported(BASE) is None
    reason = unsupported(mla)
    assert reason is not None and "multi-head latent attention" in reason
    with pytest.raises(UsageError, match="multi-head latent attention"):
        NativeModel(DeaMoELM.random(mla, seed=1))


def test_attention_split_over_threads_matches_the_reference_at_long_contexts():
    # 8 heads of 128: from 64 keys on, a step's heads are split over the pool's threads.
    config = BASE.replace(num_heads=8, num_key_value_heads=2, head_dim=128, num_layers=3, sliding_window=70)
    config = config.replace(sliding_window_layers=(1,), attention_sinks=True)
    model = random_model(config, seed=11)
    ids = ids_of(90, config.vocab_size)
    want = reference_logits(model, ids)
    decoder = NativeDecoder(model, threads=2)
    decoder.prefill(ids[:60])
    errors = [relative_error(decoder.step(token), want[t]) for t, token in enumerate(ids[60:], start=60)]
    assert max(errors) <= 1e-5
