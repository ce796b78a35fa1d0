"""Prefill + decode with a KV cache, on any runtime, and the time per output token (TPOT).

A runtime is a `Decoder`: prefill(prompt ids) returns the last position's logits and
keeps the cache; step(token) feeds one token and returns its logits. The loop, the
sampler and the clock are shared, so PyTorch, ONNX Runtime and TensorRT are timed alike:

- TTFT (time to first token): prefill of the prompt plus picking the first new token;
- TPOT (time per output token): mean wall time of each later decode step (feed one
  token, read logits, pick the next), i.e. (total - TTFT) / (new tokens - 1).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..console import format_table
from ..errors import UsageError
from .base import Decoder


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (argmax, ties to the lower id); else softmax(logits / T) over the
    top_k largest logits (0: all), drawn from numpy's PCG64 seeded with seed."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        return f"temperature {self.temperature:g}, top-k {self.top_k or 'all'}, seed {self.seed}"


def pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    if sampling.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scaled.size:
        cutoff = np.partition(scaled, -sampling.top_k)[-sampling.top_k]
        scaled = np.where(scaled >= cutoff, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    return int(rng.choice(scaled.size, p=probs / probs.sum()))


@dataclass
class Generation:
    runtime: str
    model: str
    prompt_ids: list[int]
    new_ids: list[int]
    ttft_s: float
    step_s: list[float] = field(default_factory=list)
    stopped: str = "max_new_tokens"  # or "context": the cache is full

    @property
    def tpot_s(self) -> float | None:
        return statistics.fmean(self.step_s) if self.step_s else None


def check_prompt(prompt_ids: list[int], max_context: int) -> None:
    if not prompt_ids:
        raise UsageError("the prompt is empty; give at least one character")
    if len(prompt_ids) >= max_context:
        raise UsageError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context (its KV cache) holds "
            f"{max_context} and needs room for at least one new token; shorten the prompt to {max_context - 1} "
            "characters or fewer"
        )


def generate(
    decoder: Decoder,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    sampling: Sampling | None = None,
    model: str = "deamoe",
    on_token: Callable[[int], None] | None = None,
) -> Generation:
    """Prefill prompt_ids, then decode up to max_new_tokens (fewer if the context fills up:
    prompt + new tokens never exceed the context). on_token(id) is called as each token is
    picked (to stream it), outside the timed part."""
    sampling = sampling or Sampling()
    check_prompt(prompt_ids, decoder.max_context)
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    budget = min(max_new_tokens, decoder.max_context - len(prompt_ids))
    rng = np.random.default_rng(sampling.seed)
    start = time.perf_counter()
    token = pick(decoder.prefill(list(prompt_ids)), sampling, rng)
    result = Generation(decoder.name, model, list(prompt_ids), [token], time.perf_counter() - start)
    if on_token is not None:
        on_token(token)
    while len(result.new_ids) < budget:
        start = time.perf_counter()
        token = pick(decoder.step(token), sampling, rng)
        result.step_s.append(time.perf_counter() - start)
        result.new_ids.append(token)
        if on_token is not None:
            on_token(token)
    if budget < max_new_tokens:
        result.stopped = "context"
    return result


def warm_up(decoder: Decoder, prompt_ids: list[int], steps: int = 2) -> None:
    """One short untimed run, so first-call costs (allocations, kernel selection) stay out of TPOT."""
    decoder.prefill(list(prompt_ids[: decoder.max_context - steps - 1]))
    token = 0
    for _ in range(steps):
        decoder.step(token)


def timing_table(results: list[Generation], *, title: str | None = None) -> str:
    rows = []
    for r in results:
        tpot = r.tpot_s
        rows.append(
            (
                r.runtime,
                r.model,
                len(r.prompt_ids),
                len(r.new_ids),
                f"{r.ttft_s * 1e3:.2f}",
                f"{tpot * 1e3:.3f}" if tpot else "n/a",
                f"{1.0 / tpot:.1f}" if tpot else "n/a",
            )
        )
    return format_table(
        ("runtime", "model", "prompt tokens", "new tokens", "TTFT ms", "TPOT ms", "tokens/s"),
        rows,
        title=title or "Time per output token (TPOT: mean of the decode steps after the first token)",
    )
