"""The DeaMoE FFN as the deamoe::cpu_ffn custom op: the op gives the CPU kernel's output for the
registered layer, and a vLLM engine whose FFNs run it (DEAMOE_VLLM_FFN=cpu-kernel) decodes the
tiny LM token for token as the reference decoder does."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.integrations.vllm.export import write_model_dir
from deamoe_trt.integrations.vllm.ffn_op import (
    DEFAULT_FFN,
    ENV,
    QUANTIZED_DEFAULT_FFN,
    cpu_ffn,
    ffn_choice,
    ffn_kinds,
    register_layer,
)
from deamoe_trt.lm import load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

from .conftest import CPU_MEMORY_FRACTION, TINY_LM


def test_the_custom_op_runs_the_registered_layer_on_the_cpu_kernel():
    from deamoe_trt.cpu import CpuDeaMoE

    layer = load_lm(TINY_LM).model.layers[1].mlp
    x = torch.randn(7, layer.config.hidden_size, generator=torch.Generator().manual_seed(3))
    handle = register_layer(CpuDeaMoE(layer))
    y = torch.ops.deamoe.cpu_ffn(x, handle)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, layer(x), rtol=1e-4, atol=1e-5)
    assert cpu_ffn is not None


def test_the_kernel_is_chosen_only_where_it_runs(monkeypatch):
    monkeypatch.setenv(ENV, "cpu-kernel")
    assert ffn_choice(cpu=True, dtype=torch.float32, quantized=False) == "cpu-kernel"
    assert ffn_choice(cpu=True, dtype=torch.bfloat16, quantized=False) == "fusedmoe"
    assert ffn_choice(cpu=True, dtype=torch.float16, quantized=True) == "cpu-kernel"
    assert ffn_choice(cpu=True, dtype=torch.bfloat16, quantized=True) == "fusedmoe"
    assert ffn_choice(cpu=False, dtype=torch.float16, quantized=False) == "fusedmoe"
    monkeypatch.setenv(ENV, "fusedmoe")
    assert ffn_choice(cpu=True, dtype=torch.float32, quantized=True) == "fusedmoe"
    monkeypatch.delenv(ENV)
    assert ffn_choice(cpu=True, dtype=torch.float32, quantized=False) == DEFAULT_FFN
    assert ffn_choice(cpu=True, dtype=torch.float32, quantized=True) == QUANTIZED_DEFAULT_FFN


@pytest.mark.slow
def test_vllm_with_the_custom_op_ffns_equals_the_reference_decoder(tmp_path, monkeypatch):
    from .conftest import vllm_or_skip

    vllm = vllm_or_skip()
    monkeypatch.setenv(ENV, "cpu-kernel")  # the engine's processes inherit it
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function, on loopback
    loaded = load_lm(TINY_LM)
    directory = write_model_dir(TINY_LM, tmp_path / "tiny-lm")
    prompts, budgets = ["It was a truth ", "Anne", "Sir Walter Elliot, of Kellynch Hall, "], [24, 16, 20]
    llm = vllm.LLM(
        str(directory),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=3,
        gpu_memory_utilization=CPU_MEMORY_FRACTION,
        seed=0,
    )
    try:
        params = [vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in budgets]
        outputs = llm.generate(prompts, params)
        ffns = llm.apply_model(ffn_kinds)[0]  # in the engine's own model
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert ffns == ["KernelFFN"] * 3  # the engine ran the op, not FusedMoE
    got = [list(o.outputs[0].token_ids) for o in outputs]
    expected = [
        generate(TorchDecoder(loaded.model), loaded.tokenizer.encode(p), n).new_ids
        for p, n in zip(prompts, budgets, strict=True)
    ]
    assert got == expected
