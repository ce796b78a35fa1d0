"""The Python route: DeaMoE as a TensorRT Quickly Deployable Plugin (`tensorrt.plugin`, 10.6+).

For users with a pip-installed TensorRT and no headers to build the C++ library. The
plugin "deamoe_trt::DeaMoE" describes the same node as plugins/deamoe/README.md and runs
the same CUDA kernels, through deamoe_trt.cuda, from a Python callback at every enqueue.

Limits (also in plugins/deamoe/README.md and docs/deploying.md):
- TensorRT 10.6+ (tensorrt.plugin), torch with CUDA and deamoe_trt.cuda at build AND run
  time: the engine calls back into this process's Python, so it runs only where this
  module is imported (no trtexec, no C++ runtime);
- a Python call per layer per step: fine for validation and prototyping, slower than the
  C++ library for decoding.

Two differences from the C++ plugin's node, both bridged by `prepare_model` at build time:
- QDP reserves the empty namespace, so the plugin lives in "deamoe_trt" and each node's
  plugin_namespace attribute is set to it (the ONNX parser matches op_type, plugin_version
  and plugin_namespace);
- a QDP has a fixed list of inputs, so absent optional inputs are filled with a one-element
  placeholder of the node's dtype; the config attributes say which inputs are real.

NOTE: no `from __future__ import annotations` here: tensorrt.plugin reads the annotations
of the decorated functions as classes (TensorDesc, Tensor), not strings.
"""

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper

from .. import contract, dtypes
from ..config import DeaMoEConfig
from ..errors import MissingDependencyError, UsageError
from ..export import plugin_node
from ..quant import QuantConfig

QDP_NAMESPACE = "deamoe_trt"
QDP_NAME = contract.OP_TYPE  # the ONNX parser requires op_type == plugin name
QDP_ID = f"{QDP_NAMESPACE}::{QDP_NAME}"
MIN_TENSORRT = (10, 6)
PLACEHOLDER_PREFIX = "deamoe_trt.qdp.absent."

# The QDP's inputs: hidden_states, then every weight input of the contract in its order.
# (Argument names differ from the inputs': the node has both an input and an attribute
# "router_bias".) The three functions of _define spell these out, because tensorrt.plugin
# reads their signatures; tests/test_contract.py checks them against the contract.
TENSOR_ARGS = tuple(item.qdp_arg for item in contract.INPUTS)
CANONICAL_INPUTS = tuple(item.name for item in contract.INPUTS)

# Attribute -> Python type the QDP declares. Bools travel as ONNX INT, so they are ints here.
# Numeric attributes are declared as 1-D numpy arrays, not int/float: tensorrt.plugin's
# create_plugin turns each PluginField into an attribute with annotation(field.data), and
# field.data is a one-element array, which int()/float() refuse from NumPy 2.4 on ("only
# 0-dimensional arrays can be converted to Python scalars"). An NDArray annotation makes it
# call field.data.astype(dtype) instead (TensorRT 10.6-11.x, plugin/_lib.py), on any NumPy.
INT_ATTR = npt.NDArray[np.int32]
FLOAT_ATTR = npt.NDArray[np.float32]
_PYTHON_TYPES: dict[str, Any] = {"int": INT_ATTR, "bool": INT_ATTR, "float": FLOAT_ATTR, "str": str}
ATTRS: dict[str, Any] = {a.name: _PYTHON_TYPES[a.kind] for a in contract.ATTRIBUTES}

# tensorrt.plugin's names for the contract's dtypes: an activation-dtype input may be any of
# the three, tied by '|' position to the others; a fixed-dtype input is that type only.
_ACTIVATION_TYPES = "FP32|FP16|BF16"
_QDP_TYPES = {contract.ACTIVATION: _ACTIVATION_TYPES, contract.FLOAT32: "FP32", contract.CODES_DTYPE: "INT32"}
# Stands for any quantized node: the inputs' dtypes depend on weight_bits > 0 only.
_QUANTIZED = QuantConfig(8, 16)


