"""Deterministic torch on a fixed number of CPU threads, for training and conversion runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.utils.deterministic


@contextlib.contextmanager
def deterministic_threads(threads: int) -> Iterator[None]:
    """torch with deterministic algorithms on `threads` threads; the previous settings after.

    Deterministic mode also fills every new tensor with NaN by default, to expose reads of
    uninitialised memory; that costs about a third of a training step on a CPU and changes no
    result, so it is off here."""
    saved = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]  # type: ignore[attr-defined]
