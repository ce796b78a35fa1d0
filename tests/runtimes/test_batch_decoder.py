"""The batched-decoding interface (runtimes.base): SerialBatchDecoder, OneSequence, Slots."""

import numpy as np
import pytest

from deamoe_trt import runtimes
from deamoe_trt.errors import UsageError
from deamoe_trt.lm.checkpoint import load_lm
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.runtimes.base import OneSequence


@pytest.fixture(scope="module")
def model():
    return load_lm(TINY_LM).model


def test_serial_batch_of_different_lengths_equals_each_sequence_alone(model):
    rt = runtimes.get("torch")
    batch = rt.batch_decoder(model, max_sequences=3)
    prompts = [[5, 6, 7, 8], [9], [10, 11]]
    opened = [batch.open(p) for p in prompts]
    tokens = [3, 4, 5]
    rows = batch.step([s for s, _ in opened][::-1], tokens[::-1])
    for (seq, first), prompt, token, row in zip(opened, prompts, tokens, rows[::-1], strict=True):
        alone = rt.decoder(model)
        np.testing.assert_array_equal(first, alone.prefill(prompt))
        np.testing.assert_array_equal(row, alone.step(token))
        assert batch.length(seq) == len(prompt) + 1


def test_a_closed_slot_is_reused_and_the_others_go_on(model):
    rt = runtimes.get("torch")
    batch = rt.batch_decoder(model, max_sequences=2)
    a, _ = batch.open([1, 2])
    b, _ = batch.open([3])
    batch.close(a)
    c, _ = batch.open([4, 5, 6])
    assert c == a
    alone = rt.decoder(model)
    alone.prefill([3])
    np.testing.assert_array_equal(batch.step([b, c], [7, 8])[0], alone.step(7))


def test_one_sequence_is_the_single_decoder(model):
    rt = runtimes.get("torch")
    one, alone = OneSequence(rt.batch_decoder(model, max_sequences=1)), rt.decoder(model)
    np.testing.assert_array_equal(one.prefill([1, 2, 3]), alone.prefill([1, 2, 3]))
    np.testing.assert_array_equal(one.step(4), alone.step(4))


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda b, s: b.step([], []), "the batch is empty"),
        (lambda b, s: b.step([s, s], [1, 2]), "more than once"),
        (lambda b, s: b.step([s], [1, 2]), "1 sequences but 2 tokens"),
        (lambda b, s: b.step([s + 1], [1]), "not open"),
        (lambda b, s: b.open([]), "prompt is empty"),
        (lambda b, s: (b.open([1]), b.open([1])), "close one before opening another"),
        (lambda b, s: b.open(list(range(b.max_context))), "needs room for at least one new token"),
    ],
)
def test_bad_batches_are_refused_in_one_line(model, action, message):
    batch = runtimes.get("torch").batch_decoder(model, max_sequences=2)
    seq, _ = batch.open([1])
    with pytest.raises(UsageError, match=message) as err:
        action(batch, seq)
    assert "\n" not in str(err.value)


def test_a_sequence_past_its_context_is_refused(model):
    batch = runtimes.get("torch").batch_decoder(model, max_sequences=1)
    seq, _ = batch.open(list(range(batch.max_context - 1)))
    batch.step([seq], [1])
    with pytest.raises(UsageError, match="filled its context"):
        batch.step([seq], [1])


@pytest.mark.parametrize("size", [0, -1, 10_000, 2.5, True])
def test_max_sequences_out_of_range_is_refused(model, size):
    with pytest.raises(UsageError, match="max_sequences must be an integer"):
        runtimes.get("torch").batch_decoder(model, max_sequences=size)
