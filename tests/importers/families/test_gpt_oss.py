"""A tiny random gpt-oss built with transformers (both layer types, sinks, biases everywhere,
a SwiGLU limit that clamps) imports to a DeaMoE language model that decodes as transformers
does: fp32 logits within 1e-5 relative and the same 32 greedy tokens as `generate`, in
PyTorch, on the CPU kernel and after export-lm on ONNX Runtime in each form; with float
experts and with MXFP4 experts."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from deamoe_trt.errors import UsageError
from deamoe_trt.importers.hf_lm import import_hf_lm
from deamoe_trt.lm import load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder

from ..hf_lm_models import prompt_ids
from .gpt_oss_models import LIMIT, build_gpt_oss

NEW_TOKENS = 32


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["float", "mxfp4"])
def imported(request, tmp_path_factory):
    """(HF model, loaded lm checkpoint, transformers' 32 greedy tokens)."""
    root = tmp_path_factory.mktemp(f"gpt_oss_{request.param}")
    hf = build_gpt_oss(root / "hf", mxfp4=request.param == "mxfp4")
    import_hf_lm(root / "hf", root / "lm")
    prompt = torch.tensor([prompt_ids()])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return hf, load_lm(root / "lm"), expected[0, prompt.shape[1] :].tolist()


def test_logits_match_transformers_at_once_and_through_the_windowed_cache(imported):
    hf, loaded, _ = imported
    ids = torch.tensor([prompt_ids(48, seed=2), prompt_ids(48, seed=3)])
    with torch.no_grad():
        want = hf(ids).logits
        got = loaded.model(ids).logits
        out = loaded.model(ids[:, :40])
        cache, steps = out.past_key_values, []
        for t in range(40, 48):
            out = loaded.model(ids[:, t : t + 1], cache)
            cache = out.past_key_values
            steps.append(out.logits)
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 1e-5
    assert (torch.cat(steps, dim=1) - want[:, 40:]).abs().max() / scale < 1e-5
    assert [kv[0].shape[2] for kv in cache] == [3, 48, 3]  # sliding blocks keep window - 1 keys


def test_the_clamp_acts_on_the_test_inputs(imported):
    hf, _, _ = imported
    seen = []
    experts = hf.model.layers[1].mlp.experts
    apply_gate = experts._apply_gate

    def record(gate_up):
        seen.append(gate_up.detach())
        return apply_gate(gate_up)

    experts._apply_gate = record
    try:
        with torch.no_grad():
            hf(torch.tensor([prompt_ids(48, seed=2)]))
    finally:
        del experts._apply_gate
    gate_up = torch.cat([g.reshape(-1) for g in seen])
    assert (gate_up.abs() > LIMIT).float().mean() > 0.2


def test_the_import_keeps_gpt_oss_architecture(imported):
    hf, loaded, _ = imported
    c = loaded.model.config
    assert c.attention_sinks and c.qkv_bias and c.o_bias
    assert [c.window(i) for i in range(3)] == [4, 0, 4] == [a.self_attn.sliding_window or 0 for a in hf.model.layers]
    assert c.moe.ffn_bias and c.moe.router_logit_bias and c.moe.activation == "swiglu_clamped"
    assert (c.moe.swiglu_alpha, c.moe.swiglu_limit) == (1.702, LIMIT)
    assert (c.moe.num_departments, c.moe.shared_intermediate_size) == (1, 0)
    layer, mlp = hf.model.layers[0].mlp, loaded.model.layers[0].mlp
    f = c.moe.private_intermediate_size
    # gate columns (even) first, then up columns (odd), as rows
    assert torch.equal(mlp.experts.gate_up[:, :f], layer.experts.gate_up_proj[..., 0::2].transpose(1, 2))
    assert torch.equal(mlp.experts.gate_up[:, f:], layer.experts.gate_up_proj[..., 1::2].transpose(1, 2))
    assert torch.equal(mlp.router.logit_bias, layer.router.bias)


def test_greedy_generation_equals_transformers_generate(imported):
    _, loaded, expected = imported
    assert generate(TorchDecoder(loaded.model), prompt_ids(), NEW_TOKENS).new_ids == expected


def test_greedy_generation_on_the_cpu_kernel_equals_transformers(imported):
    from deamoe_trt.runtimes.cpu_kernel import CpuDecoder

    _, loaded, expected = imported
    assert generate(CpuDecoder(loaded.model, threads=1), prompt_ids(), NEW_TOKENS).new_ids == expected


@pytest.mark.slow
@pytest.mark.parametrize("form", ["ort", "onnx", "plugin"])
def test_greedy_generation_on_onnx_runtime_equals_transformers(imported, form):
    _, loaded, expected = imported
    decoder = OrtDecoder.from_model(loaded.model, form=form, tokenizer=loaded.tokenizer)
    assert generate(decoder, prompt_ids(), NEW_TOKENS).new_ids == expected, form


def _config(tmp_path, **changes):
    from transformers import GptOssConfig

    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**GptOssConfig(num_hidden_layers=2).to_dict(), **changes}))
    return directory


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method 'bitsandbytes'"),
        ({"layer_types": ["sliding_attention", "chunked_attention"]}, "got 'chunked_attention'"),
        ({"layer_types": ["full_attention"]}, "got 1 entries"),
        ({"swiglu_limit": 0.0}, "swiglu_limit"),
    ],
)
def test_what_gpt_oss_cannot_be_is_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message) as error:
        import_hf_lm(_config(tmp_path, **changes), tmp_path / "out")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_import_hf_then_quantize_int8_and_int4_from_mxfp4_experts(tmp_path, capsys):
    from deamoe_trt.cli.main import main

    hf = build_gpt_oss(tmp_path / "hf", mxfp4=True)
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "lm")]) == 0
    float_model = load_lm(tmp_path / "lm").model
    ids = torch.tensor([prompt_ids(32, seed=4)])
    with torch.no_grad():
        want = hf(ids).logits
        errors = {}
        for bits in (8, 4):
            out = tmp_path / f"int{bits}"
            assert (
                main(["quantize", str(tmp_path / "lm"), "-o", str(out), "--bits", str(bits), "--group-size", "32"]) == 0
            )
            model = load_lm(out).model
            mlp, source = model.layers[0].mlp, float_model.layers[0].mlp
            assert model.config.quantization.bits == bits
            assert torch.equal(mlp.experts.gate_up_bias, source.experts.gate_up_bias)  # biases stay float
            assert torch.equal(mlp.experts.down_bias, source.experts.down_bias)
            assert torch.equal(mlp.router.logit_bias, source.router.logit_bias)
            errors[bits] = float((model(ids).logits - want).abs().max() / want.abs().max())
    assert errors[8] < 0.02 and errors[8] < errors[4] < 0.3, errors  # measured: 0.4% and 15%
    capsys.readouterr()