def autotune_combinations() -> list[str]:
    """The QDP's type combinations, each input in contract order then the output: for a float
    node and a quantized one (int32 codes), one with every either-dtype input in the
    activation dtype, and one with them float32 (if any)."""
    combinations = []
    for quant in (None, _QUANTIZED):
        for either in (contract.ACTIVATION, contract.FLOAT32):
            dtypes_ = (contract.dtype_of(i, quant) for i in contract.INPUTS)
            types = [_QDP_TYPES[either if d == contract.FLOAT32_OR_ACTIVATION else d] for d in dtypes_]
            combinations.append(", ".join([*types, _ACTIVATION_TYPES]))
    return list(dict.fromkeys(combinations))  # the same twice when no input has either dtype


# ---------------------------------------------------------------------------------------
# The ONNX side (no TensorRT needed: unit-tested everywhere)
# ---------------------------------------------------------------------------------------


def _elem_type_of(model: onnx.ModelProto, name: str) -> int | None:
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return tensor.data_type
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if value.name == name and value.type.HasField("tensor_type"):
            return value.type.tensor_type.elem_type
    return None


# ONNX element types of the contract's fixed input dtypes (activation inputs take the node's).
_FIXED_ELEM_TYPES = {contract.FLOAT32: TensorProto.FLOAT, contract.CODES_DTYPE: TensorProto.INT32}


def _placeholder(model: onnx.ModelProto, elem_type: int, cache: dict[int, str]) -> str:
    """One [1]-element zero initializer per dtype, shared by every absent input of that dtype."""
    if elem_type not in cache:
        name = PLACEHOLDER_PREFIX + TensorProto.DataType.Name(elem_type).lower()
        if elem_type == TensorProto.BFLOAT16:
            tensor = helper.make_tensor(name, elem_type, [1], vals=np.zeros(1, np.uint16).tobytes(), raw=True)
        else:
            dtype = helper.tensor_dtype_to_np_dtype(elem_type)
            tensor = helper.make_tensor(name, elem_type, [1], vals=np.zeros(1, dtype).tobytes(), raw=True)
        model.graph.initializer.append(tensor)
        cache[elem_type] = name
    return cache[elem_type]


def prepare_model(model: onnx.ModelProto) -> int:
    """Retarget every DeaMoE node of model (in place) to the QDP; returns how many there were.

    Each node's attributes are checked against the contract first (config_from_node), so a
    malformed node fails here with the export's own message rather than inside TensorRT.
    """
    count = 0
    cache: dict[int, str] = {}
    for node in model.graph.node:
        if (node.op_type, node.domain) != (plugin_node.OP_TYPE, plugin_node.DOMAIN):
            continue
        config, quant = plugin_node.node_layer(node)
        present = contract.present_inputs(config, quant)
        given = {item.name: name for item, name in zip(present, node.input, strict=True)}
        # The node's dtype: its first weight in it (initializers are typed; hidden_states,
        # another layer's output, may not be), else hidden_states'.
        ordered = (*present[1:], present[0])
        activation = [given[i.name] for i in ordered if contract.dtype_of(i, quant) == contract.ACTIVATION]
        elem_type = next(filter(None, (_elem_type_of(model, name) for name in activation)), None)
        if elem_type is None:
            raise UsageError(f"DeaMoE node {node.name!r}: cannot tell its dtype ({', '.join(activation)} have no type)")
        inputs = [
            given.get(item.name)
            or _placeholder(model, _FIXED_ELEM_TYPES.get(contract.dtype_of(item, quant), elem_type), cache)
            for item in contract.INPUTS
        ]
        del node.input[:]
        node.input.extend(inputs)
        for attr in node.attribute:
            if attr.name == "plugin_namespace":
                attr.s = QDP_NAMESPACE.encode()
        plugin_node.add_default_attributes(node)  # a QDP takes every attribute
        count += 1
    return count


