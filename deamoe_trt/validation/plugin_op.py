"""Run the plugin form's DeaMoE nodes on ONNX Runtime (CPU) with the PyTorch reference inside.

The node TensorRT receives is executed as it is: its weight inputs and attributes reach an
onnxruntime-extensions Python op that builds the DeaMoEConfig from the attributes (through
the same round trip the exporter uses), loads the inputs into a DeaMoELayer and runs its
forward. Two limits of onnxruntime-extensions' Python ops shape how (both checked on
onnxruntime 1.32 / onnxruntime-extensions 0.15):

- ONNX Runtime ties a custom op to one input count ("allows the overloading of an operator
  if all versions have the same number of declared inputs"), and registering a second count
  under the same name breaks every session. The node's input count depends on its config
  (2 to 16 inputs), so each count gets its own op name, DeaMoE_<dtype>_<count>, in the
  domain deamoe_trt.reference; `for_reference` retargets a copy of the model's nodes to it.
- Python ops hand float16 outputs back through a float list and abort the process, and
  cannot take bfloat16 at all. So fp16/bf16 nodes get Casts to float32 around them
  (lossless both ways) and the op, told the dtype by its name, runs the reference in the
  node's own dtype. A bf16 model's graph inputs and outputs become float32 too, since numpy
  has no bfloat16 to feed, and its residual Adds run in float32 rounded back to bf16, since
  ONNX Runtime's CPU has no bf16 Add (torch computes bf16 sums the same way).

A quantized node's codes (int32 words of the checkpoint's code bytes) cannot reach a float
input exactly, and ONNX has no bitcast: `for_reference` stores each codes initializer's
bytes as a uint8 initializer cast to float32 (exact for 0-255), and the op loads them back as
the checkpoint's "<weight>.qweight" bytes into a quantized DeaMoELayer, so a quantized node is
checked against the dequantized reference through the bytes it carries. A float node
without the optional quantization attributes gets them as 0 (the op declares them all).

Everything else about the node (name, inputs, attribute names, types and values) is the
exported one; `for_reference` checks it against the contract before anything runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from onnx import AttributeProto, TensorProto, helper

from .. import contract
from ..errors import MissingDependencyError, UsageError
from ..export import plugin_node
from ..export.dtypes import DTYPES, ExportDtype, dtype_of_onnx
from ..export.plugin_form import CODE_TYPE, CODE_WORD_BYTES
from ..layer import DeaMoELayer

REFERENCE_DOMAIN = "deamoe_trt.reference"
F32 = TensorProto.FLOAT


def reference_op_type(dtype: ExportDtype, num_inputs: int) -> str:
    return f"DeaMoE_{dtype.name}_{num_inputs}"


@functools.cache
def register_reference_ops() -> str:
    """Register the reference op for every dtype and input count; returns the library to load."""
    try:
        from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
    except ImportError:
        raise MissingDependencyError(
            "running plugin-form models on ONNX Runtime needs onnxruntime-extensions "
            "(pip install onnxruntime-extensions)"
        ) from None
    attribute_kinds: dict[int, Any] = {
        AttributeProto.INT: PyCustomOpDef.dt_int64,
        AttributeProto.FLOAT: PyCustomOpDef.dt_float,
        AttributeProto.STRING: PyCustomOpDef.dt_string,
    }
    attrs = {name: attribute_kinds[kind] for name, kind in plugin_node.ATTRIBUTE_TYPES.items()}
    for dtype in DTYPES.values():
        for count in range(2, plugin_node.MAX_INPUTS + 1):
            onnx_op(
                op_type=f"{REFERENCE_DOMAIN}::{reference_op_type(dtype, count)}",
                inputs=[PyCustomOpDef.dt_float] * count,
                outputs=[PyCustomOpDef.dt_float],
                attrs=attrs,
            )(_kernel(dtype))
    return get_library_path()


def _kernel(dtype: ExportDtype) -> Callable[..., np.ndarray]:
    def deamoe_reference(*inputs: np.ndarray, **attrs) -> np.ndarray:
        return run_node(inputs, attrs, dtype)

    return deamoe_reference


def run_node(inputs: tuple[np.ndarray, ...], attrs: dict, dtype: ExportDtype) -> np.ndarray:
    """The reference layer's output for one node's inputs (float32 arrays) and attributes."""
    config = plugin_node.config_from_attributes(attrs)
    quant = plugin_node.quant_from_attributes(attrs, config)
    names = plugin_node.state_keys(config, quant)
    if len(inputs) != 1 + len(names):
        raise UsageError(f"DeaMoE node got {len(inputs)} inputs, its attributes call for {1 + len(names)}")
    # The router arrives in float32 whatever the node holds (float32, or the node's dtype
    # widened losslessly by the Casts around it); routing computes in float32 from the same
    # values either way, so the reference keeps it float32. Codes arrive as float32 byte
    # values (for_reference) and go back to the checkpoint's uint8 exactly.
    layer = DeaMoELayer(config, dtype=dtype.torch, device="meta", router_dtype=torch.float32, quant=quant)
    expected = layer.state_dict()
    state = {}
    for name, array in zip(names, inputs[1:], strict=True):
        if tuple(array.shape) != tuple(expected[name].shape):
            raise UsageError(
                f"DeaMoE input {name} has shape {list(array.shape)}, config needs {list(expected[name].shape)}"
            )
        state[name] = torch.from_numpy(np.asarray(array)).to(expected[name].dtype)
    layer.load_state_dict(state, assign=True)
    x = torch.from_numpy(np.asarray(inputs[0])).to(dtype.torch)
    with torch.no_grad():
        # As the plugin does: no refusal of non-finite tokens, the reference's rule for them
        # (routing.route_logits) and what the math gives.
        out = layer.forward_routed(x, layer.route(x))
    return out.to(dtype.torch).float().numpy()


def has_plugin_nodes(model: onnx.ModelProto) -> bool:
    return any((n.op_type, n.domain) == (plugin_node.OP_TYPE, plugin_node.DOMAIN) for n in model.graph.node)


def for_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of model whose DeaMoE nodes run the reference op (see the module docstring)."""
    model = _copy(model)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    names = _UniqueNames(graph)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if (node.op_type, node.domain) != (plugin_node.OP_TYPE, plugin_node.DOMAIN):
            nodes.append(node)
            continue
        config, quant = plugin_node.node_layer(node)
        dtype = _check_inputs(node, config, quant, initializers)
        plugin_node.add_default_attributes(node)  # the op declares every attribute
        if quant is not None:
            nodes += _codes_as_float_bytes(node, config, quant, graph, initializers, names)
        node.op_type, node.domain = reference_op_type(dtype, len(node.input)), REFERENCE_DOMAIN
        nodes += _in_float32(node, dtype.onnx, names) if dtype.onnx != F32 else [node]
    if any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer):
        # ONNX Runtime's CPU has no bf16 arithmetic; the plugin form's only other nodes are the
        # stack's residual Adds. Summing in float32 and rounding back is what torch does for bf16.
        nodes = [
            m
            for n in nodes
            for m in (_in_float32(n, TensorProto.BFLOAT16, names) if n.op_type in _ARITHMETIC and not n.domain else [n])
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    if any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer):
        _float32_boundary(graph, TensorProto.BFLOAT16)
    model.opset_import.append(helper.make_opsetid(REFERENCE_DOMAIN, 1))
    return model