def test_one_gpt_oss_block_imports_as_a_layer_with_transformers_outputs(tmp_path):
    from deamoe_trt.importers.hf import from_hf, from_hf_model

    hf = build_gpt_oss(tmp_path / "hf")
    block = hf.model.layers[1].mlp
    x = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, _ = block(x)
        got = from_hf(block)(x.reshape(16, 32)).reshape_as(want)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert len(from_hf_model(hf).layers) == 3


def test_layers_only_import_of_gpt_oss_writes_a_layer_checkpoint(tmp_path, capsys):
    from deamoe_trt.cli.main import main
    from deamoe_trt.layer import DeaMoEStack

    build_gpt_oss(tmp_path / "hf")
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "layers"), "--layers", "0,2"]) == 0
    stack = DeaMoEStack.from_pretrained(tmp_path / "layers")
    assert len(stack.layers) == 2 and stack.layers[0].config.activation == "swiglu_clamped"
    capsys.readouterr()


def test_a_checkpoint_that_disagrees_with_its_config_is_refused_before_writing(tmp_path):
    from safetensors.torch import load_file, save_file

    build_gpt_oss(tmp_path / "hf", mxfp4=True)
    weights = tmp_path / "hf" / "model.safetensors"
    state = load_file(weights)
    name = "model.layers.0.mlp.experts.down_proj_scales"
    state[name] = state[name].float()  # MXFP4 scales must stay uint8
    save_file(state, weights)
    with pytest.raises(UsageError, match=re.escape(f"{name} is F32; layers.0.mlp.experts.down reads it as U8")):
        import_hf_lm(tmp_path / "hf", tmp_path / "out")
    state[name] = state[name].to(torch.uint8)
    state["model.layers.0.mlp.experts.down_proj_bias"] = state["model.layers.0.mlp.experts.down_proj_bias"][
        :, :16
    ].clone()
    save_file(state, weights)
    with pytest.raises(
        UsageError, match=re.escape("down_proj_bias has shape [4, 16], but config.json implies [4, 32]")
    ):
        import_hf_lm(tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_bf16_block_picks_transformers_bf16_experts_wherever_the_choice_is_clear():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    from deamoe_trt.importers.hf import from_hf

    from .gpt_oss_models import gpt_oss_config

    config = gpt_oss_config()
    config.num_local_experts, config.num_experts_per_tok = 32, 4
    torch.manual_seed(0)
    block = GptOssMLP(config)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(0.1 * torch.randn_like(param))
    block = block.to(torch.bfloat16)
    x = torch.randn(4096, 32).to(torch.bfloat16)
    with torch.no_grad():
        logits, _, want = block.router(x)  # bf16 logits with the bf16 bias, as transformers routes
        got = from_hf(block).route(x).expert_ids.reshape(4096, -1)
    top = logits.float().topk(5, dim=-1).values
    clear = top[:, 3] - top[:, 4] > 1e-2
    same = (want.sort(-1).values == got.sort(-1).values).all(-1)
    assert clear.float().mean() > 0.8
    assert same[clear].all()
