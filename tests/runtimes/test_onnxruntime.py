"""ONNX Runtime as a runtime: the layer's `ort` form gives the spec's output in fp32 and fp16,
and its decoder (the exported language model) the uncached model's logits."""

import pytest
import torch

from deamoe_trt import UsageError, runtimes
from deamoe_trt.runtimes.expected import TOLERANCE

RUNTIME = runtimes.get("ort")


@pytest.fixture(autouse=True)
def _needs_onnxruntime():
    if reason := RUNTIME.available():
        pytest.skip(reason)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_output_matches_the_spec_within_the_dtype_tolerance(layer_errors, dtype):
    assert max(layer_errors(RUNTIME, dtype, threads=1)) < TOLERANCE[dtype]


def test_a_stack_is_refused_in_one_line():
    from deamoe_trt import PRESETS, DeaMoEStack

    with pytest.raises(UsageError, match="a stack is not exported as one graph"):
        RUNTIME.prepare(DeaMoEStack.random(PRESETS["tiny"], 2))


def test_decoder_matches_the_uncached_model(decoder_gap):
    assert decoder_gap(RUNTIME, threads=1) < 1e-4


@pytest.mark.parametrize("twin", ["expanded", "vanilla"])
def test_decoder_runs_the_twin_it_is_asked_for(decoder_gap, twin):
    assert decoder_gap(RUNTIME, twin=twin, threads=1) < 1e-4


def test_decoders_of_one_pool_keep_their_own_caches(pool_gap):
    assert pool_gap(RUNTIME, threads=1) < 1e-4