def prepare_model_bytes(path: str | Path) -> tuple[bytes, int]:
    """The model at path retargeted to the QDP, serialised; external weights stay where they are.

    Pass the bytes to OnnxParser.parse(bytes, path) so TensorRT finds the external data
    relative to the original file.
    """
    from ..export.metadata import load_model

    model = load_model(path)  # without external data: only the graph and small tensors
    count = prepare_model(model)
    return model.SerializeToString(), count


# ---------------------------------------------------------------------------------------
# The TensorRT side
# ---------------------------------------------------------------------------------------


def _text(value: str) -> str:
    # The ONNX parser hands STRING attributes over with a trailing NUL, and the QDP creator
    # decodes the whole buffer: "softmax\x00".
    return value.rstrip("\x00")


def _scalar(name: str, value: Any) -> int | float:
    """A numeric attribute as a Python number: tensorrt.plugin gives one-element arrays."""
    array = np.asarray(value)
    if array.size != 1:
        raise UsageError(f"DeaMoE attribute {name} must hold one number, got {array.size}")
    return array.reshape(()).item()


def config_from_attrs(values: dict[str, Any]) -> DeaMoEConfig:
    fields = {}
    for attribute in contract.CONFIG_ATTRIBUTES:
        if attribute.name not in values:
            continue  # an optional attribute the node lacks: DeaMoEConfig's default
        name, value = attribute.name, values[attribute.name]
        fields[name] = _text(value) if attribute.kind == "str" else _scalar(name, value)
        if attribute.kind == "bool":
            fields[name] = bool(fields[name])
    return DeaMoEConfig(**fields)


def quant_from_attrs(values: dict[str, Any], config: DeaMoEConfig) -> QuantConfig | None:
    """The node's quantization (None: float weights), checked as the exporter's reader does."""
    numbers = {a.name: int(_scalar(a.name, values[a.name])) for a in contract.QUANT_ATTRIBUTES}
    return plugin_node.quant_from_attributes(numbers, config)


_registered = False


def register() -> None:
    """Register deamoe_trt::DeaMoE with tensorrt.plugin (idempotent)."""
    global _registered
    if _registered:
        return
    from ._tensorrt import import_tensorrt, tensorrt_version

    trt = import_tensorrt()
    version = tensorrt_version(trt)
    if version < MIN_TENSORRT:
        raise MissingDependencyError(
            f"--plugin python needs TensorRT {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]}+ (tensorrt.plugin); this is "
            f"{trt.__version__}: build the C++ plugin library instead (docs/deploying.md)"
        )
    _check_runtime()
    try:
        import tensorrt.plugin as trtp
    except ImportError as exc:
        raise MissingDependencyError(f"tensorrt.plugin is not importable ({exc}); pip install tensorrt>=10.6") from None
    _define(trtp)
    _registered = True


