"""The CPU kernel runtime's batch decoder (runtimes.cpu_kernel.NativeBatchDecoder): several
sequences stepped in one native call give what each gives decoded alone on the runtime's
single-sequence decoder, for float, fp16 and int8/int4 models and the twins; sequences join
and leave between steps; bad batches are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import LINEARS_MICRO_LM, MICRO_LM
from deamoe_trt import runtimes
from deamoe_trt.errors import MissingDependencyError, UsageError
from deamoe_trt.lm import DeaMoELM, LMConfig
from deamoe_trt.quant import QuantConfig
from deamoe_trt.runtimes.base import SerialBatchDecoder
from deamoe_trt.runtimes.cpu_kernel import NativeBatchDecoder
from lm_reference import greedy_batch

try:
    from deamoe_trt.cpu import load

    load()
except MissingDependencyError as exc:
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

CPU = runtimes.get("cpu")
BASE = MICRO_LM.replace(max_position_embeddings=64, num_layers=3, sliding_window=6, sliding_window_layers=(1,))


def random_model(config: LMConfig, seed: int = 3) -> DeaMoELM:
    return DeaMoELM.random(LMConfig.from_dict(config.to_dict()), seed=seed).eval()


def quantized(bits: int) -> DeaMoELM:
    model = random_model(LINEARS_MICRO_LM.replace(max_position_embeddings=64), seed=5)
    return model.quantized(QuantConfig(bits, 16), linears=("attention", "dense", "head")).eval()


MODELS = {
    "fp32": lambda: random_model(BASE),
    "fp16": lambda: random_model(BASE).to(torch.float16),
    "int8": lambda: quantized(8),
    "int4": lambda: quantized(4),
}


def prompts_of(lengths, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(sum(lengths))
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def greedy_alone(model, prompt: list[int], steps: int, **options) -> tuple[list[np.ndarray], list[int]]:
    """Logits and greedy tokens of prompt decoded alone on the runtime's one-sequence decoder."""
    decoder = CPU.decoder(model, threads=1, **options)
    logits = [decoder.prefill(prompt)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits.append(decoder.step(tokens[-1]))
    return logits, tokens


@pytest.mark.parametrize(
    ("kind", "twin"),
    [("fp32", "deamoe"), ("fp16", "deamoe"), ("int8", "deamoe"), ("int4", "deamoe"), ("fp32", "vanilla")],
)
def test_a_batch_of_different_lengths_equals_each_sequence_decoded_alone(kind, twin):
    model = MODELS[kind]()
    prompts = prompts_of((1, 4, 9, 13), model.config.vocab_size)
    steps = 32
    batch = CPU.batch_decoder(model, max_sequences=4, threads=1, twin=twin)
    assert isinstance(batch, NativeBatchDecoder)
    seqs, logits, tokens = greedy_batch(batch, prompts, steps)
    assert logits[0][0].shape == (model.config.vocab_size,)
    for i, prompt in enumerate(prompts):
        want_logits, want_tokens = greedy_alone(model, prompt, steps, twin=twin)
        assert tokens[i] == want_tokens
        for got, want in zip(logits[i], want_logits, strict=True):
            assert_close(got, want)
        assert batch.length(seqs[i]) == len(prompt) + steps


def test_the_expanded_twin_batches_as_it_decodes_alone():
    model = random_model(BASE, seed=4)
    prompts = prompts_of((2, 7), model.config.vocab_size)
    batch = CPU.batch_decoder(model, max_sequences=2, threads=1, twin="expanded")
    opened = [batch.open(p) for p in prompts]
    rows = batch.step([seq for seq, _ in opened], [11, 12])
    for (_, first), prompt, token, row in zip(opened, prompts, [11, 12], rows, strict=True):
        alone = CPU.decoder(model, threads=1, twin="expanded")
        assert_close(first, alone.prefill(prompt))
        assert_close(row, alone.step(token))


def test_long_contexts_on_two_threads_split_the_batch_attention_and_match():
    # 8 heads of 128 and 3 x 40 keys: the batch's attention is split over the pool's threads.
    config = BASE.replace(num_heads=8, num_key_value_heads=2, head_dim=128, sliding_window=30, attention_sinks=True)
    model = random_model(config, seed=11)
    prompts = prompts_of((40, 35, 44), config.vocab_size)
    batch = CPU.batch_decoder(model, max_sequences=3, threads=2)
    seqs = [batch.open(p)[0] for p in prompts]
    alone = [CPU.decoder(model, threads=1) for _ in prompts]
    for decoder, prompt in zip(alone, prompts, strict=True):
        decoder.prefill(prompt)
    for token in (3, 9, 27):
        rows = batch.step(seqs, [token, token + 1, token + 2])
        for i, decoder in enumerate(alone):
            assert_close(rows[i], decoder.step(token + i))


def test_sequences_join_and_leave_between_steps():
    model = random_model(BASE, seed=6)
    prompts = prompts_of((3, 6, 2, 5), model.config.vocab_size)
    batch = CPU.batch_decoder(model, max_sequences=3, threads=1)
    alone: dict[int, object] = {}

    def join(prompt):
        seq, first = batch.open(prompt)
        alone[seq] = CPU.decoder(model, threads=1)
        assert_close(first, alone[seq].prefill(prompt))
        return seq

    def step(seqs, base):
        rows = batch.step(seqs, [base + i for i in range(len(seqs))])
        for i, seq in enumerate(seqs):
            assert_close(rows[i], alone[seq].step(base + i))

    a, b = join(prompts[0]), join(prompts[1])
    step([a, b], 20)
    c = join(prompts[2])  # joins mid-batch
    step([c, a, b], 30)
    batch.close(a)  # leaves; its slot is free for the next
    step([b, c], 40)
    d = join(prompts[3])
    assert d == a
    step([d, b, c], 50)
    step([c], 60)  # a step over some of the open sequences only
    assert batch.length(b) == len(prompts[1]) + 4
    assert batch.length(c) == len(prompts[2]) + 4
    assert batch.length(d) == len(prompts[3]) + 1


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda b, s: b.step([s, s + 1, s + 2], [1, 2, 3]), "3 sequences is over this decoder's maximum of 2"),
        (lambda b, s: b.step([], []), "the batch is empty"),
        (lambda b, s: b.step([s], [10_000]), "token id 10000 is outside the vocabulary"),
        (lambda b, s: b.open([1, -1]), "token id -1 is outside the vocabulary"),
    ],
)
def test_bad_batches_are_refused_in_one_line(action, message):
    batch = CPU.batch_decoder(random_model(BASE), max_sequences=2, threads=1)
    seq, _ = batch.open([1, 2])
    with pytest.raises(UsageError, match=message) as err:
        action(batch, seq)
    assert "\n" not in str(err.value)
    assert batch.length(seq) == 2


