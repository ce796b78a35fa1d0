"""Inputs for demos, validation, calibration and benchmarks: random hidden states, and each
layer's inputs in a stack."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .layer import DeaMoEStack

# Weights are drawn from torch.Generator().manual_seed(seed); inputs drawn from the same
# stream would repeat the router's rows and route every token with a weight of ~1.
_INPUT_STREAM = 0x5EED_1A7E


def input_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(_INPUT_STREAM + seed)


def random_hidden(tokens: int, hidden: int, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[tokens, hidden] unit-variance activations, as a normalised residual stream is."""
    from .resources import check_fits

    check_fits(tokens * hidden * 8, f"{tokens:,} random tokens of width {hidden}")  # float32, then dtype
    return torch.randn(tokens, hidden, generator=input_generator(seed)).to(dtype)


def stack_hidden(stack: DeaMoEStack, x: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's input in a stack (x <- x + layer(x)) starting from x."""
    out = []
    with torch.no_grad():
        for layer in stack.layers:
            out.append(x)
            x = x + layer(x)
    return out
