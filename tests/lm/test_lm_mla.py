"""Multi-head latent attention (deamoe_trt.lm.mla) outside the import: the absorbed form
against attention over expanded keys and values, the latent cache through the checkpoint and
the config's JSON, and quantized FFNs on every runtime against the dequantized model."""

import math

import numpy as np
import pytest
import torch

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.config import ConfigError
from deamoe_trt.lm import DeaMoELM, LMConfig, load_lm, save_lm
from deamoe_trt.quant import QuantConfig
from deamoe_trt.quantize.lm import quantize_lm
from deamoe_trt.runtimes.cpu_kernel import CpuDecoder
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder
from lm_reference import dequantized_model, logits_of

MLA_SIZES = dict(num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)


def mla_config(q_lora_rank: int = 8) -> LMConfig:
    return QUANTIZABLE_MICRO_LM.replace(**MLA_SIZES, q_lora_rank=q_lora_rank, attention_multiplier=16**-0.5)


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def expanded_attention(attn, x, cos, sin):
    """Prefill attention over keys and values expanded from c_kv by kv_b_proj (transformers'
    form, no cache): the absorbed form must give the same output."""
    c = attn.config
    b, t, _ = x.shape
    q = attn.queries(x).view(b, t, c.num_heads, -1).transpose(1, 2)
    q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
    latent, k_pe = attn.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
    kv = attn.kv_b_proj(attn.kv_a_layernorm(latent)).view(b, t, c.num_heads, -1).transpose(1, 2)
    k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
    from deamoe_trt.lm.attention import apply_rope

    q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe.view(b, 1, t, -1), cos, sin)
    k = torch.cat((k_nope, k_pe.expand(-1, c.num_heads, -1, -1)), dim=-1)
    scores = torch.cat((q_nope, q_pe), dim=-1) @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -torch.inf)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, -1)
    return attn.o_proj(out)


@pytest.mark.parametrize("q_lora_rank", [0, 8])
def test_absorbed_attention_equals_attention_over_expanded_keys_and_values(q_lora_rank):
    model = DeaMoELM.random(mla_config(q_lora_rank), seed=2).eval()
    attn = model.layers[0].self_attn
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, (latent, k_pe) = attn(x, model.rope_cos[:9], model.rope_sin[:9], None)
        want = expanded_attention(attn, x, model.rope_cos[:9], model.rope_sin[:9])
    assert (latent.shape, k_pe.shape) == ((2, 1, 9, 16), (2, 1, 9, 8))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_mla_config_and_checkpoint_round_trip_and_old_configs_stay_as_they_were(tmp_path):
    model = DeaMoELM.random(mla_config(), seed=2)
    loaded = load_lm(save_lm(model, tmp_path / "mla")).model
    assert loaded.config == model.config and loaded.config.head_dim == 8
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert model.config.to_dict()["kv_lora_rank"] == 16 and "embedding_multiplier" not in model.config.to_dict()
    assert not {"kv_lora_rank", "attention_multiplier", "logits_scaling"} & QUANTIZABLE_MICRO_LM.to_dict().keys()
    assert model.config.kv_cache_values_per_token() == 3 * (16 + 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(num_key_value_heads=2), r"with MLA num_key_value_heads \(2\) must equal num_heads \(4\)"),
        (dict(qk_norm="head"), r"qk_norm is not supported with multi-head latent attention"),
        (dict(v_head_dim=0), r"multi-head latent attention needs v_head_dim >= 1"),
        (dict(kv_lora_rank=0), r"q_lora_rank is set but kv_lora_rank is 0"),
        (dict(residual_multiplier=0.0), r"residual_multiplier must be > 0"),
    ],
)
def test_inconsistent_mla_and_scaling_fields_are_config_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        LMConfig.from_dict({**mla_config().to_dict(), **change})


@pytest.fixture(scope="module", params=[4, 8], ids=["int4", "int8"])
def quantized_mla(request):
    return quantize_lm(DeaMoELM.random(mla_config(), seed=5).eval(), QuantConfig(request.param, 16))


@pytest.mark.parametrize("form", ["ort", "onnx", "plugin", "cpu"])
def test_quantized_mla_model_on_every_runtime_matches_the_dequantized_model(quantized_mla, form):
    want = logits_of(TorchDecoder(dequantized_model(quantized_mla)))
    if form == "cpu":
        got = logits_of(CpuDecoder(quantized_mla, threads=1))
    else:
        got = logits_of(OrtDecoder.from_model(quantized_mla, form=form, threads=1))
    scale = np.abs(want).max()
    if form == "ort" and quantized_mla.config.quantization.bits == 8:
        # ONNX Runtime's CPU QMoE runs int8 blocks with int8 activations (docs/quantization.md)
        assert np.abs(got - want).max() / scale < 5e-2
    else:
        np.testing.assert_allclose(got, want, atol=1e-5 * scale, rtol=1e-4)


def test_export_lm_validates_an_mla_model_and_tensorrt_profiles_size_the_latent_cache(tmp_path, capsys):
    from deamoe_trt.cli.main import main
    from deamoe_trt.trt.lm_engine import DECODE, PREFILL, lm_profiles

    checkpoint = save_lm(DeaMoELM.random(mla_config(0), seed=4), tmp_path / "mla")
    assert main(["export-lm", str(checkpoint), "-o", str(tmp_path / "onnx" / "m.onnx"), "--validate"]) == 0, (
        capsys.readouterr().err
    )
    profiles = lm_profiles(mla_config())
    assert profiles[PREFILL]["past_key_values.1.key"] == ((1, 1, 0, 16),) * 3  # c_kv: kv_lora_rank
    assert profiles[DECODE]["past_key_values.1.value"] == ((1, 1, 1, 8), (1, 1, 24, 8), (1, 1, 47, 8))  # k_pe
