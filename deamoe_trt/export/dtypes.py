"""The export dtypes under their CLI names, with the torch and ONNX types each stands for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import dtypes as base_dtypes
from ..errors import UsageError


@dataclass(frozen=True)
class ExportDtype:
    name: str  # as on the command line and in recipes: fp32, fp16, bf16
    torch: torch.dtype
    onnx: int  # TensorProto element type
    numpy: type  # what ONNX Runtime is fed (bf16: its raw 16-bit pattern)
    forms: tuple[str, ...]  # forms that can carry it


# bf16 only for the plugin form: ONNX Runtime's CPU kernels (MatMul, MoE) have no bf16, so the
# ort and onnx forms could not be run or validated in bf16; TensorRT's plugin can.
_FORMS = {"fp32": ("plugin", "ort", "onnx"), "fp16": ("plugin", "ort", "onnx"), "bf16": ("plugin",)}
DTYPES: dict[str, ExportDtype] = {
    d.name: ExportDtype(d.name, d.torch, d.onnx, d.numpy, _FORMS[d.name]) for d in base_dtypes.DTYPES
}


def get_dtype(name: str, form: str | None = None) -> ExportDtype:
    """The dtype called name, checked against what form supports."""
    if isinstance(name, ExportDtype):
        name = name.name
    dtype = DTYPES.get(name)
    if dtype is None:
        raise UsageError(f"unknown dtype {name!r}; choose one of: {', '.join(DTYPES)}")
    if form is not None and form not in dtype.forms:
        supported = ", ".join(n for n, d in DTYPES.items() if form in d.forms)
        raise UsageError(f"the {form} form does not support {name}; it supports: {supported}")
    return dtype


def dtype_of_onnx(elem_type: int) -> ExportDtype | None:
    row = base_dtypes.of_onnx(elem_type)
    return None if row is None else DTYPES[row.name]


def to_numpy(tensor: torch.Tensor, dtype: ExportDtype) -> np.ndarray:
    """tensor cast to dtype as a numpy array; bf16 travels as its raw 16-bit pattern (numpy has no bf16).

    Strided views stay views: tobytes() writes them in C order with one copy, where making
    them contiguous first would hold a second copy of weights that can be gigabytes."""
    t = tensor.detach().to("cpu", dtype.torch)
    if dtype.torch is torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
