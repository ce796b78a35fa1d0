"""Granite MoE, ERNIE-4.5-MoE and DeepSeek-V2/V3 (MLA) imported as whole models decode
exactly as transformers does.

For each variant of hf_lm_families (every code path: Granite's scalings, shared experts,
dense blocks, each routing method, q LoRA on and off, interleaved and half rotary, YaRN with
mscale) the import must give fp32 logits within 1e-5 relative of transformers' forward
(prompt at once, and through the cache one token at a time) and the same 32 greedy tokens
as transformers' generate in PyTorch, with the FFNs on the CPU kernel, and (slow) on ONNX
Runtime after export-lm in each form.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from deamoe_trt.importers.hf_lm import import_hf_lm
from deamoe_trt.lm import load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder

from .hf_lm_families import MLA_VARIANTS, VARIANTS, build_family_model
from .hf_lm_models import prompt_ids

NEW_TOKENS = 32


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=VARIANTS)
def imported(request, tmp_path_factory):
    """(variant, HF model, loaded lm checkpoint, transformers' 32 greedy tokens)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = build_family_model(request.param, root / "hf")
    import_hf_lm(root / "hf", root / "lm")
    prompt = torch.tensor([prompt_ids()])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return request.param, hf, load_lm(root / "lm"), expected[0, prompt.shape[1] :].tolist()


def test_logits_match_transformers(imported):
    variant, hf, loaded, _ = imported
    ids = torch.tensor([prompt_ids(48, seed=2), prompt_ids(48, seed=3)])
    with torch.no_grad():
        want = hf(ids).logits
        got = loaded.model(ids).logits
        cache = loaded.model(ids[:, :40]).past_key_values
        steps = []
        for t in range(40, 48):
            out = loaded.model(ids[:, t : t + 1], cache)
            cache = out.past_key_values
            steps.append(out.logits)
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 1e-5, variant
    assert (torch.cat(steps, dim=1) - want[:, 40:]).abs().max() / scale < 1e-5, variant


def test_the_import_keeps_the_blocks_transformers_built(imported):
    variant, hf, loaded, _ = imported
    config = loaded.model.config
    for i, layer in enumerate(hf.model.layers):
        moe = getattr(layer, "block_sparse_moe", None) or layer.mlp
        assert config.is_dense(i) == (not hasattr(moe, "experts")), (variant, i)
    assert config.tie_word_embeddings == (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr())


def test_greedy_generation_equals_transformers_generate(imported):
    variant, _, loaded, expected = imported
    assert generate(TorchDecoder(loaded.model), prompt_ids(), NEW_TOKENS).new_ids == expected, variant


def test_greedy_generation_on_the_cpu_kernel_equals_transformers(imported):
    from deamoe_trt.runtimes.cpu_kernel import CpuDecoder

    variant, _, loaded, expected = imported
    result = generate(CpuDecoder(loaded.model, threads=1), prompt_ids(), NEW_TOKENS)
    assert result.new_ids == expected, variant


@pytest.mark.slow
@pytest.mark.parametrize("form", ["ort", "onnx", "plugin"])
def test_greedy_generation_on_onnx_runtime_equals_transformers(imported, form):
    variant, _, loaded, expected = imported
    decoder = OrtDecoder.from_model(loaded.model, form=form, tokenizer=loaded.tokenizer)
    assert generate(decoder, prompt_ids(), NEW_TOKENS).new_ids == expected, (variant, form)


@pytest.mark.parametrize("variant", MLA_VARIANTS)
def test_the_mla_cache_holds_the_latent_and_the_rotary_key_per_token(variant, tmp_path):
    build_family_model(variant, tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "lm")
    model = load_lm(tmp_path / "lm").model
    c = model.config
    with torch.no_grad():
        cache = model(torch.tensor([prompt_ids(5)])).past_key_values
    assert len(cache) == c.num_layers
    for latent, rotary in cache:
        assert tuple(latent.shape) == (1, 1, 5, 16)  # kv_lora_rank of hf_lm_families.MLA
        assert tuple(rotary.shape) == (1, 1, 5, 8)  # qk_rope_head_dim
    assert c.kv_cache_values_per_token() == 3 * (16 + 8)


REFUSALS = [
    ("ernie4_5_moe", {"use_bias": True}, r"use_bias = True is not supported"),
    ("ernie4_5_moe", {"moe_norm_min": 0.01}, r"moe_norm_min = 0\.01 is not supported"),
    ("granitemoe", {"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
    ("deepseek_v2_greedy", {"norm_topk_prob": True}, r"norm_topk_prob = True is not supported"),
    ("deepseek_v2_greedy", {"topk_method": "noaux_tc"}, r"topk_method = 'noaux_tc' is not supported"),
    ("deepseek_v2_greedy", {"moe_layer_freq": 2}, r"moe_layer_freq = 2 is not supported"),
    ("deepseek_v3", {"scoring_func": "softmax"}, r"scoring_func = 'softmax' is not supported"),
    ("deepseek_v3", {"num_key_value_heads": 2}, r"num_key_value_heads = 2 is not supported"),
    ("deepseek_v3", {"attention_bias": True}, r"attention_bias = True is not supported"),
    ("deepseek_v2_groups", {"mlp_bias": True}, r"mlp_bias = True is not supported"),
    ("deepseek_v3", {"n_group": 3}, r"n_group = 3 is not supported; 8 experts must split"),
]


@pytest.mark.parametrize(("variant", "change", "message"), REFUSALS)
def test_variants_without_an_exact_equivalent_are_refused_in_one_line_naming_the_field(
    variant, change, message, tmp_path, capsys
):
    import json
    import re

    from deamoe_trt.cli.main import main

    from .hf_lm_families import hf_config

    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**json.loads(hf_config(variant).to_json_string()), **change}))
    (src / "model.safetensors").write_text("never opened")
    capsys.readouterr()
    code = main(["import-hf", str(src), "-o", str(tmp_path / "lm")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and re.search(message, err), err
    assert not (tmp_path / "lm").exists()


def test_info_counts_the_latent_cache_bytes_per_token(tmp_path, capsys):
    import re

    from deamoe_trt.cli.main import main

    build_family_model("deepseek_v3", tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "lm")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "lm")]) == 0
    out = capsys.readouterr().out
    assert "multi-head latent attention" in out
    # 3 blocks x (kv_lora_rank 16 + qk_rope_head_dim 8) float32 values; expanded: 3 x 4 heads x (16 + 12)
    assert re.search(r"latent \(c_kv 16 \+ rotary key 8 per block\)\s+72\s+288 B", out), out
    assert re.search(r"expanded K/V instead .*\s336\s+1\.34 KB", out), out


