"""TensorRT as a runtime: with TensorRT and a GPU, the layer's engine gives the spec's output;
without them, it says which is missing."""

import pytest
import torch

from deamoe_trt import runtimes
from deamoe_trt.runtimes.expected import TOLERANCE

RUNTIME = runtimes.get("tensorrt")


def test_says_what_is_missing_or_runs():
    reason = RUNTIME.available()
    assert reason is None or "TensorRT" in reason or "CUDA" in reason


@pytest.mark.trt
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_engine_output_matches_the_spec(layer_errors, dtype):
    if reason := RUNTIME.available():
        pytest.skip(reason)
    assert max(layer_errors(RUNTIME, dtype, tokens=(1, 5))) < TOLERANCE[dtype]
