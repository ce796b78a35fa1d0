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
    return {name: t.detach().double().numpy() for name, t in layer.state_dict().items()}


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


@pytest.fixture
def decoder_gap():
    """gap(runtime): the largest |logits - reference| / max |reference| over a prefill and
    three steps of the runtime's decoder for the tiny sample model, where the reference is
    the PyTorch model run over the whole sequence so far, without a cache."""
    from deamoe_trt.lm import load_lm

    def gap(runtime, **options) -> float:
        model = load_lm(TINY_LM).model
        decoder = runtime.decoder(model, **options)
        ids = list(b"The tiny model ")
        worst = 0.0
        for token in [None, *b"say"]:
            if token is None:
                got = decoder.prefill(ids)
            else:
                ids.append(token)
                got = decoder.step(token)
            with torch.no_grad():
                want = model(torch.tensor([ids])).logits[0, -1].float().numpy()
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        return worst

    return gap


@pytest.fixture(autouse=True)
def _one_torch_thread(one_thread):
    """Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine."""
