"""ONNX export of DeaMoE layers in three forms (see export-recipes/README.md at the repository root).

- plugin: each layer as one DeaMoE node for the TensorRT plugin (plugins/deamoe/README.md).
- ort:    stock ONNX Runtime: routing in standard ops, experts in com.microsoft.MoE.
- onnx:   standard ONNX ops only, for any runtime.

API for other parts of the project:
    build_model(module, form, dtype="fp32", opset=None) -> onnx.ModelProto
    export(module, path, form, dtype="fp32", opset=None) -> Path
    emit_layer(builder, x_name, layer, form, prefix) -> output name, with GraphBuilder
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..layer import DeaMoELayer, DeaMoEStack
from .dtypes import DTYPES, ExportDtype, get_dtype
from .graph import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET, GraphBuilder
from .layer_graph import FORMS, emit_layer
from .metadata import INPUT_NAME, OUTPUT_NAME, ExportInfo, export_info, load_model
from .model import build_model
from .save import EXTERNAL_DATA_THRESHOLD, ExternalData, data_path, save_model, save_model_streamed


def export(
    module: DeaMoELayer | DeaMoEStack,
    path: str | Path,
    form: str,
    dtype: str = "fp32",
    opset: int | None = None,
    *,
    max_tokens: int | None = None,
    layer_indices: Sequence[int] | None = None,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> Path:
    """build_model(...) written to path (weights to path.data once they pass the threshold)."""
    model = build_model(module, form, dtype, opset, max_tokens=max_tokens, layer_indices=layer_indices)
    return save_model(model, path, external_data_threshold=external_data_threshold)


__all__ = [
    "DEFAULT_OPSET",
    "DTYPES",
    "EXTERNAL_DATA_THRESHOLD",
    "FORMS",
    "INPUT_NAME",
    "MAX_OPSET",
    "MIN_OPSET",
    "OUTPUT_NAME",
    "ExportDtype",
    "ExportInfo",
    "ExternalData",
    "GraphBuilder",
    "build_model",
    "data_path",
    "emit_layer",
    "export",
    "export_info",
    "get_dtype",
    "load_model",
    "save_model",
    "save_model_streamed",
]
