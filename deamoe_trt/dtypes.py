"""The float types DeaMoE runs in, with every name each layer of the stack gives them.

One row per dtype: the CLI/recipe/export name, the checkpoint name, torch, numpy (storage:
numpy has no bfloat16, so bf16 is carried as its raw 16-bit pattern), ONNX, TensorRT, the
kernels' deamoe::DataType code (contract-checked against deamoeKernels.h) and the bytes
per element. Everything else that maps dtypes derives its mapping from this table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import UsageError


@dataclass(frozen=True)
class Dtype:
    name: str  # fp32, fp16, bf16: command lines, recipes, export metadata
    long_name: str  # float32, float16, bfloat16: checkpoints' config.json, torch's own name
    torch: torch.dtype
    numpy: type  # storage type: float32, float16, or uint16 for bf16's bit pattern
    onnx: int  # onnx.TensorProto element type (checked against onnx in tests/test_dtypes.py)
    trt: str  # tensorrt.DataType member name
    kernel: int  # deamoe::DataType (native/cuda/deamoeKernels.h)
    bytes: int


DTYPES: tuple[Dtype, ...] = (
    Dtype("fp32", "float32", torch.float32, np.float32, 1, "FLOAT", 0, 4),
    Dtype("fp16", "float16", torch.float16, np.float16, 10, "HALF", 1, 2),
    Dtype("bf16", "bfloat16", torch.bfloat16, np.uint16, 16, "BF16", 2, 2),
)
NAMES = tuple(d.name for d in DTYPES)
BY_NAME = {d.name: d for d in DTYPES}
BY_LONG_NAME = {d.long_name: d for d in DTYPES}
BY_TORCH = {d.torch: d for d in DTYPES}
BY_TRT = {d.trt: d for d in DTYPES}
TORCH_DTYPES = tuple(d.torch for d in DTYPES)


def of_torch(dtype: torch.dtype) -> Dtype:
    """The row of a torch dtype; a one-line UsageError for any other type."""
    row = BY_TORCH.get(dtype)
    if row is None:
        raise UsageError(f"dtype {dtype} is not supported; use one of: {', '.join(d.long_name for d in DTYPES)}")
    return row


def of_onnx(elem_type: int) -> Dtype | None:
    return next((d for d in DTYPES if d.onnx == elem_type), None)
