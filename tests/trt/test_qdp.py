"""The Python (QDP) route without TensorRT: the ONNX retargeting, and the plugin's schema.

tensorrt.plugin checks a QDP's functions by their signatures (parameter names, order and
annotations); the rules below restate those checks (TensorRT 10.6-11.1,
python/packaging/bindings_wheel/tensorrt/plugin/_validate.py) so drift shows up here.
"""

from __future__ import annotations

import inspect
import typing

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from configs import GPT_OSS_STYLE
from deamoe_trt import DeaMoEConfig, contract
from deamoe_trt.errors import UsageError
from deamoe_trt.export import plugin_node
from deamoe_trt.trt import qdp

from .conftest import export_model

FULL = DeaMoEConfig(
    hidden_size=32,
    num_departments=2,
    experts_per_department=4,
    shared_intermediate_size=8,
    private_intermediate_size=4,
    top_k=3,
    top_departments=1,
    score_func="sigmoid",
    department_score="sum_top2",
    routed_scaling_factor=2.5,
    router_bias=True,
    shared_expert_intermediate_size=16,
    shared_expert_gate=True,
)
EXPERTS_ONLY = FULL.replace(
    shared_intermediate_size=0, router_bias=False, shared_expert_intermediate_size=0, shared_expert_gate=False
)


