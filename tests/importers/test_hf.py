"""from_hf: Hugging Face MoE blocks (transformers 5.x and 4.x layouts) as DeaMoE layers with equal outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import deamoe_trt
from deamoe_trt import UsageError
from deamoe_trt.importers.hf import from_hf

from . import hf4_layout
from .hf_util import assert_parity, hf_block, hf_routing, id_sets, inputs, randomize_

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
VANILLA = ("mixtral", "qwen2_moe", "qwen3_moe")


# transformers 5.x blocks ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_imported_block_has_the_same_outputs_and_routing_as_hf(family):
    block = hf_block(family)
    layer = from_hf(block)
    x = inputs()
    with torch.no_grad():
        assert_parity(layer(x), block(x))
        hf_ids, _ = hf_routing(block, x)
        assert id_sets(layer.route(x).expert_ids) == id_sets(hf_ids)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe"])
def test_qwen_blocks_follow_norm_topk_prob(family, norm_topk_prob):
    block = hf_block(family, seed=3, norm_topk_prob=norm_topk_prob)
    layer = from_hf(block)
    assert layer.config.norm_topk_prob is norm_topk_prob
    x = inputs(seed=4)
    with torch.no_grad():
        assert_parity(layer(x), block(x))


@pytest.mark.parametrize("family", VANILLA)
def test_vanilla_blocks_import_as_one_department_top_k(family):
    """Spec special case f_s = 0, D = 1, g = 1: two-stage routing collapses to HF's one-stage top-k."""
    block = hf_block(family, seed=5)
    layer = from_hf(block)
    c = layer.config
    n = block.gate.weight.shape[0]
    assert (c.num_departments, c.top_departments, c.shared_intermediate_size) == (1, 1, 0)
    assert (c.experts_per_department, c.top_k, c.score_func) == (n, block.gate.top_k, "softmax")
    assert c.routed_scaling_factor == 1.0 and not c.router_bias
    assert c.norm_topk_prob is (True if family == "mixtral" else block.gate.norm_topk_prob)
    x = inputs(seed=6)
    with torch.no_grad():
        ours = layer.route(x)
        hf_ids, hf_weights = hf_routing(block, x)
    # Same experts, and the same weight on each (compared in ascending expert order).
    ours_order, hf_order = ours.expert_ids.argsort(dim=-1), hf_ids.argsort(dim=-1)
    assert torch.equal(ours.expert_ids.gather(1, ours_order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(ours.weights.gather(1, ours_order), hf_weights.float().gather(1, hf_order))


def test_qwen2_moe_gated_shared_expert_is_imported():
    block = hf_block("qwen2_moe")
    layer = from_hf(block)
    assert layer.config.shared_expert_intermediate_size == 24 and layer.config.shared_expert_gate
    torch.testing.assert_close(layer.shared_experts.gate, block.shared_expert_gate.weight, rtol=0, atol=0)
    with torch.no_grad():
        block.shared_expert_gate.weight.mul_(-3.0)  # the gate matters: change it and parity needs a re-import
        x = inputs()
        assert not torch.allclose(layer(x), block(x), atol=1e-4)
        assert_parity(from_hf(block)(x), block(x))


def test_deepseek_v3_group_routing_maps_to_departments():
    """Spec special case: sigmoid, selection bias, sum_top2, D = n_group, g = topk_group."""
    block = hf_block("deepseek_v3", seed=7)
    c = from_hf(block).config
    assert (c.num_departments, c.experts_per_department, c.top_departments, c.top_k) == (4, 4, 2, 4)
    assert (c.score_func, c.department_score, c.router_bias) == ("sigmoid", "sum_top2", True)
    assert (c.norm_topk_prob, c.routed_scaling_factor) == (True, 2.5)
    assert (c.shared_expert_intermediate_size, c.shared_expert_gate) == (32, False)  # 16 * n_shared_experts=2


def test_deepseek_v3_selection_bias_is_imported_and_used():
    block = hf_block("deepseek_v3", seed=8)
    x = inputs(seed=9)
    layer = from_hf(block)
    torch.testing.assert_close(layer.router.bias, block.gate.e_score_correction_bias, rtol=0, atol=0)
    with torch.no_grad():
        block.gate.e_score_correction_bias.copy_(torch.linspace(0.5, 0.0, 16))  # strongly favour low ids
        biased = from_hf(block)
        assert id_sets(biased.route(x).expert_ids) == id_sets(hf_routing(block, x)[0])
        assert id_sets(biased.route(x).expert_ids) != id_sets(layer.route(x).expert_ids)
        assert_parity(biased(x), block(x))


def test_deepseek_v3_without_norm_and_one_group():
    block = hf_block("deepseek_v3", seed=10, n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5)
    layer = from_hf(block)
    assert (layer.config.num_departments, layer.config.top_departments, layer.config.norm_topk_prob) == (1, 1, False)
    x = inputs(seed=11)
    with torch.no_grad():
        assert_parity(layer(x), block(x))


# The documented divergence: masking non-kept groups with 0.0 (transformers 4.x) vs -inf (spec) --


def _negative_kept_score_case():
    """8 experts in 4 groups of 2, keep 2 groups, top-4: every kept expert is needed.

    Biases keep groups 0 and 1 for every token but give expert 3 a selection score
    s + b < 0. The spec (and transformers 5.x) masks the other groups with -inf, so expert
    3 is still chosen; transformers 4.x masks them with 0.0, so a non-kept group's expert
    (score 0.0 > s3 + b3) takes its place.
    """
    return torch.tensor([1.0, 1.0, 1.0, -2.0, -1.5, -1.5, -1.5, -1.5])


def test_deepseek_v3_hf5_matches_spec_when_a_kept_selection_score_is_negative():
    block = hf_block("deepseek_v3", seed=12, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=4)
    with torch.no_grad():
        block.gate.e_score_correction_bias.copy_(_negative_kept_score_case())
        x = inputs(seed=13)
        layer = from_hf(block)
        assert all(ids == {0, 1, 2, 3} for ids in id_sets(layer.route(x).expert_ids))
        assert id_sets(hf_routing(block, x)[0]) == id_sets(layer.route(x).expert_ids)
        assert_parity(layer(x), block(x))


def test_deepseek_v3_hf4_zero_mask_diverges_when_a_kept_selection_score_is_negative():
    """Pinned, documented divergence (docs/importers.md): the importer follows the spec."""
    block = randomize_(hf4_layout.DeepseekV3MoE(32, 16, 8, top_k=4, n_group=4, topk_group=2, n_shared=1), seed=14)
    x = inputs(seed=15)
    with torch.no_grad():
        assert_parity(from_hf(block)(x), block(x))  # positive biases (s + b > 0): identical
        block.gate.e_score_correction_bias.copy_(_negative_kept_score_case())
        layer = from_hf(block)
        ours = id_sets(layer.route(x).expert_ids)
        theirs = id_sets(block.gate(x.reshape(-1, 32))[0])
        assert all(ids == {0, 1, 2, 3} for ids in ours)
        assert all(3 not in ids and len(ids - {0, 1, 2, 3}) == 1 for ids in theirs)
        err = (layer(x) - block(x)).abs().max() / block(x).abs().max()
        assert err > 1e-3


# transformers 4.x layout ----------------------------------------------------------------------


def _hf4_blocks():
    return {
        "mixtral": hf4_layout.MixtralSparseMoeBlock(32, 16, num_experts=8, top_k=2),
        "qwen2_moe": hf4_layout.Qwen2MoeSparseMoeBlock(32, 16, 8, top_k=2, norm_topk_prob=False, shared=24),
        "qwen3_moe": hf4_layout.Qwen3MoeSparseMoeBlock(32, 16, 16, top_k=4, norm_topk_prob=True),
        "deepseek_v3": hf4_layout.DeepseekV3MoE(32, 16, 16, top_k=4, n_group=4, topk_group=2, n_shared=2),
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_transformers4_layout_blocks_have_the_same_outputs(family):
    block = randomize_(_hf4_blocks()[family], seed=16)
    layer = from_hf(block)
    x = inputs(seed=17)
    with torch.no_grad():
        ref = block(x)
        ref = ref[0] if isinstance(ref, tuple) else ref  # 4.x Mixtral/Qwen return (hidden, router_logits)
        assert_parity(layer(x), ref)
        hf_ids = block.gate(x.reshape(-1, 32))[0] if family == "deepseek_v3" else block.route(x.reshape(-1, 32))[0]
        assert id_sets(layer.route(x).expert_ids) == id_sets(hf_ids)


def test_transformers4_and_5_layouts_import_to_the_same_layer():
    new = hf_block("mixtral", seed=18)
    old = hf4_layout.MixtralSparseMoeBlock(32, 16, num_experts=8, top_k=2)
    with torch.no_grad():
        old.gate.weight.copy_(new.gate.weight)
        for e, expert in enumerate(old.experts):
            gate, up = new.experts.gate_up_proj[e].chunk(2, dim=0)
            expert.w1.weight.copy_(gate)
            expert.w3.weight.copy_(up)
            expert.w2.weight.copy_(new.experts.down_proj[e])
    a, b = from_hf(new), from_hf(old)
    assert a.config == b.config
    for name, tensor in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], tensor, rtol=0, atol=0)


REAL_HF4 = os.environ.get("DEAMOE_TRT_TRANSFORMERS4")


@pytest.mark.skipif(not REAL_HF4, reason="set DEAMOE_TRT_TRANSFORMERS4 to a transformers 4.x install (pip --target)")
def test_real_transformers4_blocks_match():
    """Real 4.x blocks (and the hf4_layout stand-ins against them), in a subprocess."""
    script = Path(__file__).parents[2] / "scripts" / "hf4_real_check.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REAL_HF4, str(Path(__file__).parents[2])])}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


# Conversions and errors -----------------------------------------------------------------------


def test_top_level_from_hf_is_the_importer():
    block = hf_block("qwen3_moe")
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(deamoe_trt.from_hf(block)(x), from_hf(block)(x), rtol=0, atol=0)


def test_imported_layer_is_a_copy_of_the_hf_weights():
    block = hf_block("mixtral")
    layer = from_hf(block)
    x = inputs()
    with torch.no_grad():
        before = layer(x)
        block.experts.gate_up_proj.zero_()
        torch.testing.assert_close(layer(x), before, rtol=0, atol=0)


def test_layer_dtype_defaults_to_the_experts_dtype():
    block = hf_block("qwen2_moe").to(torch.bfloat16)
    assert from_hf(block).dtype == torch.bfloat16
    assert from_hf(block, dtype=torch.float32).dtype == torch.float32


def test_unsupported_module_is_one_clear_line():
    with pytest.raises(UsageError, match=r"^unsupported Hugging Face module Linear; supported: MixtralSparseMoeBlock"):
        from_hf(nn.Linear(4, 4))
    with pytest.raises(UsageError, match="expects a Hugging Face MoE block"):
        from_hf("mixtral")


def test_non_silu_experts_are_refused():
    with pytest.raises(UsageError, match="not silu"):
        from_hf(hf_block("mixtral", hidden_act="gelu"))


def test_weights_on_the_meta_device_are_refused():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from .hf_util import qwen3_moe_config

    with torch.device("meta"):
        block = Qwen3MoeSparseMoeBlock(qwen3_moe_config())
    with pytest.raises(UsageError, match="meta device"):
        from_hf(block)


def test_routing_with_no_deamoe_equivalent_is_a_clear_error():
    # top-8 from 1 group of 4 experts: more experts than the kept groups hold.
    block = hf_block("deepseek_v3", topk_group=1, num_experts_per_tok=8)
    with pytest.raises(UsageError, match=r"DeepseekV3MoE has no DeaMoE equivalent: top_k must be <= "):
        from_hf(block)


def test_expert_biases_are_refused():
    block = hf4_layout.Qwen3MoeSparseMoeBlock(32, 16, 4, top_k=2, norm_topk_prob=True)
    block.experts[2].up_proj = nn.Linear(32, 16, bias=True)
    with pytest.raises(UsageError, match=r"experts\.2\.up_proj has a bias"):
        from_hf(randomize_(block))
