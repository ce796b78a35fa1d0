"""DeaMoE models of the gpt-oss family on vLLM's CPU engine: attention sinks on vLLM's own
attention backend, alternating sliding windows, q/k/v and output biases, and the clamped SwiGLU
with biased experts on vLLM's FusedMoE (its swigluoai activation and expert biases), with
selection and logit router biases. Greedy tokens equal the reference decoder's in float32."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.integrations.vllm.export import write_lm_dir
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.lm.tokenizer import ByteTokenizer
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

from .conftest import CPU_MEMORY_FRACTION, TINY_LM, vllm_or_skip

vllm = vllm_or_skip()
pytestmark = pytest.mark.slow


def gpt_oss_style_model() -> DeaMoELM:
    """The tiny LM's sizes with gpt-oss's options, random weights with every bias, sink and
    norm moved off its initial value so a missing or misplaced one shows."""
    base = load_lm(TINY_LM).model.config
    config = base.replace(
        num_layers=4,
        qkv_bias=True,
        o_bias=True,
        attention_sinks=True,
        sliding_window=6,
        sliding_window_layers=(0, 2),
        moe=base.moe.replace(
            activation="swiglu_clamped", ffn_bias=True, router_bias=True, router_logit_bias=True, score_func="softmax"
        ),
    )
    model = DeaMoELM.random(config, seed=21)
    gen = torch.Generator().manual_seed(22)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith("bias") or name.endswith("sinks"):
                param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    return model


def served_tokens(directory, prompt_ids: list[list[int]], budgets: list[int]) -> list[list[int]]:
    llm = vllm.LLM(
        str(directory),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=len(prompt_ids),
        gpu_memory_utilization=CPU_MEMORY_FRACTION,
        seed=0,
    )
    try:
        params = [vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in budgets]
        outputs = llm.generate([vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_gpt_oss_style_deamoe_equals_the_reference_decoder(tmp_path):
    model = gpt_oss_style_model()
    clamped = model.config.moe
    assert clamped.ffn_bias and model.layers[0].mlp.experts.down_bias.abs().sum() > 0
    directory = write_lm_dir(model, ByteTokenizer(), tmp_path / "gpt-oss-style")
    gen = torch.Generator().manual_seed(23)
    # Longer than the 6-token window, so the sliding blocks and their sinks decide what is seen.
    lengths, budgets = [11, 3, 19], [20, 24, 12]
    prompt_ids = [torch.randint(32, 127, (n,), generator=gen).tolist() for n in lengths]
    expected = [generate(TorchDecoder(model), ids, n).new_ids for ids, n in zip(prompt_ids, budgets, strict=True)]
    assert served_tokens(directory, prompt_ids, budgets) == expected
