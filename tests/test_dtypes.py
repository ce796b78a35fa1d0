"""The one dtype table agrees with what torch, numpy and ONNX say about each type."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from deamoe_trt import UsageError, dtypes


@pytest.mark.parametrize("row", dtypes.DTYPES, ids=lambda d: d.name)
def test_row_matches_the_libraries(row):
    assert row.torch.itemsize == row.bytes == np.dtype(row.numpy).itemsize
    assert str(row.torch) == f"torch.{row.long_name}"
    assert TensorProto.DataType.Name(row.onnx) == {"fp32": "FLOAT", "fp16": "FLOAT16", "bf16": "BFLOAT16"}[row.name]
    if row.name != "bf16":  # numpy has no bfloat16: the table stores its bit pattern
        assert helper.tensor_dtype_to_np_dtype(row.onnx) == np.dtype(row.numpy)
        assert torch.zeros(1, dtype=row.torch).numpy().dtype == np.dtype(row.numpy)


def test_lookups():
    assert dtypes.of_torch(torch.float16).name == "fp16"
    assert dtypes.of_onnx(TensorProto.BFLOAT16).name == "bf16"
    assert dtypes.of_onnx(TensorProto.INT64) is None
    with pytest.raises(UsageError, match="float64 is not supported"):
        dtypes.of_torch(torch.float64)
