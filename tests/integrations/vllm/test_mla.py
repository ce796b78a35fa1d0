"""DeaMoE models with DeepSeek-V2's multi-head latent attention on vLLM's CPU engine: vLLM's MLA
layer and latent cache (picked because the directory's config says MLA, not by model type),
deamoe-trt's projections, latent norms and rotary around it. Greedy tokens equal the reference
decoder's in float32 over 32 steps on vLLM's reference CPU MLA backend; latent sizes vLLM's CPU
kernels lack, and a dtype its AMX MLA backend lacks, are refused in one line naming both."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.vllm.export import write_lm_dir
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.lm.tokenizer import ByteTokenizer
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

from .conftest import CPU_MEMORY_FRACTION, TINY_LM, vllm_or_skip

vllm = vllm_or_skip()

STEPS = 32
# vLLM's CPU MLA kernels cache kv_lora_rank 512 + qk_rope_head_dim 64 values per token (checked
# against vLLM's own backends below); everything else is tiny.
LATENT, ROPE = 512, 64


def deepseek_v2_style_model(kv_lora_rank: int = LATENT, qk_rope_head_dim: int = ROPE, nope: int = 16) -> DeaMoELM:
    """The tiny LM's sizes with DeepSeek-V2's attention (low-rank queries, a latent KV), a dense
    first block and a shared expert; norms moved off 1 so a misplaced one shows."""
    base = load_lm(TINY_LM).model.config
    config = base.replace(
        num_key_value_heads=base.num_heads,
        head_dim=0,
        kv_lora_rank=kv_lora_rank,
        q_lora_rank=32,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=qk_rope_head_dim,
        v_head_dim=nope,
        attention_multiplier=(nope + qk_rope_head_dim) ** -0.5,
        dense_layers=(0,),
        dense_intermediate_size=96,
        moe=base.moe.replace(shared_expert_intermediate_size=32),
    )
    model = DeaMoELM.random(config, seed=31)
    gen = torch.Generator().manual_seed(32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
    return model


def engine(directory, **kwargs):
    return vllm.LLM(
        str(directory),
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        max_num_seqs=3,
        gpu_memory_utilization=CPU_MEMORY_FRACTION,
        seed=0,
        **kwargs,
    )


def test_the_cpu_mla_backends_cache_the_sizes_the_served_model_has():
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLABackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    for backend in (CPUMLABackend, AMXMLABackend):
        assert backend.get_supported_head_sizes() == [LATENT + ROPE]


@pytest.mark.slow
def test_deepseek_v2_style_deamoe_equals_the_reference_decoder_for_32_steps(tmp_path):
    model = deepseek_v2_style_model()
    directory = write_lm_dir(model, ByteTokenizer(), tmp_path / "deepseek-v2-style")
    gen = torch.Generator().manual_seed(33)
    prompt_ids = [torch.randint(32, 127, (n,), generator=gen).tolist() for n in (11, 3, 19)]
    expected = [generate(TorchDecoder(model), ids, STEPS).new_ids for ids in prompt_ids]
    llm = engine(directory, attention_backend="CPU_MLA")
    try:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
        outputs = llm.generate([vllm.TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params)
        model_config = llm.llm_engine.model_config
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert model_config.use_mla and model_config.get_head_size() == LATENT + ROPE
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected


def test_a_latent_size_the_cpu_mla_kernels_lack_is_refused_in_one_line(tmp_path):
    model = deepseek_v2_style_model(kv_lora_rank=16, qk_rope_head_dim=8)
    directory = write_lm_dir(model, ByteTokenizer(), tmp_path / "m")
    with pytest.raises(UsageError) as info:
        engine(directory)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("vLLM's CPU MLA attention caches 576 latent values per token")
    assert "this model's 16 + 8" in message


@pytest.mark.slow
def test_float32_on_the_amx_mla_backend_is_refused_in_one_line(tmp_path, capfd):
    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("vLLM picks its AMX MLA backend only on CPUs with AMX tiles")
    directory = write_lm_dir(deepseek_v2_style_model(), ByteTokenizer(), tmp_path / "m")
    with pytest.raises(RuntimeError):  # raised in the engine's process, which logs it
        engine(directory)
    captured = capfd.readouterr()
    log = captured.out + captured.err  # vLLM's processes log to either
    assert "vLLM's AMX_MLA MLA backend runs bfloat16 only, not float32; serve with --attention-backend CPU_MLA" in log
