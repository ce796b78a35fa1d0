"""Every importer family converts: random Hugging Face blocks -> DeaMoE layer -> converted layer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from importers.hf_util import HIDDEN, hf_block

from deamoe_trt.convert.core import ConvertSettings, convert_layer, expert_agreement
from deamoe_trt.convert.metrics import relative_error, step_bytes
from deamoe_trt.importers.hf import from_hf
from deamoe_trt.inputs import random_hidden


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"])
def test_imported_family_converts(family):
    source = from_hf(hf_block(family))
    c = source.config
    departments = 4 if family == "deepseek_v3" else 2
    settings = ConvertSettings(departments, 2 if family == "deepseek_v3" else 1, shared_fraction=0.5)
    x, held = random_hidden(1024, HIDDEN, seed=1), random_hidden(256, HIDDEN, seed=2)
    conversion = convert_layer(source, x, settings)
    layer = conversion.layer
    f = c.expert_intermediate_size
    assert layer.config.num_departments == departments
    assert layer.config.shared_intermediate_size + layer.config.private_intermediate_size == f
    assert layer.departments.gate_up.shape == (departments, 2 * (f // 2), HIDDEN)
    assert layer.experts.down.shape == (c.num_experts, HIDDEN, f - f // 2)
    # Routing settings that are not the conversion's to choose stay the source's.
    for field in (
        "top_k",
        "score_func",
        "norm_topk_prob",
        "routed_scaling_factor",
        "router_bias",
        "shared_expert_intermediate_size",
        "shared_expert_gate",
    ):
        assert getattr(layer.config, field) == getattr(c, field), field
    if source.shared_experts is not None:
        torch.testing.assert_close(layer.shared_experts.gate_up, source.shared_experts.gate_up)
    with torch.no_grad():
        error = relative_error(layer(held), source(held))
        agreement = expert_agreement(source.route(held), layer.route(held), conversion.order)
        converted_bytes = step_bytes(layer.config, layer.route(held), 4)
        source_bytes = step_bytes(c, source.route(held), 4)
    assert 0 < error < 1.5
    assert converted_bytes < source_bytes
    print(
        f"{family}: relative error {error:.3f}, expert agreement {agreement:.1%}, "
        f"bytes {converted_bytes / source_bytes:.1%} of the source's, score {layer.config.department_score}"
    )
