"""The step scheduler with real batch decoders on the shipped tiny LM: batching must not change any output."""

import threading

import numpy as np
import pytest

from deamoe_trt import runtimes
from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.triton.scheduler import (
    CANCELLED,
    CONTEXT,
    LENGTH,
    STOP,
    GenerationParams,
    Sequence,
    StepScheduler,
    next_token,
    nucleus,
)
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.runtimes.base import DecoderPool, SerialBatchDecoder
from deamoe_trt.runtimes.decode import Sampling, generate, pick
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder

PROMPTS = ["Anne was", "Captain Wentworth said", "Mary", "It was a fine morning, and"]


@pytest.fixture(scope="module")
def tiny():
    return load_lm(TINY_LM)


@pytest.fixture
def one_thread():
    """torch on one thread, as the decode service runs it (many threads thrash on a shared machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Collector:
    """An emit that records what the scheduler streams, and when a sequence is done."""

    def __init__(self):
        self.ids, self.text, self.finish, self.error = [], "", None, None
        self.calls_after_finish = 0
        self.sizes = []  # the ids of each call that carried some
        self.done = threading.Event()

    def __call__(self, ids, text, finish, error):
        if self.done.is_set():
            self.calls_after_finish += 1
        if ids:
            self.sizes.append(len(ids))
        self.ids += ids
        self.text += text
        if finish is not None:
            self.finish, self.error = finish, error
            self.done.set()


def run_all(scheduler, jobs, timeout=60):
    collectors = []
    for prompt_ids, params in jobs:
        c = Collector()
        scheduler.submit(Sequence(prompt_ids, params, c))
        collectors.append(c)
    for c in collectors:
        assert c.done.wait(timeout), "a sequence never finished"
    return collectors


def ort_batch(tiny, max_sequences: int = 32) -> tuple[SerialBatchDecoder, object]:
    """ONNX Runtime's batch decoder (sequences stepped in turn over one session) and a factory of
    single decoders on the same session."""
    shared = OrtDecoder.from_model(tiny.model, threads=1)
    new_decoder = lambda: OrtDecoder(shared.session, shared.info)  # noqa: E731
    return SerialBatchDecoder(DecoderPool(new_decoder, keep_alive=shared), max_sequences), new_decoder


@pytest.mark.parametrize("runtime", ["ort", "torch", "cpu"])
def test_batched_sequences_equal_each_prompt_alone(tiny, runtime, one_thread):
    if runtime == "ort":
        batch, new_decoder = ort_batch(tiny, 3)
    elif runtime == "torch":
        batch = runtimes.get("torch").batch_decoder(tiny.model, max_sequences=3)
        new_decoder = lambda: TorchDecoder(tiny.model)  # noqa: E731
    else:
        cpu = runtimes.get("cpu")
        if cpu.available() is not None:
            pytest.skip(cpu.available())
        batch = cpu.batch_decoder(tiny.model, max_sequences=3, threads=1)  # the native batched step
        new_decoder = lambda: cpu.decoder(tiny.model, threads=1)  # noqa: E731
    scheduler = StepScheduler(batch, tiny.tokenizer.decode).start()
    try:
        # Different prompt lengths and budgets; 4 jobs with room for 3, so one joins while others run.
        jobs = [(tiny.tokenizer.encode(p), GenerationParams(max_tokens=10 + 3 * i)) for i, p in enumerate(PROMPTS)]
        collectors = run_all(scheduler, jobs)
    finally:
        scheduler.stop()
    for (prompt_ids, params), c in zip(jobs, collectors, strict=True):
        alone = generate(new_decoder(), prompt_ids, params.max_tokens).new_ids
        assert c.ids == alone and c.finish == LENGTH and c.error is None and c.calls_after_finish == 0
        assert c.text == tiny.tokenizer.decode(alone)


def test_responses_carry_more_tokens_as_more_sequences_are_in_flight(tiny, one_thread):
    """8 sequences, 2 responses a turn: up to 4 tokens a response, the first alone; one sequence
    alone gets a response per token. The tokens are the same either way."""
    params = GenerationParams(max_tokens=12)
    jobs = [(tiny.tokenizer.encode(PROMPTS[i % len(PROMPTS)] + " " * i), params) for i in range(8)]
    batch = runtimes.get("torch").batch_decoder(tiny.model, max_sequences=8)
    scheduler = StepScheduler(batch, tiny.tokenizer.decode, responses_per_turn=2).start()
    try:
        many = run_all(scheduler, jobs)
        (one,) = run_all(scheduler, jobs[:1])
    finally:
        scheduler.stop()
    for (prompt_ids, _), c in zip(jobs, many, strict=True):
        assert c.ids == generate(TorchDecoder(tiny.model), prompt_ids, params.max_tokens).new_ids
        assert c.sizes[0] == 1 and max(c.sizes) <= 4 and sum(c.sizes) == params.max_tokens
        assert c.finish == LENGTH and c.text == tiny.tokenizer.decode(c.ids)
    assert sum(len(c.sizes) for c in many) < 8 * params.max_tokens  # fewer responses than tokens
    assert one.sizes == [1] * params.max_tokens and one.ids == many[0].ids
    with pytest.raises(UsageError, match="responses_per_turn"):
        StepScheduler(batch, tiny.tokenizer.decode, responses_per_turn=0)


def test_context_stop_cancel_and_a_failing_decoder(tiny):
    batch, new_decoder = ort_batch(tiny)
    scheduler = StepScheduler(batch, tiny.tokenizer.decode).start()
    try:
        prompt = tiny.tokenizer.encode("x" * 250)
        alone = generate(new_decoder(), tiny.tokenizer.encode("Anne was"), 40).new_ids
        stop_text = tiny.tokenizer.decode(alone)[5:8]
        context, stopped = run_all(
            scheduler,
            [
                (prompt, GenerationParams(max_tokens=50)),
                (tiny.tokenizer.encode("Anne was"), GenerationParams(stop=(stop_text,))),
            ],
        )
        cancelled = Collector()
        flag = threading.Event()
        scheduler.submit(
            Sequence(tiny.tokenizer.encode("Anne"), GenerationParams(max_tokens=200), cancelled, flag.is_set)
        )
        flag.set()
        assert cancelled.done.wait(30)
    finally:
        scheduler.stop()
    assert context.finish == CONTEXT and len(context.ids) == 6  # 250 prompt + 6 new fill the 256 context
    # Stops right after the stop string appears (it stays in the output), tokens equal to alone up to there.
    assert stopped.finish == STOP and stopped.text.endswith(stop_text) and stopped.ids == alone[: len(stopped.ids)]
    assert stop_text not in stopped.text[:-1]
    assert cancelled.finish == CANCELLED and len(cancelled.ids) < 200

    class Broken:
        name, max_context = "broken", 256

        def prefill(self, ids):
            raise RuntimeError("out of memory")

    broken = StepScheduler(SerialBatchDecoder(DecoderPool(Broken), 2), tiny.tokenizer.decode).start()
    try:
        (failed,) = run_all(broken, [([65, 66], GenerationParams(max_tokens=3))])
    finally:
        broken.stop()
    assert failed.finish == "error" and "out of memory" in failed.error


def test_a_failing_batched_step_fails_its_sequences_and_the_next_ones_run(tiny):
    batch = runtimes.get("torch").batch_decoder(tiny.model, max_sequences=2)
    real_step, calls = batch.step, []

    def step_failing_once(seqs, tokens):
        calls.append(len(seqs))
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return real_step(seqs, tokens)

    batch.step = step_failing_once
    scheduler = StepScheduler(batch, tiny.tokenizer.decode).start()
    try:
        (failed,) = run_all(scheduler, [([65, 66], GenerationParams(max_tokens=3))])
        (after,) = run_all(scheduler, [([65, 66], GenerationParams(max_tokens=3))])
    finally:
        scheduler.stop()
    assert failed.finish == "error" and "device lost" in failed.error
    assert after.finish == LENGTH and after.ids == generate(TorchDecoder(tiny.model), [65, 66], 3).new_ids


def test_bad_requests_are_refused_before_queueing(tiny):
    scheduler = StepScheduler(ort_batch(tiny)[0], tiny.tokenizer.decode)
    with pytest.raises(UsageError, match="empty"):
        scheduler.submit(Sequence([], GenerationParams(), Collector()))
    with pytest.raises(UsageError, match="256"):
        scheduler.submit(Sequence([65] * 256, GenerationParams(), Collector()))
    assert scheduler.waiting.empty()
    for bad, match in (
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"stop": ("",)}, "stop"),
    ):
        with pytest.raises(UsageError, match=match):
            GenerationParams(**bad)


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = rng.normal(size=40).astype(np.float32) * 3
        temperature, top_p = float(rng.uniform(0.3, 2.0)), float(rng.uniform(0.05, 0.99))
        kept = np.isfinite(nucleus(logits, temperature, top_p))
        # Independent: sort probabilities, take tokens until their sum first reaches top_p.
        probs = np.exp(logits / temperature - (logits / temperature).max())
        probs /= probs.sum()
        order = np.argsort(-probs)
        need = np.flatnonzero(np.cumsum(probs[order]) >= top_p)[0] + 1
        assert set(np.flatnonzero(kept)) == set(order[:need].tolist())
    assert nucleus(logits, 1.0, 1.0) is logits


def test_sampling_follows_the_seed_and_greedy_is_argmax():
    logits = np.random.default_rng(1).normal(size=64).astype(np.float32)
    greedy = GenerationParams()
    assert next_token(logits, greedy, np.random.default_rng(0)) == int(np.argmax(logits))
    params = GenerationParams(temperature=0.8, top_k=10, seed=7)
    draws = [next_token(logits, params, np.random.default_rng(7)) for _ in range(3)]
    assert len(set(draws)) == 1
    # With top_p = 1 the draw is exactly lm.generate.pick's.
    assert draws[0] == pick(logits, Sampling(0.8, 10, 7), np.random.default_rng(7))