def test_convert_makes_departments_of_an_imported_granite_model_and_keeps_its_scalings(tmp_path, capsys):
    from deamoe_trt.cli.main import main

    build_family_model("granitemoeshared", tmp_path / "hf")
    source = import_hf_lm(tmp_path / "hf", tmp_path / "lm")[0]
    args = ["--departments", "2", "--shared-size", "8", "--top-departments", "1", "--calibration-tokens", "256"]
    assert main(["convert", str(tmp_path / "lm"), "-o", str(tmp_path / "cv"), "--no-compare", *args]) == 0
    converted = load_lm(tmp_path / "cv").model.config
    assert (converted.moe.num_departments, converted.moe.shared_intermediate_size) == (2, 8)
    assert converted.replace(moe=source.moe) == source  # attention, scalings and the rest as imported


def test_convert_keeps_the_dense_blocks_of_an_imported_ernie_model(tmp_path, capsys):
    from deamoe_trt.cli.main import main

    build_family_model("ernie4_5_moe", tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "lm")
    args = ["--departments", "2", "--shared-size", "8", "--top-departments", "1", "--calibration-tokens", "256"]
    assert main(["convert", str(tmp_path / "lm"), "-o", str(tmp_path / "cv"), "--no-compare", *args]) == 0
    source, converted = load_lm(tmp_path / "lm").model, load_lm(tmp_path / "cv").model
    assert converted.config.dense_layers == (0, 2) and converted.moe_layers() == [1, 3]
    assert converted.config.moe.num_departments == 2
    for name, tensor in source.state_dict().items():
        if not name.startswith(("layers.1.mlp.", "layers.3.mlp.")):
            assert torch.equal(tensor, converted.state_dict()[name]), name


@pytest.mark.parametrize("variant", ["deepseek_v2_groups", "deepseek_v3", "ernie4_5_moe"])
def test_bf16_imports_route_like_transformers_bf16_models_on_clear_margin_tokens(variant, tmp_path):
    """transformers keeps these families' gate.weight (and correction bias) float32 in bf16
    models; the import keeps the routers float32 too (float32_router)."""
    import transformers as T

    from .hf_util import id_sets
    from .test_bf16_router_parity import clear_margin

    build_family_model(variant, tmp_path / "hf")
    hf = T.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16).eval()
    import_hf_lm(tmp_path / "hf", tmp_path / "lm", dtype=torch.bfloat16)
    model = load_lm(tmp_path / "lm").model
    i = model.moe_layers()[0]
    layer, gate = model.layers[i].mlp, hf.model.layers[i].mlp.gate
    assert layer.dtype == torch.bfloat16 and layer.router_dtype == torch.float32 == gate.weight.dtype
    x = torch.randn(4096, 32, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        theirs = gate(x)[2]
        ours = layer.route(x).expert_ids
    clear = clear_margin(layer, x)
    same = torch.tensor([a == b for a, b in zip(id_sets(ours), id_sets(theirs), strict=True)])
    assert int(clear.sum()) >= 1000
    assert bool(same[clear].all())


def test_deepseek_v3_multi_token_prediction_blocks_are_skipped_and_other_extra_tensors_refused(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from deamoe_trt.errors import UsageError

    build_family_model("deepseek_v3", tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)  # block L = 3: the MTP module
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    import_hf_lm(tmp_path / "hf", tmp_path / "lm")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    with pytest.raises(UsageError, match=r"1 tensor\(s\) this import would drop, first model\.layers\.3\.eh_proj"):
        import_hf_lm(tmp_path / "hf", tmp_path / "lm2")
