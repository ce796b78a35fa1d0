"""from_hf_model: every MoE layer of a whole Hugging Face model as a DeaMoEStack; checkpoints of it."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

import deamoe_trt
from deamoe_trt import DeaMoEStack, UsageError
from deamoe_trt.checkpoint import read_header
from deamoe_trt.importers.hf import find_moe_blocks, from_hf_model

from .hf_util import assert_parity, deepseek_v3_config, inputs, mixtral_config, qwen2_moe_config, randomize_


def causal_lm(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    return randomize_(AutoModelForCausalLM.from_config(config), seed)


def assert_stack_matches(stack: DeaMoEStack, model) -> None:
    x = inputs(seed=30)
    with torch.no_grad():
        for layer, index in zip(stack.layers, stack.source["layers"], strict=True):
            assert_parity(layer(x), model.model.layers[index].mlp(x))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(num_hidden_layers=4, mlp_only_layers=[0]), [1, 2, 3]),
        (dict(num_hidden_layers=4, decoder_sparse_step=2), [1, 3]),
    ],
    ids=["mlp_only_layers", "decoder_sparse_step"],
)
def test_qwen2_moe_model_imports_its_moe_layers_and_skips_dense_ones(overrides, expected):
    model = causal_lm(qwen2_moe_config(**overrides))
    stack = from_hf_model(model)
    assert isinstance(stack, DeaMoEStack)
    assert stack.source == {"hf_model_type": "qwen2_moe", "hf_module": "Qwen2MoeSparseMoeBlock", "layers": expected}
    assert len(stack.layers) == len(expected)
    assert_stack_matches(stack, model)


def test_deepseek_v3_model_skips_first_k_dense_layers():
    model = causal_lm(deepseek_v3_config(num_hidden_layers=3, first_k_dense_replace=1))
    stack = deamoe_trt.from_hf_model(model)
    assert stack.source["layers"] == [1, 2]
    assert stack.source["hf_model_type"] == "deepseek_v3"
    assert stack.config.num_departments == 4 and stack.config.router_bias
    assert_stack_matches(stack, model)
    # Each layer keeps its own selection bias.
    assert not torch.equal(stack.layers[0].router.bias, stack.layers[1].router.bias)


def test_base_model_without_lm_head_imports_too():
    from transformers import AutoModel

    model = randomize_(AutoModel.from_config(mixtral_config(num_hidden_layers=2)))
    stack = from_hf_model(model)
    assert stack.source["layers"] == [0, 1]
    assert [name for _, name, _ in find_moe_blocks(model)] == ["layers.0.mlp", "layers.1.mlp"]


def test_layers_selects_hf_layer_indices_in_the_given_order():
    model = causal_lm(qwen2_moe_config(num_hidden_layers=4, mlp_only_layers=[0]))
    stack = from_hf_model(model, layers=[3, 1])
    assert stack.source["layers"] == [3, 1]
    assert_stack_matches(stack, model)


def test_selecting_a_dense_layer_is_a_clear_error():
    model = causal_lm(qwen2_moe_config(num_hidden_layers=3, mlp_only_layers=[0]))
    with pytest.raises(UsageError, match=r"^layer 0 is not a MoE layer of this model .*its MoE layers are 1, 2$"):
        from_hf_model(model, layers=[0])


def test_model_without_moe_layers_is_a_clear_error():
    model = causal_lm(qwen2_moe_config(num_hidden_layers=2, mlp_only_layers=[0, 1]))
    with pytest.raises(UsageError, match=r"^Qwen2MoeForCausalLM has no supported MoE layers"):
        from_hf_model(model)


def test_layers_of_different_shapes_are_a_clear_error():
    model = causal_lm(qwen2_moe_config(num_hidden_layers=3))
    model.model.layers[2].mlp.gate.top_k = 1
    with pytest.raises(UsageError, match=r"^MoE layers 0 and 2 have different shapes or routing \(top_k 2 vs 1\)"):
        from_hf_model(model)


def test_imported_checkpoint_round_trips(tmp_path):
    model = causal_lm(deepseek_v3_config(num_hidden_layers=3, first_k_dense_replace=1))
    stack = from_hf_model(model)
    stack.save_pretrained(tmp_path / "ckpt")
    header = read_header(tmp_path / "ckpt")
    assert header["source"] == {"hf_model_type": "deepseek_v3", "hf_module": "DeepseekV3MoE", "layers": [1, 2]}
    assert header["config"] == stack.config
    json.loads((tmp_path / "ckpt" / "config.json").read_text())  # plain JSON
    loaded = DeaMoEStack.from_pretrained(tmp_path / "ckpt")
    for a, b in zip(loaded.layers, stack.layers, strict=True):
        for name, tensor in b.state_dict().items():
            torch.testing.assert_close(a.state_dict()[name], tensor, rtol=0, atol=0)
    x = inputs(seed=31)
    with torch.no_grad():
        assert_parity(loaded.layers[1](x), model.model.layers[2].mlp(x))


def test_blocks_outside_decoder_layers_are_left_out_and_unnamed_ones_numbered_in_order():
    from torch import nn

    from .hf_util import hf_block

    model = nn.Module()
    model.layers = nn.ModuleList([nn.ModuleDict({"attn": nn.Identity()}), nn.ModuleDict({"mlp": hf_block("mixtral")})])
    model.mtp_layers = nn.ModuleList([nn.ModuleDict({"mlp": hf_block("mixtral", seed=1)})])
    assert [(i, name) for i, name, _ in find_moe_blocks(model)] == [(1, "layers.1.mlp")]
    container = nn.ModuleDict({"a": hf_block("qwen3_moe"), "b": hf_block("qwen3_moe", seed=1)})
    stack = from_hf_model(container)
    assert stack.source == {"hf_model_type": "qwen3_moe", "hf_module": "Qwen3MoeSparseMoeBlock", "layers": [0, 1]}
