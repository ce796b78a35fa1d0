"""Whole models: a DeaMoELayer or DeaMoEStack as one ONNX graph with its metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import onnx

from .. import __version__
from ..errors import UsageError
from ..layer import DeaMoELayer, DeaMoEStack
from .dtypes import get_dtype
from .graph import GraphBuilder
from .layer_graph import check_form, emit_layer
from .metadata import INPUT_NAME, OUTPUT_NAME, ExportInfo, quantization_tag
from .onnx_form import export_opset
from .ort_form import is_vanilla


def build_model(
    module: DeaMoELayer | DeaMoEStack,
    form: str,
    dtype: str = "fp32",
    opset: int | None = None,
    *,
    max_tokens: int | None = None,
    layer_indices: Sequence[int] | None = None,
) -> onnx.ModelProto:
    """module as an ONNX model: input hidden_states [T, d], output output [T, d], T dynamic.

    A DeaMoELayer gives output = layer(x), its weights under their canonical names
    ("router.weight", ...). A DeaMoEStack gives x <- x + layer(x) for each layer in turn,
    weights under "layers.{i}.<canonical name>" with i from layer_indices (default 0, 1, ...:
    the exporting checkpoint's indices, recorded in the metadata so validation can find them).
    max_tokens is only recorded (TensorRT builds its optimisation profile from it).
    """
    check_form(form)
    export_dtype = get_dtype(dtype, form)
    layers: list[DeaMoELayer]
    if isinstance(module, DeaMoEStack):
        kind, layers = "stack", [cast(DeaMoELayer, layer) for layer in module.layers]  # a ModuleList's items
    elif isinstance(module, DeaMoELayer):
        kind, layers = "layer", [module]
    else:
        raise UsageError(f"can export a DeaMoELayer or DeaMoEStack, got {type(module).__name__}")
    quant = layers[0].quant
    opset = export_opset(form, opset, quant)
    indices = list(range(len(layers))) if layer_indices is None else [int(i) for i in layer_indices]
    if len(indices) != len(layers) or len(set(indices)) != len(indices) or min(indices) < 0:
        raise UsageError(f"layer_indices must be {len(layers)} distinct indices >= 0, got {list(indices)}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise UsageError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    config = layers[0].config
    hidden = config.hidden_size

    b = GraphBuilder(opset, export_dtype)
    h = b.add_input(INPUT_NAME, ["T", hidden])
    for index, layer in zip(indices, layers, strict=True):
        if kind == "layer":
            h = emit_layer(b, h, layer, form, prefix="")
        else:
            prefix = f"layers.{index}."
            y = emit_layer(b, h, layer, form, prefix=prefix)
            with b.scope(prefix):
                h = b.op("Add", [h, y], name="residual")
    b.add_output(h, ["T", hidden], name=OUTPUT_NAME)

    info = ExportInfo(
        form=form,
        dtype=export_dtype.name,
        module=kind,
        layers=tuple(indices),
        config=config,
        max_tokens=max_tokens,
        ort_routing=("moe-op" if is_vanilla(config) else "graph") if form == "ort" else None,
        quantization=quantization_tag(quant),
    )
    doc = f"DeaMoE {kind} ({len(layers)} layer(s)) in the {form} form, {export_dtype.name}; deamoe-trt {__version__}"
    return b.build(f"deamoe_{kind}_{form}", metadata=info.to_metadata(), doc=doc)