def _deamoe_nodes(model):
    return [n for n in model.graph.node if n.op_type == "DeaMoE"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_prepare_model_pads_inputs_and_sets_the_namespace(tmp_path, dtype):
    path = export_model(tmp_path, dtype=dtype)  # tiny: no bias, no shared experts
    data, count = qdp.prepare_model_bytes(path)
    model = onnx.load_from_string(data)
    assert count == 1
    (node,) = _deamoe_nodes(model)
    assert len(node.input) == len(qdp.CANONICAL_INPUTS) == 22
    elem = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[dtype]
    placeholder = qdp.PLACEHOLDER_PREFIX + TensorProto.DataType.Name(elem).lower()
    float_placeholder = qdp.PLACEHOLDER_PREFIX + "float"
    # router.bias (input 2) and router.logit_bias (16) are float32 in every node; the other
    # absent inputs take the node's dtype.
    assert node.input[2] == node.input[16] == float_placeholder
    assert [node.input[i] == placeholder for i in range(3, 16)] == [False] * 4 + [True] * 9  # float: no scales
    assert [node.input[i] == placeholder for i in range(17, 22)] == [True] * 5  # no FFN biases
    for name, want in ((placeholder, elem), (float_placeholder, TensorProto.FLOAT)):
        tensor = next(t for t in model.graph.initializer if t.name == name)
        assert tensor.data_type == want and list(tensor.dims) == [1]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["plugin_namespace"] == b"deamoe_trt" and attrs["plugin_version"] == b"1"
    onnx.checker.check_model(model)


def test_prepare_model_keeps_present_inputs_in_place(tmp_path):
    from deamoe_trt import DeaMoEStack

    stack = DeaMoEStack.random(FULL, 2)
    from deamoe_trt.export import build_model

    model = build_model(stack, "plugin", "fp16")
    before = [list(n.input) for n in _deamoe_nodes(model)]
    assert qdp.prepare_model(model) == 2
    after = [list(n.input) for n in _deamoe_nodes(model)]
    # Every input of a float node present: only the (quantized nodes') scales and the
    # (gpt-oss layers') biases are padded, the logit bias float32 as the router's.
    assert [a[: len(b)] for a, b in zip(after, before, strict=True)] == before
    padded = {name for a in after for name in a[len(before[0]) :]}
    assert padded == {qdp.PLACEHOLDER_PREFIX + "float16", qdp.PLACEHOLDER_PREFIX + "float"}

    model = build_model(DeaMoEStack.random(EXPERTS_ONLY, 1), "plugin", "fp32")
    qdp.prepare_model(model)
    (node,) = _deamoe_nodes(model)
    names = dict(zip(qdp.CANONICAL_INPUTS, node.input, strict=True))
    assert names["experts.gate_up"].endswith("experts.gate_up")
    assert names["departments.gate_up"].startswith(qdp.PLACEHOLDER_PREFIX)


def test_prepare_model_checks_the_node(tmp_path):
    model = onnx.load(str(export_model(tmp_path)))
    (node,) = _deamoe_nodes(model)
    del node.input[-1]
    with pytest.raises(UsageError, match="input"):
        qdp.prepare_model(model)
    plain = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    assert qdp.prepare_model(plain) == 0


def test_config_from_attrs_strips_the_parsers_nul():
    attrs = {
        name: (
            value.encode().decode() + "\x00"
            if isinstance(value, str)
            else int(value)
            if isinstance(value, bool)
            else value
        )
        for name, value in FULL.to_dict().items()
    }
    assert qdp.config_from_attrs(attrs) == FULL


# --- the QDP's schema, checked with a recording stand-in for tensorrt.plugin ---------------


class _Recorder:
    class TensorDesc:
        pass

    class Tensor:
        pass

    class AutoTuneCombination:
        def __init__(self, io_types=None, layouts=None, tactics=None):
            self.io_types = io_types

    def __init__(self):
        self.functions = {}

    def _decorator(self, kind):
        def decorate(plugin_id):
            def record(fn):
                self.functions[kind] = (plugin_id, fn)
                return fn

            return record

        return decorate

    def __getattr__(self, kind):
        if kind in ("register", "impl", "autotune"):
            return self._decorator(kind)
        raise AttributeError(kind)


@pytest.fixture(scope="module")
def recorded():
    trtp = _Recorder()
    qdp._define(trtp)
    return trtp


def test_plugin_id_follows_the_qdp_naming_rules(recorded):
    namespace, name = qdp.QDP_ID.split("::")
    assert namespace not in ("", "trt", "tensorrt", "std") and "." not in namespace + name
    assert name == plugin_node.OP_TYPE  # the ONNX parser maps op_type to the plugin name
    assert {plugin_id for plugin_id, _ in recorded.functions.values()} == {qdp.QDP_ID}


def test_attributes_are_the_nodes(recorded):
    node_attributes = set(plugin_node.ATTRIBUTE_TYPES) - {"plugin_version", "plugin_namespace"}
    assert set(qdp.ATTRS) == node_attributes
    assert not set(qdp.ATTRS) & {"outputs", "stream", "tactic"}
    assert not set(qdp.ATTRS) & set(qdp.TENSOR_ARGS)


def test_register_signature(recorded):
    _, fn = recorded.functions["register"]
    sig = inspect.signature(fn)
    assert tuple(sig.parameters) == (*qdp.TENSOR_ARGS, *qdp.ATTRS)
    for name, param in sig.parameters.items():
        assert param.default is inspect.Parameter.empty
        want = _Recorder.TensorDesc if name in qdp.TENSOR_ARGS else qdp.ATTRS[name]
        assert param.annotation is want, name  # classes, not strings: no postponed annotations
    assert sig.return_annotation is _Recorder.TensorDesc


def test_impl_and_autotune_signatures(recorded):
    _, impl = recorded.functions["impl"]
    assert tuple(inspect.signature(impl).parameters) == (*qdp.TENSOR_ARGS, *qdp.ATTRS, "outputs", "stream")
    _, autotune = recorded.functions["autotune"]
    assert tuple(inspect.signature(autotune).parameters) == (*qdp.TENSOR_ARGS, "outputs")
    combinations = [c.io_types.split(", ") for c in autotune(*[None] * (len(qdp.TENSOR_ARGS) + 1))]
    tied, router_float32, quantized_tied, quantized_router_float32 = combinations
    bias, weight = qdp.TENSOR_ARGS.index("router_b"), qdp.TENSOR_ARGS.index("router_w")
    codes = [qdp.TENSOR_ARGS.index(i.qdp_arg) for i in contract.INPUTS if i.quantized == contract.CODES]
    for float_types, quantized_types in ((tied, quantized_tied), (router_float32, quantized_router_float32)):
        assert len(float_types) == len(quantized_types) == len(qdp.TENSOR_ARGS) + 1  # the inputs, then the output
        assert [quantized_types[i] for i in codes] == ["INT32"] * 6  # a quantized node's packed codes
        others = [i for i in range(len(float_types)) if i not in codes]
        assert [quantized_types[i] for i in others] == [float_types[i] for i in others]
    logit_bias = qdp.TENSOR_ARGS.index("router_logit_b")
    assert tied[bias] == router_float32[bias] == tied[logit_bias] == router_float32[logit_bias] == "FP32"
    assert tied[weight] == "FP32|FP16|BF16" and router_float32[weight] == "FP32"
    rest = [i for i in range(len(tied)) if i not in (bias, logit_bias, weight)]
    assert {tied[i] for i in rest} == {router_float32[i] for i in rest} == {"FP32|FP16|BF16"}


# --- tensorrt.plugin's attribute conversion, restated (TensorRT 10.6-11.1,
# python/packaging/bindings_wheel/tensorrt/plugin/_lib.py, create_plugin, and _utils.py) ---


def _is_numpy_array(annotation):
    origin = typing.get_origin(annotation)
    return annotation is np.ndarray or origin is np.ndarray


def _infer_numpy_type(annotation):
    return typing.get_args(typing.get_args(annotation)[1])[0]


def trt_create_plugin_attrs(annotations: dict, fields: dict) -> dict:
    """What create_plugin hands the plugin for each PluginField (name -> field.data)."""
    attrs = {}
    for name, data in fields.items():
        annotation = annotations[name]
        if _is_numpy_array(annotation):
            np_type = _infer_numpy_type(annotation)
            attrs[name] = (
                np.frombuffer(data.tobytes(), dtype=np.float16) if np_type == np.float16 else data.astype(np_type)
            )
        elif issubclass(annotation, str):
            attrs[name] = data.tobytes().decode("utf-8")
        else:
            attrs[name] = annotation(data)
    return attrs


def parser_fields(config: DeaMoEConfig) -> dict:
    """The node's attributes as TensorRT's ONNX parser makes PluginFields: one-element int32 or
    float32 arrays for INT/FLOAT, the characters plus a NUL for STRING."""
    fields = {}
    for name, value in plugin_node.config_to_attributes(config).items():
        if name in ("plugin_version", "plugin_namespace"):
            continue
        if isinstance(value, str):
            fields[name] = np.frombuffer((value + "\x00").encode(), dtype=np.int8)
        else:
            fields[name] = np.array([value], dtype=np.float32 if isinstance(value, float) else np.int32)
    return fields


def test_attributes_convert_under_the_installed_numpy(recorded):
    """Every attribute survives tensorrt.plugin's conversion under this NumPy (2.4 refuses
    int()/float() of a one-element array, which the previous int/float annotations relied on)."""
    for name in ("register", "impl"):
        _, fn = recorded.functions[name]
        annotations = {n: p.annotation for n, p in inspect.signature(fn).parameters.items() if n in qdp.ATTRS}
        for config in (FULL, EXPERTS_ONLY, GPT_OSS_STYLE):
            attrs = trt_create_plugin_attrs(annotations, parser_fields(config))
            assert qdp.config_from_attrs(attrs) == plugin_node.as_float32(config)


def test_the_old_scalar_annotations_fail_on_this_numpy():
    """Why the annotations are arrays: the conversion of a one-element int32 field to int."""
    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 4):
        pytest.skip(f"NumPy {np.__version__} still converts one-element arrays to scalars")
    with pytest.raises(TypeError, match="0-dimensional"):
        trt_create_plugin_attrs({"top_k": int}, {"top_k": np.array([4], dtype=np.int32)})


