"""Every form in every dtype, run on ONNX Runtime, gives the PyTorch reference's outputs."""

from __future__ import annotations

import onnx
import pytest

from configs import GPT_OSS_STYLE
from deamoe_trt import DeaMoEStack
from deamoe_trt.export import MAX_OPSET, build_model
from deamoe_trt.validation import make_session

from .conftest import CONFIGS, TOKENS, TOLERANCE, TORCH_DTYPES, layer_of, max_error

CASES = [
    (form, dtype)
    for form in ("plugin", "ort", "onnx")
    for dtype in ("fp32", "fp16", "bf16")
    if dtype != "bf16" or form == "plugin"
]


@pytest.mark.slow
@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize(("form", "dtype"), CASES)
def test_layer_matches_reference_for_1_4_and_17_tokens(form, dtype, config_name):
    layer = layer_of(CONFIGS[config_name], dtype, seed=1)
    session = make_session(build_model(layer, form, dtype))
    errors = {t: max_error(session, layer, t, seed=t) for t in TOKENS}
    assert max(errors.values()) <= TOLERANCE[dtype], errors


@pytest.mark.slow
@pytest.mark.parametrize("form", ["plugin", "ort", "onnx"])
def test_stack_applies_each_layer_with_a_residual(form):
    stack = DeaMoEStack.random(CONFIGS["deepseek-style"], 3, seed=2)
    model = build_model(stack, form)
    assert sum(n.op_type == "Add" and n.name.endswith("residual") for n in model.graph.node) == 3
    session = make_session(model)
    assert max(max_error(session, stack, t) for t in TOKENS) <= TOLERANCE["fp32"]


def test_fp32_layer_exported_as_fp16_matches_the_fp16_reference():
    layer = layer_of(CONFIGS["tiny"], "fp32", seed=3)
    session = make_session(build_model(layer, "onnx", "fp16"))
    assert max_error(session, layer.to(layer_of(CONFIGS["tiny"], "fp16").dtype), 4) <= TOLERANCE["fp16"]


def test_token_dimension_is_dynamic_and_shared_by_input_and_output():
    model = build_model(layer_of(CONFIGS["tiny"]), "ort")
    (x,) = model.graph.input
    (y,) = model.graph.output
    assert [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim] == ["T", 64]
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["T", 64]
    assert (x.name, y.name) == ("hidden_states", "output")


@pytest.mark.parametrize("opset", [18, MAX_OPSET])
@pytest.mark.parametrize("form", ["ort", "onnx"])
def test_forms_build_and_match_at_newer_opsets(form, opset):
    layer = layer_of(CONFIGS["deepseek-style"], seed=4)
    model = build_model(layer, form, opset=opset)
    assert next(i.version for i in model.opset_import if i.domain == "") == opset
    assert max(max_error(make_session(model), layer, t) for t in (1, 9)) <= TOLERANCE["fp32"]


EDGE_CONFIGS = {
    "one-department-with-shared-part": CONFIGS["tiny"].replace(
        num_departments=1, experts_per_department=16, top_departments=1
    ),
    "no-shared-part-sigmoid": CONFIGS["tiny"].replace(shared_intermediate_size=0, score_func="sigmoid"),
    "no-private-part": CONFIGS["tiny"].replace(private_intermediate_size=0),
    "every-department-kept": CONFIGS["tiny"].replace(top_departments=4),
    "k-fills-the-kept-departments": CONFIGS["tiny"].replace(top_k=8),
    "sum-score-unnormalised-scaled": CONFIGS["tiny"].replace(
        department_score="sum", norm_topk_prob=False, routed_scaling_factor=0.5
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("config_name", list(EDGE_CONFIGS))
@pytest.mark.parametrize("form", ["ort", "onnx"])
def test_edge_configs_match_reference(form, config_name):
    layer = layer_of(EDGE_CONFIGS[config_name], seed=2)
    session = make_session(build_model(layer, form))
    assert max(max_error(session, layer, t, seed=t) for t in TOKENS) <= TOLERANCE["fp32"]


def test_ort_form_stores_gate_up_interleaved_so_the_runtime_transposes_nothing_per_step():
    layer = layer_of(CONFIGS["tiny"], seed=2)
    model = build_model(layer, "ort")
    assert not [n.op_type for n in model.graph.node if n.op_type == "Transpose"]
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    canonical = layer.experts.gate_up.detach().numpy()  # [N, 2f, d]: gate rows, then up rows
    width = layer.config.private_intermediate_size
    interleaved = stored["experts.gate_up.interleaved"]
    assert (interleaved[:, 0::2] == canonical[:, :width]).all()
    assert (interleaved[:, 1::2] == canonical[:, width:]).all()
    assert "experts.gate_up" not in stored


# gpt-oss's FFN (biases on every part, the clamped SwiGLU clamping on these inputs, a router
# logit bias) and its twins: the expanded one (same routing, f_s = 0) and the vanilla one
# (one-stage top-k), which the ort form runs through MoE's own routing.
def gpt_oss_twin(twin: str, dtype: str = "fp32"):
    layer = layer_of(GPT_OSS_STYLE, seed=1)
    return {"deamoe": layer, "expanded": layer.expanded(), "vanilla": layer.vanilla()}[twin].to(TORCH_DTYPES[dtype])


GPT_OSS_CASES = [
    pytest.param(twin, form, dtype, marks=[pytest.mark.slow] if (twin, dtype) != ("deamoe", "fp32") else [])
    for twin in ("deamoe", "expanded", "vanilla")
    for form in ("ort", "onnx")
    for dtype in ("fp32", "fp16")
]


@pytest.mark.parametrize(("twin", "form", "dtype"), GPT_OSS_CASES)
def test_gpt_oss_style_layer_and_twins_match_reference(twin, form, dtype):
    layer = gpt_oss_twin(twin, dtype)
    session = make_session(build_model(layer, form, dtype))
    errors = {t: max_error(session, layer, t, seed=t) for t in TOKENS}
    assert max(errors.values()) <= TOLERANCE[dtype], errors


def test_ort_form_runs_gpt_oss_experts_in_moe_with_their_biases_and_clamp():
    layer = gpt_oss_twin("deamoe")
    model = build_model(layer, "ort")
    moes = {n.name: n for n in model.graph.node if n.op_type == "MoE"}
    assert set(moes) == {"departments_MoE", "experts_MoE"}
    for node in moes.values():
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes["activation_beta"] == 1.0
        assert attributes["swiglu_limit"] == pytest.approx(GPT_OSS_STYLE.swiglu_limit)
        assert attributes["activation_alpha"] == pytest.approx(GPT_OSS_STYLE.swiglu_alpha)
        assert node.input[3].endswith("gate_up_bias.interleaved")
    assert len(moes["experts_MoE"].input) == 6 and moes["experts_MoE"].input[5] == "experts.down_bias"
    assert len(moes["departments_MoE"].input) == 5  # departments have no down bias
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    canonical = layer.experts.gate_up_bias.detach().numpy()
    width = GPT_OSS_STYLE.private_intermediate_size
    assert (stored["experts.gate_up_bias.interleaved"][:, 0::2] == canonical[:, :width]).all()
    assert (stored["experts.gate_up_bias.interleaved"][:, 1::2] == canonical[:, width:]).all()
    assert stored["router.logit_bias"].dtype == "float32"