_ARITHMETIC = ("Add", "Sub", "Mul", "Div")


class _UniqueNames:
    """Fresh node/value names for a graph being rewritten (its nodes may be unnamed)."""

    def __init__(self, graph: onnx.GraphProto):
        self.used = {n.name for n in graph.node} | {v for n in graph.node for v in (*n.input, *n.output)}
        self.used |= {v.name for v in (*graph.input, *graph.output, *graph.initializer)}

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name


def _in_float32(node: onnx.NodeProto, elem_type: int, names: _UniqueNames) -> list[onnx.NodeProto]:
    """node fed float32 copies of its inputs, its output cast back to elem_type (the node edited in place)."""
    label = node.name or node.op_type
    casts = []
    for i, value in enumerate(list(node.input)):
        node.input[i] = names(f"{value}.as_float32")
        casts.append(helper.make_node("Cast", [value], [node.input[i]], to=F32, name=names(f"{label}.in{i}.cast")))
    output = node.output[0]
    node.output[0] = names(f"{output}.as_float32")
    back = helper.make_node("Cast", [node.output[0]], [output], to=elem_type, name=names(f"{label}.out.cast"))
    return [*casts, node, back]


def _check_inputs(node: onnx.NodeProto, config, quant, initializers: dict[str, TensorProto]) -> ExportDtype:
    """The node's dtype (its FFN weights' or scales'), with every weight initializer's shape
    and type checked against config and quant: one type for the FFN weights and scales,
    int32 codes, router.bias float32, router.weight float32 or the FFN weights' type
    (plugins/deamoe/README.md)."""
    dtypes, router_type = set(), None
    for item, value in zip(contract.present_inputs(config, quant)[1:], node.input[1:], strict=True):
        tensor = initializers.get(value)
        if tensor is None:
            continue  # computed by other nodes: shapes are checked when it runs
        name, shape = item.name, contract.shape_of(item, config, 0, quant)
        if tuple(tensor.dims) != shape:
            raise UsageError(
                f"DeaMoE node {node.name!r}: input {name} ({value}) has shape {list(tensor.dims)}, "
                f"its attributes call for {list(shape)}"
            )
        kind = contract.dtype_of(item, quant)
        if kind == contract.FLOAT32:
            if tensor.data_type != F32:
                raise UsageError(f"DeaMoE node {node.name!r}: {name} must be float32 (the contract)")
        elif kind == contract.CODES_DTYPE:
            if tensor.data_type != CODE_TYPE:
                raise UsageError(
                    f"DeaMoE node {node.name!r}: {name} of a quantized node must be {contract.CODES_DTYPE} codes "
                    f"(the contract), got {TensorProto.DataType.Name(tensor.data_type).lower()}"
                )
        elif kind == contract.FLOAT32_OR_ACTIVATION:
            router_type = tensor.data_type
        else:
            dtypes.add(tensor.data_type)
    if len(dtypes) > 1:
        raise UsageError(f"DeaMoE node {node.name!r}: weight inputs mix element types; the contract wants one")
    dtype = dtype_of_onnx(dtypes.pop()) if dtypes else DTYPES["fp32"]
    if dtype is None:
        raise UsageError(f"DeaMoE node {node.name!r}: weights must be float32, float16 or bfloat16")
    if router_type not in (None, F32, dtype.onnx):
        raise UsageError(
            f"DeaMoE node {node.name!r}: router.weight must be float32 or {dtype.name} like the other weights"
        )
    return dtype