# --- quantized nodes -----------------------------------------------------------------------


def test_prepare_model_pads_a_quantized_node_with_typed_placeholders():
    from deamoe_trt import DeaMoEStack
    from deamoe_trt.export import build_model
    from deamoe_trt.quant import QuantConfig

    # No router bias, no shared experts: their codes and scales are padded.
    stack = DeaMoEStack.random(EXPERTS_ONLY.replace(private_intermediate_size=16), 1).quantized(QuantConfig(4, 16))
    model = build_model(stack, "plugin", "fp16")
    qdp.prepare_model(model)
    (node,) = _deamoe_nodes(model)
    names = dict(zip(qdp.CANONICAL_INPUTS, node.input, strict=True))
    elem = {t.name: t.data_type for t in model.graph.initializer}
    assert elem[names["experts.gate_up"]] == elem[names["shared_experts.gate_up"]] == TensorProto.INT32
    assert names["shared_experts.gate_up"].startswith(qdp.PLACEHOLDER_PREFIX)
    assert elem[names["experts.down.scales"]] == elem[names["shared_experts.down.scales"]] == TensorProto.FLOAT16
    assert names["shared_experts.down.scales"].startswith(qdp.PLACEHOLDER_PREFIX)
    assert elem[names["router.bias"]] == TensorProto.FLOAT
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["weight_bits"], attrs["weight_group_size"]) == (4, 16)


