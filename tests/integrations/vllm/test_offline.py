"""vLLM's offline engine (`vllm.LLM`) on DeaMoE model directories: greedy generations equal
deamoe-trt's reference decoder token for token in float32, for the tiny LM, the converted LM
and an imported Qwen3-MoE, with vLLM's continuous batching interleaving unequal prompts.

One engine per model (module-scoped), each about 25 s to start on 2 cores."""

from __future__ import annotations

import pytest

from deamoe_trt.integrations.vllm.export import write_model_dir
from deamoe_trt.lm import load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

from .conftest import CONVERTED_LM, CPU_MEMORY_FRACTION, TINY_LM, vllm_or_skip

vllm = vllm_or_skip()
pytestmark = pytest.mark.slow

# Unequal prompt lengths and budgets, more requests than the engine runs at once: sequences
# finish at different steps and waiting ones join the running batch (continuous batching).
TEXT_PROMPTS = (
    ("It was a truth ", 24),
    ("Anne", 7),
    ("The Musgroves had a great many ", 16),
    ("Sir Walter Elliot, of Kellynch Hall, ", 30),
    ("C", 5),
    ("She had been forced into prudence in her youth", 12),
)
MAX_RUNNING = 3


def start_engine(directory, **kwargs):
    return vllm.LLM(
        str(directory),
        dtype="float32",
        enforce_eager=True,
        max_model_len=kwargs.pop("max_model_len", 128),
        max_num_seqs=MAX_RUNNING,
        gpu_memory_utilization=CPU_MEMORY_FRACTION,
        seed=0,
        **kwargs,
    )


def stop_engine(llm) -> None:
    llm.llm_engine.engine_core.shutdown()


def reference(checkpoint, prompt_ids: list[list[int]], budgets: list[int]) -> list[list[int]]:
    """`deamoe-trt generate`'s greedy decoding, one prompt at a time."""
    model = load_lm(checkpoint).model
    return [generate(TorchDecoder(model), ids, n).new_ids for ids, n in zip(prompt_ids, budgets, strict=True)]


def greedy(budget: int):
    return vllm.SamplingParams(temperature=0.0, max_tokens=budget, ignore_eos=True)


@pytest.fixture(scope="module", params=["tiny-lm", "tiny-lm-converted"])
def byte_model(request, tmp_path_factory):
    checkpoint = {"tiny-lm": TINY_LM, "tiny-lm-converted": CONVERTED_LM}[request.param]
    directory = write_model_dir(checkpoint, tmp_path_factory.mktemp("vllm") / request.param)
    llm = start_engine(directory)
    yield checkpoint, llm
    stop_engine(llm)


def test_greedy_generations_equal_the_reference_decoder_under_continuous_batching(byte_model):
    checkpoint, llm = byte_model
    tokenizer = load_lm(checkpoint).tokenizer
    texts, budgets = zip(*TEXT_PROMPTS, strict=True)
    outputs = llm.generate(list(texts), [greedy(n) for n in budgets])
    prompt_ids = [tokenizer.encode(t) for t in texts]
    # vLLM's tokenizer (the directory's tokenizer.json) gives the byte tokenizer's ids.
    assert [list(o.prompt_token_ids) for o in outputs] == prompt_ids
    got = [list(o.outputs[0].token_ids) for o in outputs]
    assert got == reference(checkpoint, prompt_ids, list(budgets))
    assert [o.outputs[0].text for o in outputs] == [tokenizer.decode(ids) for ids in got]


@pytest.fixture(scope="module")
def qwen3_moe_engine(qwen3_moe_checkpoint, tmp_path_factory):
    directory = write_model_dir(qwen3_moe_checkpoint, tmp_path_factory.mktemp("vllm") / "qwen3-moe")
    llm = start_engine(directory)
    yield llm
    stop_engine(llm)


def test_imported_qwen3_moe_equals_the_reference_decoder(qwen3_moe_checkpoint, qwen3_moe_engine):
    import torch

    gen = torch.Generator().manual_seed(11)
    # Longer than the 8-token sliding window, so the window decides what each block sees.
    lengths, budgets = [12, 3, 20, 9], [20, 24, 10, 16]
    prompt_ids = [torch.randint(4, 96, (n,), generator=gen).tolist() for n in lengths]
    prompts = [vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
    outputs = qwen3_moe_engine.generate(prompts, [greedy(n) for n in budgets])
    got = [list(o.outputs[0].token_ids) for o in outputs]
    assert got == reference(qwen3_moe_checkpoint, prompt_ids, budgets)


def every_feature_model():
    """The tiny LM's sizes with every option the imports bring turned on at once (Qwen2-MoE's
    gated shared expert and q/k/v biases, OLMoE's full-width q/k norms and clipping, Granite's
    multipliers, a dense block, linear rotary scaling, one sliding block, sigmoid
    scores with selection and logit router biases), random weights with every norm and bias
    moved off its initial value so a missing one shows."""
    import torch

    from deamoe_trt.lm import DeaMoELM

    base = load_lm(TINY_LM).model.config
    config = base.replace(
        num_layers=3,
        qkv_bias=True,
        o_bias=True,
        qk_norm="full",
        clip_qkv=0.8,
        dense_layers=(1,),
        dense_intermediate_size=64,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        sliding_window=6,
        sliding_window_layers=(2,),
        embedding_multiplier=1.5,
        residual_multiplier=0.7,
        attention_multiplier=0.2,
        logits_scaling=1.3,
        moe=base.moe.replace(
            score_func="sigmoid",
            department_score="sum_top2",
            router_bias=True,
            router_logit_bias=True,
            routed_scaling_factor=1.5,
            shared_expert_intermediate_size=64,
            shared_expert_gate=True,
        ),
    )
    model = DeaMoELM.random(config, seed=5)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias") and "self_attn" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    return model


def test_every_served_option_at_once_equals_the_reference_decoder(tmp_path_factory):
    import torch

    from deamoe_trt.integrations.vllm.export import write_lm_dir
    from deamoe_trt.lm.tokenizer import ByteTokenizer

    model = every_feature_model()
    directory = write_lm_dir(model, ByteTokenizer(), tmp_path_factory.mktemp("vllm") / "every-feature")
    gen = torch.Generator().manual_seed(12)
    lengths, budgets = [10, 4, 17], [14, 20, 9]
    prompt_ids = [torch.randint(32, 127, (n,), generator=gen).tolist() for n in lengths]
    llm = start_engine(directory)
    try:
        outputs = llm.generate(
            [vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], [greedy(n) for n in budgets]
        )
    finally:
        stop_engine(llm)
    got = [list(o.outputs[0].token_ids) for o in outputs]
    assert got == [generate(TorchDecoder(model), ids, n).new_ids for ids, n in zip(prompt_ids, budgets, strict=True)]