def _codes_as_float_bytes(
    node: onnx.NodeProto, config, quant, graph: onnx.GraphProto, initializers: dict[str, TensorProto], names
) -> list[onnx.NodeProto]:
    """Each codes input of node (int32 words) replaced by the same bytes as a uint8 tensor,
    cast to float32 (the node edited in place); returns the Casts, to run before it. The
    uint8 tensor reuses the words' raw or external data as it is: nothing is decoded."""
    casts = []
    for i, item in enumerate(contract.present_inputs(config, quant)):
        if contract.dtype_of(item, quant) != contract.CODES_DTYPE:
            continue
        words = initializers.get(node.input[i])
        if words is None:
            raise UsageError(f"DeaMoE node {node.name!r}: {item.name} must be an initializer to run on ONNX Runtime")
        dims = [*words.dims[:-1], words.dims[-1] * CODE_WORD_BYTES]
        codes = TensorProto(name=names(f"{node.input[i]}.bytes"), data_type=TensorProto.UINT8, dims=dims)
        if words.data_location == TensorProto.EXTERNAL:
            codes.data_location = TensorProto.EXTERNAL
            codes.external_data.extend(words.external_data)
        else:
            codes.raw_data = onnx.numpy_helper.to_array(words).astype("<i4", copy=False).tobytes()
        graph.initializer.append(codes)
        value = names(f"{codes.name}.as_float32")
        casts.append(helper.make_node("Cast", [codes.name], [value], to=F32, name=names(f"{value}.cast")))
        node.input[i] = value
    return casts


def _float32_boundary(graph: onnx.GraphProto, elem_type: int) -> None:
    """Graph inputs/outputs of elem_type become float32, with Casts to and from elem_type inside."""
    head, tail = [], []
    for value in graph.input:
        if value.type.tensor_type.elem_type == elem_type:
            inner = f"{value.name}.{TensorProto.DataType.Name(elem_type).lower()}"
            _rename_reads(graph, value.name, inner)
            head.append(
                helper.make_node("Cast", [value.name], [inner], to=elem_type, name=f"{value.name}.boundary_in.cast")
            )
            value.type.tensor_type.elem_type = F32
    for value in graph.output:
        if value.type.tensor_type.elem_type == elem_type:
            inner = f"{value.name}.{TensorProto.DataType.Name(elem_type).lower()}"
            for node in graph.node:
                node.output[:] = [inner if o == value.name else o for o in node.output]
            _rename_reads(graph, value.name, inner)
            tail.append(helper.make_node("Cast", [inner], [value.name], to=F32, name=f"{value.name}.boundary_out.cast"))
            value.type.tensor_type.elem_type = F32
    nodes = head + list(graph.node) + tail
    del graph.node[:]
    graph.node.extend(nodes)


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
