"""The PyTorch reference as a runtime: the spec's output in every dtype, layer and stack."""

import pytest
import torch

from deamoe_trt import runtimes
from deamoe_trt.runtimes.expected import TOLERANCE

RUNTIME = runtimes.get("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_output_matches_the_spec_within_the_dtype_tolerance(layer_errors, dtype):
    assert max(layer_errors(RUNTIME, dtype)) < TOLERANCE[dtype]


def test_stack_output_matches_the_spec(layer_errors):
    assert max(layer_errors(RUNTIME, torch.float32, layers=2)) < TOLERANCE[torch.float32]


def test_prepare_casts_to_the_dtype_asked_for():
    from deamoe_trt import PRESETS, DeaMoELayer

    prepared = RUNTIME.prepare(DeaMoELayer.random(PRESETS["tiny"], seed=0), dtype=torch.float16)
    assert prepared(torch.zeros(2, PRESETS["tiny"].hidden_size, dtype=torch.float16)).dtype == torch.float16


def test_decoder_matches_the_uncached_model(decoder_gap):
    assert decoder_gap(RUNTIME) < 1e-4


@pytest.mark.parametrize("twin", ["expanded", "vanilla"])
def test_decoder_runs_the_twin_it_is_asked_for(decoder_gap, twin):
    assert decoder_gap(RUNTIME, twin=twin) < 1e-4


def test_decoders_of_one_pool_keep_their_own_caches(pool_gap):
    assert pool_gap(RUNTIME) < 1e-4
