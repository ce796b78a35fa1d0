"""validate(): the model on its runtime + the reference + one comparison through the adapter, and its pieces."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest
import torch

from deamoe_trt import DeaMoEStack, MissingDependencyError, UsageError, get_preset, runtimes
from deamoe_trt.export import build_model, export
from deamoe_trt.validation import DEFAULT_TOLERANCES, make_session, validate
from deamoe_trt.validation.layers import engine_runner
from deamoe_trt.validation.pair import compare_decoders, compare_layers
from deamoe_trt.validation.plugin_op import for_reference


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("validate") / "ckpt"
    DeaMoEStack.random(get_preset("tiny"), 2, seed=11).save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("form", "dtype"), [("plugin", "bf16"), ("onnx", "fp16"), ("ort", "fp32")])
def test_report_has_a_passing_row_per_token_count_with_dtype_tolerances(checkpoint, tmp_path, form, dtype):
    stack = DeaMoEStack.from_pretrained(checkpoint)
    model = export(stack, tmp_path / "m.onnx", form, dtype)
    report = validate(model, checkpoint, tokens=(1, 5))
    assert report.passed
    assert [(r.output, r.tokens) for r in report.rows] == [("output", 1), ("output", 5)]
    assert (report.atol, report.rtol) == DEFAULT_TOLERANCES[dtype]
    assert all(r.max_abs <= report.atol for r in report.rows)
    assert f"{form} form, {dtype}, stack of 2 layers" in report.table()


def test_report_fails_when_errors_exceed_tolerance(checkpoint, tmp_path):
    model = export(DeaMoEStack.from_pretrained(checkpoint), tmp_path / "m.onnx", "ort")
    report = validate(model, checkpoint, tokens=(3,), atol=0.0, rtol=0.0)
    assert not report.passed
    assert "1 of 1 comparison(s) exceed tolerance" in report.failure()


def test_a_prepared_layer_compares_to_itself_exactly():
    stack = DeaMoEStack.random(get_preset("tiny"), 1, seed=1)
    torch_rt = runtimes.get("torch")
    inputs = [torch.randn(t, 64, generator=torch.Generator().manual_seed(t)) for t in (1, 4)]
    rows = compare_layers(torch_rt.prepare(stack), torch_rt.prepare(stack), inputs, atol=0.0, rtol=0.0)
    assert [(r.tokens, r.max_abs, r.passed) for r in rows] == [(1, 0.0, True), (4, 0.0, True)]


def test_compare_layers_reports_the_difference_between_two_runtimes():
    """The ort runtime against torch on another layer: the errors are numpy's own, and fail at tolerance 0."""
    layer = DeaMoEStack.random(get_preset("tiny"), 1, seed=2).layers[0]
    other = DeaMoEStack.random(get_preset("tiny"), 1, seed=3).layers[0]
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    (row,) = compare_layers(
        runtimes.get("ort").prepare(layer), runtimes.get("torch").prepare(other), [x], atol=0.0, rtol=0.0
    )
    with torch.no_grad():
        diff = (layer(x) - other(x)).abs()
    assert not row.passed and row.tokens == 5
    assert row.max_abs == pytest.approx(float(diff.max()), rel=1e-4)
    assert row.mean_abs == pytest.approx(float(diff.mean()), rel=1e-4)


def test_compare_decoders_compares_logits_and_greedy_tokens_on_one_sequence(micro_model):
    """Two torch decoders of one model agree exactly; the ort runtime's within fp32 tolerance and
    token for token; a model with its head negated picks the tokens its own forward picks."""
    torch_rt, ids = runtimes.get("torch"), [3, 1, 4, 1, 5, 9, 2, 6]
    same = compare_decoders(torch_rt.decoder(micro_model), torch_rt.decoder(micro_model), ids, 3, atol=0.0, rtol=0.0)
    assert [r.output for r in same.rows] == [f"logits @pos={p}" for p in range(2, 8)]
    assert [r.tokens for r in same.rows] == [3, 1, 1, 1, 1, 1]
    assert all(r.max_abs == 0.0 and r.passed for r in same.rows) and same.first_difference is None
    with torch.no_grad():
        expected = micro_model(torch.tensor([ids])).logits[0, 2:].argmax(-1).tolist()
    assert same.tokens == same.reference_tokens == expected
    ort = compare_decoders(
        runtimes.get("ort").decoder(micro_model), torch_rt.decoder(micro_model), ids, 3, atol=1e-4, rtol=1e-3
    )
    assert all(r.passed for r in ort.rows) and ort.tokens == expected
    other = copy.deepcopy(micro_model)
    with torch.no_grad():
        other.lm_head.weight.neg_()
        wanted = other(torch.tensor([ids])).logits[0, 2:].argmax(-1).tolist()
    flipped = compare_decoders(torch_rt.decoder(other), torch_rt.decoder(micro_model), ids, 3, atol=0.0, rtol=0.0)
    differ = [i for i, (a, b) in enumerate(zip(wanted, expected, strict=True)) if a != b]
    assert flipped.tokens == wanted and flipped.reference_tokens == expected and differ
    assert flipped.first_difference == differ[0]
    assert not any(r.passed for r in flipped.rows)