def _check_runtime() -> None:
    """The callback needs torch with CUDA and the kernel binding; say which is missing."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise MissingDependencyError("--plugin python needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise MissingDependencyError(
            f"--plugin python runs the kernels through torch, and torch {torch.__version__} has no CUDA device "
            "(install a CUDA build of torch; on Jetson, NVIDIA's JetPack wheel)"
        )
    try:
        from ..runtimes import cuda as _  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(f"--plugin python needs deamoe_trt.runtimes.cuda: {exc}") from None


def _define(trtp) -> None:
    """The QDP's three functions. Their parameter names and order are the QDP's schema."""
    TensorDesc, Tensor = trtp.TensorDesc, trtp.Tensor

    @trtp.register(QDP_ID)
    def deamoe_desc(
        hidden_states: TensorDesc,
        router_w: TensorDesc,
        router_b: TensorDesc,
        dept_gate_up: TensorDesc,
        dept_down: TensorDesc,
        expert_gate_up: TensorDesc,
        expert_down: TensorDesc,
        shared_gate_up: TensorDesc,
        shared_down: TensorDesc,
        shared_gate: TensorDesc,
        dept_gate_up_scales: TensorDesc,
        dept_down_scales: TensorDesc,
        expert_gate_up_scales: TensorDesc,
        expert_down_scales: TensorDesc,
        shared_gate_up_scales: TensorDesc,
        shared_down_scales: TensorDesc,
        router_logit_b: TensorDesc,
        dept_gate_up_bias: TensorDesc,
        expert_gate_up_bias: TensorDesc,
        expert_down_bias: TensorDesc,
        shared_gate_up_bias: TensorDesc,
        shared_down_bias: TensorDesc,
        hidden_size: INT_ATTR,
        num_departments: INT_ATTR,
        experts_per_department: INT_ATTR,
        shared_intermediate_size: INT_ATTR,
        private_intermediate_size: INT_ATTR,
        top_k: INT_ATTR,
        top_departments: INT_ATTR,
        score_func: str,
        department_score: str,
        norm_topk_prob: INT_ATTR,
        routed_scaling_factor: FLOAT_ATTR,
        router_bias: INT_ATTR,
        shared_expert_intermediate_size: INT_ATTR,
        shared_expert_gate: INT_ATTR,
        ffn_bias: INT_ATTR,
        activation: str,
        swiglu_alpha: FLOAT_ATTR,
        swiglu_limit: FLOAT_ATTR,
        router_logit_bias: INT_ATTR,
        weight_bits: INT_ATTR,
        weight_group_size: INT_ATTR,
    ) -> TensorDesc:
        # TensorDesc is tensorrt.plugin's class held in a variable, no type to mypy (valid-type).
        return hidden_states.like()  # type: ignore[attr-defined]

    @trtp.autotune(QDP_ID)
    def deamoe_autotune(
        hidden_states: TensorDesc,
        router_w: TensorDesc,
        router_b: TensorDesc,
        dept_gate_up: TensorDesc,
        dept_down: TensorDesc,
        expert_gate_up: TensorDesc,
        expert_down: TensorDesc,
        shared_gate_up: TensorDesc,
        shared_down: TensorDesc,
        shared_gate: TensorDesc,
        dept_gate_up_scales: TensorDesc,
        dept_down_scales: TensorDesc,
        expert_gate_up_scales: TensorDesc,
        expert_down_scales: TensorDesc,
        shared_gate_up_scales: TensorDesc,
        shared_down_scales: TensorDesc,
        router_logit_b: TensorDesc,
        dept_gate_up_bias: TensorDesc,
        expert_gate_up_bias: TensorDesc,
        expert_down_bias: TensorDesc,
        shared_gate_up_bias: TensorDesc,
        shared_down_bias: TensorDesc,
        outputs: tuple[TensorDesc],
    ) -> list[trtp.AutoTuneCombination]:
        # The inputs and the output in one float type ('|' ties the positions together).
        return [trtp.AutoTuneCombination(types) for types in autotune_combinations()]

    @trtp.impl(QDP_ID)
    def deamoe_impl(
        hidden_states: Tensor,
        router_w: Tensor,
        router_b: Tensor,
        dept_gate_up: Tensor,
        dept_down: Tensor,
        expert_gate_up: Tensor,
        expert_down: Tensor,
        shared_gate_up: Tensor,
        shared_down: Tensor,
        shared_gate: Tensor,
        dept_gate_up_scales: Tensor,
        dept_down_scales: Tensor,
        expert_gate_up_scales: Tensor,
        expert_down_scales: Tensor,
        shared_gate_up_scales: Tensor,
        shared_down_scales: Tensor,
        router_logit_b: Tensor,
        dept_gate_up_bias: Tensor,
        expert_gate_up_bias: Tensor,
        expert_down_bias: Tensor,
        shared_gate_up_bias: Tensor,
        shared_down_bias: Tensor,
        hidden_size: INT_ATTR,
        num_departments: INT_ATTR,
        experts_per_department: INT_ATTR,
        shared_intermediate_size: INT_ATTR,
        private_intermediate_size: INT_ATTR,
        top_k: INT_ATTR,
        top_departments: INT_ATTR,
        score_func: str,
        department_score: str,
        norm_topk_prob: INT_ATTR,
        routed_scaling_factor: FLOAT_ATTR,
        router_bias: INT_ATTR,
        shared_expert_intermediate_size: INT_ATTR,
        shared_expert_gate: INT_ATTR,
        ffn_bias: INT_ATTR,
        activation: str,
        swiglu_alpha: FLOAT_ATTR,
        swiglu_limit: FLOAT_ATTR,
        router_logit_bias: INT_ATTR,
        weight_bits: INT_ATTR,
        weight_group_size: INT_ATTR,
        outputs: tuple[Tensor],
        stream: int,
    ) -> None:
        values = locals()
        config = config_from_attrs({name: values[name] for name in ATTRS})
        quant = quant_from_attrs(values, config)
        _run(config, quant, [values[name] for name in TENSOR_ARGS], outputs[0], stream)


# ---------------------------------------------------------------------------------------
# The callback's work: TensorRT's buffers as torch tensors, then the cuda runtime's forward
# ---------------------------------------------------------------------------------------

# trt.DataType name -> (__cuda_array_interface__ typestr, torch dtype). bfloat16 has no
# typestr, so it is wrapped as uint16 and viewed as bfloat16 (tensorrt.plugin.Tensor's own
# __cuda_array_interface__ refuses BF16 for that reason).
# A quantized node's codes arrive as int32 words and are viewed as the checkpoint's bytes.
_TYPES = {d.trt: (np.dtype(d.numpy).str, d.long_name) for d in dtypes.DTYPES} | {"INT32": ("<i4", "int32")}


class _DeviceArray:
    """A bare __cuda_array_interface__ over a TensorRT buffer (contiguous: linear format)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str):
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": typestr,
            "strides": None,
            "version": 3,
        }


