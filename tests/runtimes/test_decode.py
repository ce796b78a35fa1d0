import numpy as np
import pytest

from deamoe_trt.errors import UsageError
from deamoe_trt.runtimes.decode import Sampling, batch_table, generate, generate_batch, pick, timing_table
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


@pytest.mark.parametrize("runtime", ["torch", "cpu"])
def test_a_continuous_batch_gives_each_prompt_what_it_gets_alone(micro_model, runtime):
    from deamoe_trt import runtimes

    rt = runtimes.get(runtime)
    if rt.available() is not None:
        pytest.skip(rt.available())
    n = micro_model.config.max_position_embeddings
    # Four prompts through two slots: the third and fourth join as the first two leave; the
    # last one stops where its context fills up.
    prompts = [list(b"Anne"), [70], list(b"a longer prompt"), [66] * (n - 4)]
    sampling = Sampling(temperature=0.8, top_k=8, seed=5)
    batch = rt.batch_decoder(micro_model, max_sequences=2, threads=1)
    seen: list[tuple[int, int]] = []
    run = generate_batch(batch, prompts, 9, sampling=sampling, on_token=lambda i, t: seen.append((i, t)))
    assert max(run.step_sizes) == 2 and min(run.step_sizes) >= 1
    for i, (prompt, result) in enumerate(zip(prompts, run.results, strict=True)):
        alone = generate(rt.decoder(micro_model, threads=1), prompt, 9, sampling=sampling)
        assert result.prompt_ids == prompt
        assert result.new_ids == alone.new_ids
        assert result.stopped == alone.stopped
        assert [t for j, t in seen if j == i] == result.new_ids
        assert len(result.step_s) == len(result.new_ids) - 1
    assert run.results[3].stopped == "context" and len(run.results[3].new_ids) == 4
    assert run.new_tokens == 9 * 3 + 4 and run.tokens_per_s > 0
    assert "aggregate" in batch_table(run)


def test_a_batch_with_nothing_to_do_or_too_many_at_once_is_refused(micro_model):
    from deamoe_trt import runtimes

    batch = runtimes.get("torch").batch_decoder(micro_model, max_sequences=2)
    with pytest.raises(UsageError, match="no prompts to decode"):
        generate_batch(batch, [], 5)
    with pytest.raises(UsageError, match="max_sequences must be from 1 to the batch decoder's 2, got 3"):
        generate_batch(batch, [[65]], 5, max_sequences=3)
    with pytest.raises(UsageError, match="the prompt is empty"):
        generate_batch(batch, [[65], []], 5)
