"""validate(): an exported layer or stack (ONNX, or a TensorRT engine) against the PyTorch
reference of its checkpoint; other exports go to their own validator (VALIDATORS).

validate() = the model loaded on its runtime (runtimes "ort" or "tensorrt": load) and the
reference prepared on "torch", compared on random inputs per token count through the one
adapter (pair.compare_layers). Its report holds one row per output and token count.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import torch
from onnx import external_data_helper, numpy_helper

from .. import runtimes
from ..errors import MissingDependencyError, UsageError
from ..export.dtypes import DTYPES, ExportDtype, dtype_of_onnx, to_numpy
from ..export.metadata import (
    ExportInfo,
    engine_info,
    export_format,
    export_info,
    load_model,
    quantization_tag,
)
from ..export.plugin_node import as_float32
from ..inputs import random_hidden
from ..layer import DeaMoELayer, DeaMoEStack
from ..lm.checkpoint import read
from ..runtimes.base import Prepared
from ..runtimes.onnxruntime import make_session
from .pair import compare_layers, is_engine
from .report import DEFAULT_TOKENS, DEFAULT_TOLERANCES, ValidationReport, ort_cpu_int8_tolerances, tolerances

# The validator of each kind of export other than layers and stacks, by the deamoe_trt.format
# its metadata carries: (module, function), imported when used, so that validation does not
# import the packages built on it (deamoe_trt.validation.lm uses this package's report).
VALIDATORS: dict[str, tuple[str, str]] = {
    "deamoe-trt-lm-onnx": ("deamoe_trt.validation.lm", "validate_lm"),
}


def validate(
    model: str | Path,
    checkpoint: str | Path,
    *,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
    provider: str = "cpu",
    plugin: str | Path | None = None,
    inputs: np.ndarray | None = None,
) -> ValidationReport:
    """Compare model with checkpoint's reference on random inputs of each token count (or on inputs [T, d])."""
    notes: list[str] = []
    if is_engine(model):
        runner, reference, dtype, description = _engine_side(model, checkpoint, plugin)
    else:
        proto = load_model(model)
        other = VALIDATORS.get(export_format(proto))
        if other is not None:  # e.g. a whole language model: its own feeds
            if inputs is not None:
                raise UsageError("--inputs is for layer and stack models; a language model is fed token ids")
            validator = getattr(importlib.import_module(other[0]), other[1])
            return validator(model, checkpoint, tokens=tokens, atol=atol, rtol=rtol, seed=seed, provider=provider)
        info = export_info(proto, str(model))
        reference = reference_module(info, checkpoint)
        check_weights(proto, Path(model), info, reference, checkpoint)
        # The session is made now, so a model ONNX Runtime cannot load fails here in one line.
        runner, dtype = runtimes.get("ort").load(model, provider=provider), DTYPES[info.dtype]
        description = _describe(info)
        if info.form == "ort" and info.quantization and info.quantization.startswith("int8") and provider == "cpu":
            atol, rtol, note = ort_cpu_int8_tolerances(atol, rtol)
            notes.append(note)
        if info.ort_routing == "moe-op":
            notes.append(
                "note: routing by com.microsoft.MoE's own softmax and top-k (vanilla MoE): "
                "ties go to the higher index there, to the lower in the spec"
            )
        if info.max_tokens is not None and max(tokens) > info.max_tokens:
            notes.append(f"note: token counts above the model's max_tokens ({info.max_tokens}) were checked too")
    batches = _inputs(reference.config.hidden_size, dtype, tokens, seed, inputs)
    atol, rtol = tolerances(dtype.name, atol, rtol)
    expected = runtimes.get("torch").prepare(reference)
    rows = compare_layers(runner, expected, batches, atol=atol, rtol=rtol, names=(runner.runtime, "pytorch-reference"))
    return ValidationReport(str(model), str(checkpoint), description, provider, atol, rtol, rows, notes)


def reference_module(info: ExportInfo, checkpoint: str | Path) -> DeaMoELayer | DeaMoEStack:
    """The checkpoint's layers the model holds, as the model runs them, in the model's dtype.

    Checks first that the checkpoint can be the model's: layers, same config, and the layers exist."""
    found = read(checkpoint)
    if found.artifact == "lm":
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: it holds a language model and the model is "
            f"a {info.module} export (a language model's export validates against its checkpoint)"
        )
    header = found.header
    # As a node can say it: the plugin form carries routed_scaling_factor as float32.
    differences = as_float32(info.config).differences(as_float32(header["config"]))
    if differences:
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: {differences[0]} (model vs checkpoint){more}"
        )
    quant = quantization_tag(header["quantization"])
    if quant != info.quantization:
        model_q, ckpt_q = info.quantization or "float weights", quant or "float weights"
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: the model has {model_q}, the checkpoint {ckpt_q} "
            "(validate against the checkpoint it was exported from; `deamoe-trt quantize` reports the "
            "quantization error against the float one)"
        )
    if max(info.layers) >= header["num_layers"]:
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: the model holds layer(s) "
            f"{','.join(map(str, info.layers))} but the checkpoint has {header['num_layers']} layer(s)"
        )
    stack = found.stack()
    dtype = DTYPES[info.dtype].torch
    layers = [stack.layers[i].to(dtype) for i in info.layers]
    return cast(DeaMoELayer, layers[0]) if info.module == "layer" else DeaMoEStack.from_layers(layers)


