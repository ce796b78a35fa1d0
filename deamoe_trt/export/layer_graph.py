"""One DeaMoE layer appended to a graph under construction, in any of the three forms."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from ..errors import UsageError
from ..layer import DeaMoELayer
from . import onnx_form, ort_form, plugin_form
from .graph import GraphBuilder

FORMS = {"plugin": plugin_form.emit, "ort": ort_form.emit, "onnx": onnx_form.emit}
# Per form, weights its ops read in another layout: name -> fn(tensor) -> (suffix, view, shape).
WEIGHT_LAYOUTS = {"ort": ort_form.WEIGHT_LAYOUTS}
# Forms that take quantized checkpoints: bits -> the element type of their codes' initializers.
QUANTIZED_CODE_TYPES = {"ort": ort_form.code_type, "onnx": onnx_form.code_type, "plugin": plugin_form.code_type}


def check_form(form: str) -> str:
    if form not in FORMS:
        raise UsageError(f"unknown form {form!r}; choose one of: {', '.join(FORMS)}")
    return form


def emit_layer(builder: GraphBuilder, x_name: str, layer: DeaMoELayer, form: str, prefix: str) -> str:
    """Append layer's nodes and weights to builder; returns the name of its output.

    x_name: a [T, d] value of the builder's dtype (reshape [B, S, d] to [B*S, d] around it).
    The output is [T, d], same dtype: the layer's y, without a residual.
    prefix: prepended to the canonical weight names (e.g. "model.layers.3.mlp." gives the
    initializer "model.layers.3.mlp.router.weight") and to every generated name; weights are
    cast to the builder's dtype, except the router's (spec, "Router precision"): router.bias
    and router.logit_bias are stored as float32, and router.weight too when the layer keeps it in float32.
    Names must be new to the graph.
    """
    emit = FORMS[check_form(form)]
    if not isinstance(layer, DeaMoELayer):
        raise UsageError(f"emit_layer needs a DeaMoELayer, got {type(layer).__name__}")
    quant = layer.quant
    layouts = WEIGHT_LAYOUTS.get(form, {})
    weights = {}
    for name, tensor in layer.state_dict().items():
        if not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{prefix}{name} contains NaN or Inf; refusing to export it")
        stored, shape = name, None
        if name in layouts:
            suffix, tensor, shape = layouts[name](tensor)
            stored = f"{name}.{suffix}"
        if name.endswith(".qweight"):
            # Codes go in as stored: uint8 bytes, the same bytes read as uint4 (ONNX packs
            # uint4 two per byte, low nibble first, as the checkpoint does), or as the plugin
            # node's little-endian int32 words.
            elem_type = QUANTIZED_CODE_TYPES[form](quant.bits)
            dims = list(tensor.shape) if shape is None else list(shape)
            array = tensor.detach().cpu().numpy()
            if elem_type == TensorProto.UINT4:
                dims = [*dims[:-1], dims[-1] * 2]
            elif elem_type == plugin_form.CODE_TYPE:
                array = np.ascontiguousarray(array).view("<i4")
                dims = [*dims[:-1], dims[-1] // plugin_form.CODE_WORD_BYTES]
            weights[name] = builder.add_initializer(f"{prefix}{stored}", array, elem_type, dims)
        else:
            weights[name] = builder.weight(f"{prefix}{stored}", tensor, _stored_dtype(name, tensor), shape=shape)
    with builder.scope(prefix):
        if quant is not None:
            return emit(builder, x_name, weights, layer.config, quant=quant)
        return emit(builder, x_name, weights, layer.config)


def _stored_dtype(name: str, tensor: torch.Tensor) -> str | None:
    """The initializer dtype of a canonical weight: None for the builder's (activation) dtype."""
    if name in ("router.bias", "router.logit_bias") or (name == "router.weight" and tensor.dtype == torch.float32):
        return "fp32"
    return None
