"""int4 and int8 DeaMoE models on vLLM's CPU engine.

float32 (the default FFN choice for quantized models, deamoe_trt.integrations.vllm.ffn_op):
each FFN runs on deamoe-trt's CPU kernel through the deamoe::cpu_ffn op from the checkpoint's
codes and scales, and greedy tokens equal the project's own decoder's on the same checkpoint
over 32 steps, int4 and int8 alike.

bfloat16 (the kernel's dtypes exclude it): int4 runs on vLLM's own quantized MoE method
(compressed-tensors WNA16, its AMX int4 kernel), whose greedy tokens follow the project's
decoder for 32 steps. That kernel quantizes the activations to int8 per token (W4A8 compute),
so at a near-tie of the two best logits (reference margin under NEAR_TIE) the choice may go
either way: the tokens must agree up to the first such step, and every prompt but a near-tie
one must agree over all 32. int8: vLLM's CPU engine has no W8A16 MoE method, and the directory
is refused in one line naming the platform and what it lacks."""

from __future__ import annotations

import copy

import pytest
import torch

from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.vllm.export import write_lm_dir
from deamoe_trt.integrations.vllm.ffn_op import ENV, ffn_kinds
from deamoe_trt.quant import QuantConfig
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

from .conftest import CPU_MEMORY_FRACTION, vllm_or_skip
from .test_compressed import quantized_tiny

vllm = vllm_or_skip()
pytestmark = pytest.mark.slow

STEPS = 32
# Logit gap (float32 reference) below which bfloat16 activations quantized to int8 may flip the pick.
NEAR_TIE = 0.25
PROMPTS = (
    "It was a truth ",
    "Anne",
    "The Musgroves had a great many ",
    "Sir Walter Elliot, of Kellynch Hall, ",
    "She had been forced into prudence in her youth",
)


def amx_or_skip():
    from vllm.platforms import current_platform

    if not (current_platform.is_cpu() and torch.cpu._is_amx_tile_supported()):
        pytest.skip("vLLM's CPU int4 MoE kernel needs an x86 CPU with AMX tiles")


def engine(directory, dtype: str = "bfloat16"):
    return vllm.LLM(
        str(directory),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=len(PROMPTS),
        gpu_memory_utilization=CPU_MEMORY_FRACTION,
        seed=0,
    )


def reference(model, wide, ids: list[int]) -> tuple[list[int], list[float]]:
    """The project's decoder's greedy tokens on the checkpoint (model), and at each step the gap
    between the two best logits of the same weights computed in float32 (wide)."""
    new = generate(TorchDecoder(model), ids, STEPS).new_ids
    with torch.no_grad():
        logits = wide(torch.tensor([ids + new])).logits[0, len(ids) - 1 : -1]
    top = logits.topk(2, dim=-1).values
    return new, (top[:, 0] - top[:, 1]).tolist()


def test_int4_greedy_tokens_follow_the_reference_decoder_for_32_steps(tmp_path):
    amx_or_skip()
    model, tokenizer = quantized_tiny(QuantConfig(4, 16), ())
    directory = write_lm_dir(model, tokenizer, tmp_path / "int4")
    llm = engine(directory)
    try:
        outputs = llm.generate(list(PROMPTS), vllm.SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    finally:
        llm.llm_engine.engine_core.shutdown()
    wide = copy.deepcopy(model).float()
    full = 0
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        got = list(output.outputs[0].token_ids)
        expected, margins = reference(model, wide, tokenizer.encode(prompt))
        first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), STEPS)
        assert first == STEPS or margins[first] < NEAR_TIE, (prompt, first, margins[first], got, expected)
        full += first == STEPS
    assert full >= len(PROMPTS) - 1


def test_int8_is_refused_on_the_cpu_engine_in_one_line(tmp_path):
    model, tokenizer = quantized_tiny(QuantConfig(8, 16), ())
    directory = write_lm_dir(model, tokenizer, tmp_path / "int8")
    with pytest.raises(UsageError) as info:
        engine(directory)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("vLLM's CPU engine has no int8 (W8A16) MoE method")


@pytest.mark.parametrize("bits", [4, 8])
def test_float32_int_weights_on_the_cpu_kernel_equal_the_reference_decoder_for_32_steps(tmp_path, monkeypatch, bits):
    monkeypatch.delenv(ENV, raising=False)  # the default choice
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function, on loopback
    model, tokenizer = quantized_tiny(QuantConfig(bits, 16), (), dtype=torch.float32)
    directory = write_lm_dir(model, tokenizer, tmp_path / f"int{bits}")
    llm = engine(directory, "float32")
    try:
        outputs = llm.generate(list(PROMPTS), vllm.SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
        ffns = llm.apply_model(ffn_kinds)[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert ffns == ["KernelFFN"] * model.config.num_layers
    got = [list(o.outputs[0].token_ids) for o in outputs]
    expected = [generate(TorchDecoder(model), tokenizer.encode(p), STEPS).new_ids for p in PROMPTS]
    assert got == expected
