"""The CUDA kernels as a runtime: on a GPU, the spec's output in every dtype; anywhere, the
same code path on the SIMT-emulated library (the kernel source compiled for the CPU)."""

import pytest
import torch

from deamoe_trt import runtimes
from deamoe_trt.runtimes.cuda import CudaRuntime
from deamoe_trt.runtimes.expected import TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_output_on_the_gpu_matches_the_spec(layer_errors, dtype):
    runtime = runtimes.get("cuda")
    if reason := runtime.available():
        pytest.skip(reason)
    assert max(layer_errors(runtime, dtype, tokens=(1, 5, 17))) < TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_and_stack_output_on_the_emulated_library_match_the_spec(emulated_lib, layer_errors, dtype):
    runtime = CudaRuntime.emulated(emulated_lib._name)
    assert runtime.available() is None
    assert max(layer_errors(runtime, dtype, tokens=(1, 3))) < TOLERANCE[dtype]
    assert max(layer_errors(runtime, dtype, tokens=(2,), layers=2)) < TOLERANCE[dtype]
    assert runtime.time_each(lambda i: None, 3) and len(runtime.time_each(lambda i: None, 3)) == 3