def _as_torch(tensor):
    import torch

    typestr, dtype = _TYPES[tensor.dtype.name]
    shape = tuple(int(d) for d in tensor.shape)
    view = torch.as_tensor(_DeviceArray(int(tensor.data_ptr), shape, typestr), device="cuda")
    return view.view(getattr(torch, dtype)) if typestr == "<u2" else view


# The weights of an engine are constants: the same pointers at every step. The layer built
# around them is kept, so a step costs one kernel call, not a module construction.
_layers: dict[tuple, object] = {}


def _layer_for(config: DeaMoEConfig, quant: QuantConfig | None, tensors: list):
    import torch

    from ..layer import DeaMoELayer

    # DeaMoELayer state_dict key -> the tensor carrying it (placeholders of absent inputs left out).
    present = contract.present_inputs(config, quant)
    weights = {
        plugin_node.state_key(item, quant): t
        for item, t in zip(contract.WEIGHT_INPUTS, tensors[1:], strict=True)
        if item in present
    }
    key = (config, quant, tuple((name, int(t.data_ptr), t.dtype.name) for name, t in sorted(weights.items())))
    layer = _layers.get(key)
    if layer is None:
        layer = DeaMoELayer(config, device="meta", quant=quant)
        # Codes: int32 words viewed as the checkpoint's uint8 bytes (last dim x4), no copy.
        state = {name: _as_torch(t) for name, t in weights.items()}
        state = {name: v.view(torch.uint8) if v.dtype == torch.int32 else v for name, v in state.items()}
        layer.load_state_dict(state, assign=True)
        if len(_layers) > 64:  # engines rebuilt in one process: forget the oldest
            _layers.pop(next(iter(_layers)))
        _layers[key] = layer
    return layer


def _run(config: DeaMoEConfig, quant: QuantConfig | None, tensors: list, output, stream: int) -> None:
    import torch

    from ..runtimes.cuda import RUNTIME as kernels

    with torch.no_grad(), torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        hidden = _as_torch(tensors[0])
        out = _as_torch(output)
        if hidden.shape[0] == 0:
            return
        # The cuda runtime runs on torch's current stream, here TensorRT's; its workspace comes
        # from torch's caching allocator on that stream.
        out.copy_(kernels.forward(_layer_for(config, quant, tensors), hidden))
