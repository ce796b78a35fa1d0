"""Shared checks for the runtime tests: a runtime's layer output against the spec's math
(tests/spec_reference.py, float64 from the layer's own weights), and its decoder's logits
against the PyTorch language model run over the whole sequence without a cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deamoe_trt import PRESETS, DeaMoELayer, DeaMoEStack
from deamoe_trt.inputs import random_hidden
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.runtimes.expected import relative_error
from spec_reference import spec_forward


def canonical(layer: DeaMoELayer) -> dict:
    return {name: t.detach().cpu().double().numpy() for name, t in layer.state_dict().items()}


def spec_stack(stack: DeaMoEStack, x: np.ndarray) -> np.ndarray:
    """x <- x + layer(x) for each layer, in the spec's float64 math."""
    for layer in stack.layers:
        x = x + spec_forward(x, canonical(layer), layer.config)
    return x


@pytest.fixture
def layer_errors():
    """errors(runtime, dtype, ...): the relative error of the runtime's output against the
    spec's, per token count (a layer; with layers=N, a stack of N)."""

    def errors(runtime, dtype, *, config=PRESETS["tiny"], tokens=(1, 5), layers=0, **options) -> list[float]:
        if layers:
            module = DeaMoEStack.random(config, layers, seed=7, dtype=dtype)
        else:
            module = DeaMoELayer.random(config, seed=7, dtype=dtype)
        prepared = runtime.prepare(module, **options)
        out = []
        for t in tokens:
            x = random_hidden(t, config.hidden_size, seed=t, dtype=dtype)
            x64 = x.double().numpy()
            want = spec_stack(module, x64) if layers else spec_forward(x64, canonical(module), config)
            got = prepared(x)
            assert got.shape == x.shape and got.dtype == dtype
            out.append(relative_error(got, torch.from_numpy(want)))
        return out

    return errors


def _relative_gap(got: np.ndarray, model, ids: list[int]) -> float:
    """|got - logits| / max |logits| at the last of ids, the model run over all of ids without a cache."""
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].float().numpy()
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture
def decoder_gap():
    """gap(runtime, twin=...): the largest relative logits gap over a prefill and three steps of
    the runtime's decoder for the tiny sample model (or that twin of it), against the PyTorch
    model (the same twin) run over the whole sequence so far, without a cache."""
    from deamoe_trt.lm import load_lm

    def gap(runtime, twin: str = "deamoe", **options) -> float:
        model = load_lm(TINY_LM).model
        decoder = runtime.decoder(model, twin=twin, **options)
        reference = model.twin(twin)
        ids = list(b"The tiny model ")
        worst = _relative_gap(decoder.prefill(ids), reference, ids)
        for token in b"say":
            ids.append(token)
            worst = max(worst, _relative_gap(decoder.step(token), reference, ids))
        return worst

    return gap


@pytest.fixture
def pool_gap():
    """gap(runtime): two decoders of one decoder_pool, stepped in turn on different prompts
    (one cache each over shared weights); the largest relative logits gap of either against
    the uncached PyTorch model on its own sequence. Both go back to the pool at the end."""
    from deamoe_trt.lm import load_lm

    def gap(runtime, **options) -> float:
        model = load_lm(TINY_LM).model
        pool = runtime.decoder_pool(model, size=2, **options)
        decoders = [pool.acquire(), pool.acquire()]
        sequences = [list(b"The tiny model "), list(b"Once upon a time, ")]
        worst = 0.0
        for decoder, ids in zip(decoders, sequences, strict=True):
            worst = max(worst, _relative_gap(decoder.prefill(ids), model, ids))
        for token in b"and":
            for decoder, ids in zip(decoders, sequences, strict=True):
                ids.append(token)
                worst = max(worst, _relative_gap(decoder.step(token), model, ids))
        for decoder in decoders:
            pool.release(decoder)
        return worst

    return gap


@pytest.fixture(autouse=True)
def _one_torch_thread(one_thread):
    """Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine."""