def check_weights(
    proto: onnx.ModelProto, path: Path, info: ExportInfo, reference: DeaMoELayer | DeaMoEStack, checkpoint
) -> None:
    """Each layer's router weights in the model equal the checkpoint's, bit for bit (cheap; catches
    a model exported from another checkpoint of the same shape before any error table)."""
    initializers = {t.name: t for t in proto.graph.initializer}
    layers = [reference] if info.module == "layer" else list(reference.layers)
    for index, layer in zip(info.layers, layers, strict=True):
        name = "router.weight" if info.module == "layer" else f"layers.{index}.router.weight"
        tensor = initializers.get(name)
        if tensor is None:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor = _loaded(tensor, path.parent)
        # The router is stored in its own precision (float32, or the model's dtype).
        stored = dtype_of_onnx(tensor.data_type) or DTYPES[info.dtype]
        expected = to_numpy(layer.router.weight, stored).tobytes()
        if numpy_helper.to_array(tensor).tobytes() != expected:  # raw_data or typed fields alike
            raise UsageError(
                f"checkpoint {checkpoint} does not match the model: its layer {index} router weights differ "
                f"from the model's {name} (was the model exported from another checkpoint?)"
            )


def _loaded(tensor: onnx.TensorProto, base_dir: Path) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    try:
        external_data_helper.load_external_data_for_tensor(copy, str(base_dir))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the model's external data for {tensor.name}: {exc}") from None
    return copy


def _describe(info: ExportInfo) -> str:
    layers = "one layer" if info.module == "layer" else f"stack of {info.num_layers} layers"
    return f"{info.form} form, {info.dtype}, {layers}"


def engine_runner(model: str | Path, plugin: str | Path | None = None) -> Prepared:
    """The engine at model on the tensorrt runtime, loaded now (the plugin registered first)."""
    try:
        runtime = runtimes.get("tensorrt")
    except ImportError as exc:
        raise MissingDependencyError(
            f"TensorRT engine validation needs deamoe_trt.runtimes.tensorrt and TensorRT (pip install tensorrt): {exc}"
        ) from None
    return runtime.load(model, plugin=None if plugin is None else str(plugin))


def _engine_side(model, checkpoint, plugin):
    """The engine loaded, reference, dtype and description for a TensorRT engine.

    `deamoe-trt build` writes the export's metadata beside the engine: the reference is then
    the layers the engine holds, in its dtype. An engine built elsewhere has none: the whole
    checkpoint, in a dtype read off the engine's input."""
    info = engine_info(model)
    runner = engine_runner(model, plugin)
    if info is not None:
        reference = reference_module(info, checkpoint)
        description = f"TensorRT engine of the {_describe(info)}"
        return runner, reference, DTYPES[info.dtype], description
    stack = DeaMoEStack.from_pretrained(checkpoint)
    # What the engine's input takes, as the loaded engine casts a float32 input to it.
    fed_as = runner.to_input(torch.zeros(1, stack.config.hidden_size)).dtype
    if fed_as == np.float16:
        dtype = DTYPES["fp16"]
    else:  # float32 feeds: an fp32 engine, or a bf16 one fed float32 like the bf16 ONNX models
        dtype = DTYPES["bf16"] if stack.dtype == torch.bfloat16 else DTYPES["fp32"]
    stack.to(dtype.torch)
    reference = stack.layers[0] if len(stack.layers) == 1 else stack
    return runner, reference, dtype, f"TensorRT engine, {dtype.name}"


def _inputs(
    hidden: int, dtype: ExportDtype, tokens: Sequence[int], seed: int, inputs: np.ndarray | None
) -> list[torch.Tensor]:
    """One input per token count (random, unit variance) or the given inputs, in the model's dtype."""
    if inputs is not None:
        batches = [check_inputs(inputs, hidden)]
    else:
        batches = [random_hidden(t, hidden, seed=seed + i, dtype=dtype.torch) for i, t in enumerate(tokens)]
    return [x.to(dtype.torch) for x in batches]


def check_inputs(inputs: np.ndarray, hidden: int) -> torch.Tensor:
    """User-given hidden states: [T, d] floats without NaN/Inf."""
    array = np.asarray(inputs)
    if array.ndim != 2 or array.shape[1] != hidden or array.shape[0] < 1:
        raise UsageError(f"inputs must have shape [T, {hidden}], got {list(array.shape)}")
    if array.dtype.kind != "f":
        raise UsageError(f"inputs must be floating point, got {array.dtype}")
    if not np.isfinite(array).all():
        raise UsageError(f"inputs contain NaN or Inf ({int((~np.isfinite(array)).sum())} element(s))")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


__all__ = ["DEFAULT_TOKENS", "DEFAULT_TOLERANCES", "ValidationReport", "make_session", "validate"]
