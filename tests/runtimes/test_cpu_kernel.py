"""deamoe-trt's CPU kernel as a runtime: the spec's output in fp32 and fp16, layer and stack,
and a decoder whose logits are the uncached model's."""

import pytest
import torch

from deamoe_trt import runtimes
from deamoe_trt.runtimes.expected import TOLERANCE

RUNTIME = runtimes.get("cpu")


@pytest.fixture(autouse=True)
def _needs_the_kernel():
    if reason := RUNTIME.available():
        pytest.skip(reason)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_output_matches_the_spec_within_the_dtype_tolerance(layer_errors, dtype):
    assert max(layer_errors(RUNTIME, dtype, threads=1)) < TOLERANCE[dtype]


def test_stack_output_matches_the_spec(layer_errors):
    assert max(layer_errors(RUNTIME, torch.float32, layers=2, threads=1)) < TOLERANCE[torch.float32]


def test_prepared_reports_its_memory_and_threads():
    from deamoe_trt import PRESETS, DeaMoELayer
    from deamoe_trt.traffic import layer_bytes

    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    prepared = RUNTIME.prepare(layer, threads=1)
    # Its own packed copy: at least the layer's weights (rows are padded).
    assert prepared.memory_bytes >= layer_bytes(layer.config, torch.float32) > 0
    assert prepared.info["threads"] == 1 and prepared.info["simd"]


def test_decoder_matches_the_uncached_model(decoder_gap):
    assert decoder_gap(RUNTIME, threads=1) < 1e-4


@pytest.mark.parametrize("twin", ["expanded", "vanilla"])
def test_decoder_runs_the_twin_it_is_asked_for(decoder_gap, twin):
    assert decoder_gap(RUNTIME, twin=twin, threads=1) < 1e-4


def test_decoders_of_one_pool_keep_their_own_caches(pool_gap):
    assert pool_gap(RUNTIME, threads=1) < 1e-4
