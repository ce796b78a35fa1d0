"""A checkpoint tensor made from source tensors by a function: the whole-model importer's
recipe for layouts that are not a copy (gpt-oss's interleaved, transposed or MXFP4 experts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..safetensors_io import ST_DTYPES


@dataclass(frozen=True)
class Source:
    name: str
    shape: tuple[int, ...]
    dtypes: tuple[str, ...] = tuple(ST_DTYPES)  # safetensors dtype names it may have


@dataclass(frozen=True)
class Derived:
    """make(*source tensors) yields the output tensor's pieces in C order (e.g. one expert at
    a time), so that peak memory stays near the sources' size."""

    sources: tuple[Source, ...]
    make: Callable[..., Iterable[torch.Tensor]]


def transformed(source: str, shape: tuple[int, ...], fn: Callable[[torch.Tensor], torch.Tensor]) -> Derived:
    """The tensor fn(source) for one source tensor of that shape; fn must be exact (a reshape,
    a row permutation: no rounding)."""
    return Derived((Source(source, tuple(shape)),), lambda t: (fn(t),))
