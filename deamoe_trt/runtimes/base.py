"""The runtime interface: what every runtime of deamoe_trt.runtimes implements.

A runtime takes a DeaMoE layer (or stack) the PyTorch reference defines and runs its
forward pass its own way. `prepare` does the one-off work (packing, export, engine build)
and returns a `Prepared`: `run` is the step a benchmark times, on an input already in the
runtime's form (`to_input`, untimed), and `to_torch` turns its output back for checks. A
runtime that also decodes whole language models has a `decoder`, a `Decoder` (prefill a
prompt, then step one token at a time, each returning the last position's logits), which
deamoe_trt.runtimes.decode's loop drives and times; the others raise a UsageError saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import MissingDependencyError, UsageError


def identity(x: Any) -> Any:
    return x


@dataclass
class Prepared:
    """A module made ready on one runtime."""

    runtime: str
    run: Callable[[Any], Any]  # one step on an input in the runtime's form
    to_input: Callable[[torch.Tensor], Any] = identity  # torch input -> the runtime's form (not timed)
    to_torch: Callable[[Any], torch.Tensor] = identity  # the runtime's output -> torch
    memory_bytes: int = 0  # what the runtime holds of its own (0: it runs the module's tensors)
    info: dict = field(default_factory=dict)  # facts for reports: threads, SIMD, builder...
    keep_alive: Any = None  # whatever run needs alive (a session's weight arrays, an engine)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_torch(self.run(self.to_input(x)))


class Decoder(Protocol):
    """One sequence on a runtime: prefill(prompt ids) keeps its KV cache and returns the last
    position's logits; step(token) feeds one token and returns its logits."""

    name: str  # the runtime, for tables
    max_context: int

    def prefill(self, ids: list[int]) -> np.ndarray: ...

    def step(self, token: int) -> np.ndarray: ...


@dataclass
class DecoderPool:
    """Decoders of one model over one copy of its weights, one KV cache each (a server's
    sequences): acquire() one per sequence, release() it when the sequence ends."""

    acquire: Callable[[], Decoder]
    release: Callable[[Decoder], None] = lambda decoder: None
    keep_alive: Any = None  # what the decoders share (a session's weight arrays, a folder)


class Runtime(Protocol):
    name: str  # registry key and the name in result files: "cpu", "ort"...
    label: str  # for tables: "deamoe-trt CPU kernel"
    dtypes: tuple[torch.dtype, ...]  # weight dtypes it runs

    def available(self) -> str | None:
        """None when it can run here; otherwise one line saying what is missing."""
        ...

    def prepare(
        self,
        module,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        threads: int | None = None,
        **options: Any,
    ) -> Prepared:
        """module (a DeaMoELayer or DeaMoEStack; cast to dtype when given) ready on this runtime."""
        ...

    def decoder(self, model, *, threads: int | None = None, twin: str = "deamoe", **options: Any) -> Decoder:
        """A Decoder for the language model (a DeaMoELM) on this runtime; twin "expanded" or
        "vanilla" decodes that twin of it (DeaMoELM.twin) in its place."""
        ...

    def decoder_pool(self, model, *, threads: int | None = None, size: int = 1, **options: Any) -> DecoderPool:
        """Decoders for up to size sequences at once sharing the model's weights on this runtime."""
        ...


class RuntimeBase:
    """Defaults shared by the implementations: availability from `available()`, no decoder."""

    name = ""
    label = ""
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

    def available(self) -> str | None:
        return None

    def require(self) -> None:
        """MissingDependencyError with available()'s reason when this runtime cannot run here."""
        reason = self.available()
        if reason is not None:
            raise MissingDependencyError(f"{self.label}: {reason}")

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in self.dtypes:
            from ..dtypes import of_torch

            names = ", ".join(of_torch(d).name for d in self.dtypes)
            raise UsageError(f"{self.label} runs {names} weights, not {of_torch(dtype).name}")

    def cast(self, module, dtype: torch.dtype | None):
        """module in dtype (itself when it already is), after checking this runtime runs dtype."""
        target = module.dtype if dtype is None else dtype
        self.check_dtype(target)
        return module if module.dtype == target else module.to(target)

    def decoder(self, model, *, threads: int | None = None, twin: str = "deamoe", **options: Any) -> Decoder:
        raise UsageError(f"{self.label} does not decode language models")

    def decoder_pool(self, model, *, threads: int | None = None, size: int = 1, **options: Any) -> DecoderPool:
        raise UsageError(f"{self.label} does not decode language models")

    def __repr__(self) -> str:
        return f"<runtime {self.name}>"


def state_bytes(module) -> int:
    """Bytes of a module's tensors (its state dict)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())
