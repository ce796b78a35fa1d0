import numpy as np
import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.runtimes.decode import Sampling, generate, pick, timing_table
from deamoe_trt.runtimes.torch import TorchDecoder


def test_greedy_generation_is_deterministic_and_timed(micro_model):
    a = generate(TorchDecoder(micro_model), [65, 66, 67], 10)
    b = generate(TorchDecoder(micro_model), [65, 66, 67], 10)
    assert a.new_ids == b.new_ids
    assert len(a.new_ids) == 10 and len(a.step_s) == 9
    assert a.tpot_s > 0 and a.stopped == "max_new_tokens"
    table = timing_table([a])
    assert "TPOT ms" in table and "torch" in table


def test_twins_decode_the_same_greedy_tokens(micro_model):
    prompt = list(b"Anne")
    ref = generate(TorchDecoder(micro_model), prompt, 12).new_ids
    assert generate(TorchDecoder(micro_model.expanded()), prompt, 12).new_ids == ref


@pytest.mark.slow
def test_sampling_is_reproducible_with_a_seed(micro_model):
    s = Sampling(temperature=1.0, top_k=5, seed=7)
    a = generate(TorchDecoder(micro_model), [65], 15, sampling=s).new_ids
    assert a == generate(TorchDecoder(micro_model), [65], 15, sampling=s).new_ids


def test_pick_respects_top_k():
    logits = np.array([0.0, 5.0, 4.0, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert pick(logits, Sampling(), rng) == 1
    picks = {pick(logits, Sampling(temperature=2.0, top_k=2), rng) for _ in range(50)}
    assert picks == {1, 2}


def test_generation_stops_when_the_context_is_full(micro_model):
    n = micro_model.config.max_position_embeddings
    result = generate(TorchDecoder(micro_model), [65] * (n - 3), 10)
    assert len(result.new_ids) == 3 and result.stopped == "context"


def test_bad_prompts(micro_model):
    n = micro_model.config.max_position_embeddings
    with pytest.raises(UsageError, match="the prompt is empty"):
        generate(TorchDecoder(micro_model), [], 5)
    with pytest.raises(UsageError, match=f"the prompt is {n} tokens but the model's context"):
        generate(TorchDecoder(micro_model), [65] * n, 5)
    with pytest.raises(UsageError, match="temperature"):
        Sampling(temperature=-1)
