"""Prefill + decode with a KV cache, on any runtime, and the time per output token (TPOT).

A runtime is a `Decoder`: prefill(prompt ids) returns the last position's logits and
keeps the cache; step(token) feeds one token and returns its logits. The loop, the
sampler and the clock are shared, so PyTorch, ONNX Runtime and TensorRT are timed alike:

- TTFT (time to first token): prefill of the prompt plus picking the first new token;
- TPOT (time per output token): mean wall time of each later decode step (feed one
  token, read logits, pick the next), i.e. (total - TTFT) / (new tokens - 1).

Several prompts decode together on a `BatchDecoder` (`generate_batch`): continuous batching,
a prompt joins (prefill) as soon as a slot is free and leaves when it is done, and every step
feeds one token to each sequence in flight. A sequence's TPOT is then the mean time of the
batched steps it took part in; the batch's throughput is its new tokens over the loop's wall
time.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..console import format_table
from ..errors import UsageError
from .base import BatchDecoder, Decoder


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


@dataclass
class BatchGeneration:
    """Several prompts decoded together: each one's Generation (in the prompts' order) and the
    batch's clock."""

    results: list[Generation]
    wall_s: float  # the whole loop: every prefill, step and pick
    max_sequences: int
    step_s: list[float] = field(default_factory=list)  # each batched step
    step_sizes: list[int] = field(default_factory=list)  # sequences in each step

    @property
    def new_tokens(self) -> int:
        return sum(len(r.new_ids) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        """Aggregate throughput: every sequence's new tokens over the loop's wall time."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def step_tokens_per_s(self) -> float | None:
        """Throughput of the decode steps alone (prefills left out)."""
        total = sum(self.step_s)
        return sum(self.step_sizes) / total if total > 0 else None


@dataclass
class _InFlight:
    index: int
    result: Generation
    budget: int
    rng: np.random.Generator


def generate_batch(
    batch: BatchDecoder,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    *,
    sampling: Sampling | None = None,
    model: str = "deamoe",
    max_sequences: int | None = None,
    on_token: Callable[[int, int], None] | None = None,
) -> BatchGeneration:
    """Decode every prompt (up to max_new_tokens each, fewer where the context fills up) with at
    most max_sequences (default: the batch decoder's maximum) in flight: a prompt joins when a
    sequence leaves. Each sequence samples from its own generator seeded with sampling.seed,
    so it gets the tokens `generate` gives it alone. on_token(prompt index, id) is called as
    each token is picked, outside the timed parts."""
    sampling = sampling or Sampling()
    if not prompts:
        raise UsageError("no prompts to decode; give at least one")
    for ids in prompts:
        check_prompt(list(ids), batch.max_context)
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = batch.max_sequences if max_sequences is None else max_sequences
    if not 1 <= limit <= batch.max_sequences:
        raise UsageError(f"max_sequences must be from 1 to the batch decoder's {batch.max_sequences}, got {limit}")
    waiting = deque(enumerate(prompts))
    active: dict[int, _InFlight] = {}  # sequence handle -> its state
    results: list[Generation | None] = [None] * len(prompts)
    run = BatchGeneration([], 0.0, limit)
    begin = time.perf_counter()

    def emit(flight: _InFlight, token: int) -> None:
        flight.result.new_ids.append(token)
        if on_token is not None:
            on_token(flight.index, token)

    def leave(seq: int) -> None:
        flight = active.pop(seq)
        batch.close(seq)
        if flight.budget < max_new_tokens:
            flight.result.stopped = "context"
        results[flight.index] = flight.result

    while waiting or active:
        while waiting and len(active) < limit:
            index, ids = waiting.popleft()
            rng = np.random.default_rng(sampling.seed)
            start = time.perf_counter()
            seq, logits = batch.open(list(ids))
            token = pick(logits, sampling, rng)
            result = Generation(batch.name, model, list(ids), [], time.perf_counter() - start)
            active[seq] = _InFlight(index, result, min(max_new_tokens, batch.max_context - len(ids)), rng)
            emit(active[seq], token)
            if len(result.new_ids) >= active[seq].budget:
                leave(seq)
        if not active:
            continue
        seqs = list(active)
        start = time.perf_counter()
        rows = batch.step(seqs, [active[s].result.new_ids[-1] for s in seqs])
        tokens = [pick(row, sampling, active[s].rng) for s, row in zip(seqs, rows, strict=True)]
        took = time.perf_counter() - start
        run.step_s.append(took)
        run.step_sizes.append(len(seqs))
        for seq, token in zip(seqs, tokens, strict=True):
            flight = active[seq]
            flight.result.step_s.append(took)
            emit(flight, token)
            if len(flight.result.new_ids) >= flight.budget:
                leave(seq)
    run.wall_s = time.perf_counter() - begin
    run.results = [r for r in results if r is not None]
    return run


def warm_up_batch(batch: BatchDecoder, prompt_ids: list[int], sequences: int, steps: int = 2) -> None:
    """generate_batch's first-call costs (each slot's cache and the batch's scratch) out of its clock."""
    seqs = [batch.open(list(prompt_ids[: batch.max_context - steps - 1]))[0] for _ in range(sequences)]
    for _ in range(steps):
        batch.step(seqs, [0] * len(seqs))
    for seq in seqs:
        batch.close(seq)


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


def batch_table(run: BatchGeneration, *, title: str | None = None) -> str:
    """One row per sequence (TTFT, its TPOT in the batched steps) and the batch's aggregate."""
    rows: list[tuple] = []
    for i, r in enumerate(run.results):
        tpot = r.tpot_s
        rows.append(
            (
                i,
                r.runtime,
                r.model,
                len(r.prompt_ids),
                len(r.new_ids),
                f"{r.ttft_s * 1e3:.2f}",
                f"{tpot * 1e3:.3f}" if tpot else "n/a",
            )
        )
    rows.append(("all", run.results[0].runtime, run.results[0].model, "", run.new_tokens, "", ""))
    steps = run.step_tokens_per_s
    title = title or (
        f"{len(run.results)} sequences, at most {run.max_sequences} at once: {run.tokens_per_s:.1f} tokens/s "
        f"aggregate over {run.wall_s:.3f} s"
        + (f" ({steps:.1f} tokens/s in the decode steps)" if steps else "")
        + "; TPOT: mean of the batched steps a sequence took part in"
    )
    return format_table(
        ("sequence", "runtime", "model", "prompt tokens", "new tokens", "TTFT ms", "TPOT ms"), rows, title=title
    )