def test_prepare_model_gives_a_float_node_the_quantization_attributes(tmp_path):
    model = onnx.load(str(export_model(tmp_path)))
    qdp.prepare_model(model)
    (node,) = _deamoe_nodes(model)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["weight_bits"], attrs["weight_group_size"]) == (0, 0)  # a QDP takes every attribute


class _FakeTrtTensor:
    """What the QDP's impl receives per input: a pointer, a shape and a TensorRT dtype name."""

    def __init__(self, array, dtype_name):
        self.array, self.shape = array, tuple(array.shape)
        self.data_ptr = array.data_ptr()
        self.dtype = type("DataType", (), {"name": dtype_name})()


@pytest.mark.parametrize("bits", [4, 8])
def test_impl_loads_a_quantized_node_as_the_checkpoint_layer(monkeypatch, bits):
    # _layer_for maps the QDP's tensors (int32 codes, scales, placeholders) back onto the
    # checkpoint's state_dict: the layer it builds computes what the checkpoint's does.
    import torch

    from deamoe_trt import DeaMoELayer
    from deamoe_trt.export import plugin_node as node_contract
    from deamoe_trt.quant import QuantConfig

    config = FULL.replace(shared_intermediate_size=16, private_intermediate_size=16, shared_expert_gate=False)
    quant = QuantConfig(bits, 16)
    layer = DeaMoELayer.random(config, seed=1).quantized(quant)
    state = layer.state_dict()
    tensors = [_FakeTrtTensor(torch.zeros(2, 32), "FLOAT")]
    for item in contract.WEIGHT_INPUTS:
        if item in contract.present_inputs(config, quant):
            value = state[node_contract.state_key(item, quant)]
            value = value.view(torch.int32) if value.dtype == torch.uint8 else value
        else:
            value = torch.zeros(1)  # a placeholder
        tensors.append(_FakeTrtTensor(value, {torch.int32: "INT32", torch.float32: "FLOAT"}[value.dtype]))
    monkeypatch.setattr(qdp, "_as_torch", lambda t: t.array)
    attrs = plugin_node.config_to_attributes(config, quant)
    fields = {name: np.array([value]) for name, value in attrs.items() if name.startswith("weight_")}
    assert qdp.quant_from_attrs(fields, config) == quant
    built = qdp._layer_for(config, quant, tensors)
    x = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(built(x), layer(x), rtol=0, atol=0)