def test_a_sequence_past_its_context_is_refused_and_the_others_go_on():
    model = random_model(BASE.replace(max_position_embeddings=8))
    batch = CPU.batch_decoder(model, max_sequences=2, threads=1)
    full, _ = batch.open(list(range(7)))
    other, _ = batch.open([1])
    batch.step([full, other], [1, 2])
    with pytest.raises(UsageError, match="filled its context of 8 tokens") as err:
        batch.step([other, full], [1, 2])
    assert "\n" not in str(err.value)
    assert batch.length(other) == 2
    assert batch.step([other], [3]).shape == (1, model.config.vocab_size)


def test_a_bad_maximum_is_refused_before_packing():
    with pytest.raises(UsageError, match="max_sequences must be an integer from 1 to"):
        CPU.batch_decoder(random_model(BASE), max_sequences=0)


def test_mla_models_keep_the_serial_fallback():
    mla = BASE.replace(
        num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, sliding_window=0
    )
    model = random_model(mla, seed=2)
    batch = CPU.batch_decoder(model, max_sequences=2, threads=1)
    assert isinstance(batch, SerialBatchDecoder)
    prompts = prompts_of((2, 4), mla.vocab_size)
    seqs = [batch.open(p)[0] for p in prompts]
    rows = batch.step(seqs, [5, 6])
    for prompt, token, row in zip(prompts, [5, 6], rows, strict=True):
        alone = CPU.decoder(model, threads=1)
        alone.prefill(prompt)
        np.testing.assert_allclose(row, alone.step(token), rtol=0, atol=1e-5)