def test_engine_validation_without_the_tensorrt_backend_names_what_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "deamoe_trt.runtimes.tensorrt", None)  # as if the module did not exist
    with pytest.raises(MissingDependencyError, match=r"validation needs deamoe_trt\.runtimes\.tensorrt"):
        engine_runner("model.engine")


def test_cuda_provider_without_cuda_is_a_missing_dependency():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    model = build_model(DeaMoEStack.random(get_preset("tiny"), 1).layers[0], "ort")
    with pytest.raises(MissingDependencyError, match="no CUDAExecutionProvider"):
        make_session(model, "cuda")


def test_plugin_node_whose_weights_disagree_with_its_attributes_is_refused():
    layer = DeaMoEStack.random(get_preset("tiny"), 1).layers[0]
    model = build_model(layer, "plugin")
    (node,) = model.graph.node
    for attr in node.attribute:
        if attr.name == "private_intermediate_size":
            attr.i = 8
    with pytest.raises(UsageError, match=r"input experts.gate_up \(experts.gate_up\) has shape \[16, 32, 64\]"):
        for_reference(model)


def test_bf16_plugin_model_is_fed_and_read_as_float32_holding_bf16_values():
    layer = DeaMoEStack.random(get_preset("tiny"), 1).layers[0].to(torch.bfloat16)
    session = make_session(build_model(layer, "plugin", "bf16"))
    assert [(i.name, i.type) for i in session.get_inputs()] == [("hidden_states", "tensor(float)")]
    x = torch.randn(3, 64).to(torch.bfloat16)
    (y,) = session.run(None, {"hidden_states": x.float().numpy()})
    with torch.no_grad():
        np.testing.assert_array_equal(y, layer(x).float().numpy())


def test_every_registered_validator_exists_for_its_format():
    import importlib

    from deamoe_trt.export.lm import FORMAT as LM_FORMAT
    from deamoe_trt.validation import VALIDATORS

    assert LM_FORMAT in VALIDATORS
    for module, function in VALIDATORS.values():
        assert callable(getattr(importlib.import_module(module), function))


def test_an_engine_is_validated_against_the_layers_and_dtype_its_metadata_names(tmp_path, monkeypatch):
    """No guessing from the engine's input: layer 1 of a 2-layer checkpoint, in bf16."""
    import deamoe_trt.validation.layers as validation
    from deamoe_trt.export.metadata import ExportInfo, engine_metadata_path, write_engine_metadata

    stack = DeaMoEStack.random(get_preset("tiny"), 2, seed=3)
    stack.save_pretrained(tmp_path / "ckpt")
    engine = tmp_path / "layer1.engine"
    info = ExportInfo(form="plugin", dtype="bf16", module="layer", layers=(1,), config=get_preset("tiny"))
    write_engine_metadata(engine, info.to_metadata())
    monkeypatch.setattr(validation, "engine_runner", lambda model, plugin: "runner")
    runner, reference, dtype, description = validation._engine_side(engine, tmp_path / "ckpt", None)
    assert runner == "runner" and dtype.name == "bf16" and reference.dtype == torch.bfloat16
    # A float32 router stays float32 in the bf16 reference (spec, "Router precision").
    assert torch.equal(reference.router.weight, stack.layers[1].router.weight)
    assert description == "TensorRT engine of the plugin form, bf16, one layer"
    engine_metadata_path(engine).write_text("{not json")
    with pytest.raises(UsageError, match="is not valid JSON"):
        validation._engine_side(engine, tmp_path / "ckpt", None)


def test_quantized_model_needs_its_quantized_checkpoint(checkpoint, tmp_path):
    from deamoe_trt.quant import QuantConfig

    quantized = DeaMoEStack.from_pretrained(checkpoint).quantized(QuantConfig(8, 16))
    quantized.save_pretrained(tmp_path / "q8")
    model = export(quantized, tmp_path / "m.onnx", "ort")
    with pytest.raises(UsageError, match="the model has int8-g16, the checkpoint float weights"):
        validate(model, checkpoint, tokens=(1,))
    report = validate(model, tmp_path / "q8", tokens=(1, 4))
    # ONNX Runtime's CPU QMoE quantizes activations for int8 weights: its looser tolerance, said so.
    assert report.passed and (report.atol, report.rtol) == (5e-2, 5e-2)
    assert "int8 activations" in report.table()
    onnx_model = export(quantized, tmp_path / "o.onnx", "onnx")
    report = validate(onnx_model, tmp_path / "q8", tokens=(1,))
    assert report.passed and (report.atol, report.rtol) == DEFAULT_TOLERANCES["fp32"]
