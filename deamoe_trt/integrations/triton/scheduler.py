"""Continuous batching at step granularity for the LM decode service (no Triton in here).

One scheduler thread owns the model. Each loop turn it admits waiting requests (prefill,
first token), then advances every active sequence by one decode step, streaming the new
tokens as they come; a sequence leaves as soon as it finishes, is cancelled or fails, and a
new one joins at the next turn without waiting for the others (iteration-level scheduling,
as in Orca and TensorRT-LLM's in-flight batching).

The sequences are those of one `BatchDecoder` (deamoe_trt.runtimes.base: each sequence its
own KV cache, position and length over one set of weights), and a turn's steps are one
batched step: on a runtime with a batched step (the CPU kernel's native step) every weight
is read once for all the sequences in flight; the others step their sequences one after
another (SerialBatchDecoder: the exported LM graph takes a single past length for the whole
batch, so rows with different cache lengths cannot share its forward). Either way every
sequence gets a step per turn and its output is what its prompt decodes to alone.

Streaming: a response per token costs the Python backend, gRPC and the client far more than a
batched step of a small model spends on that token, so with n sequences in flight each
response carries up to ceil(n / responses_per_turn) tokens (a sequence's first token and its
last response go out at once): about responses_per_turn responses a turn whatever the load,
and one per token with few sequences.

Sampling reuses deamoe_trt.runtimes.decode.pick (greedy, temperature, top-k, seeded PCG64) and
adds nucleus (top-p) filtering in front of it.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ...errors import UsageError
from ...runtimes.base import BatchDecoder
from ...runtimes.decode import Sampling, check_prompt, pick

# Finish reasons, as OpenAI-style front ends name them.
LENGTH, STOP, CONTEXT, CANCELLED, ERROR = "length", "stop", "context", "cancelled", "error"


@dataclass(frozen=True)
class GenerationParams:
    """What a request may set. temperature 0: greedy; top_p 1 and top_k 0: no filtering."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise UsageError("stop strings must not be empty")
        _ = self.sampling  # Sampling checks temperature and top_k

    @property
    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_k=self.top_k, seed=self.seed)


def nucleus(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """logits with -inf outside the smallest set of most likely tokens whose probability
    (softmax of logits / temperature) reaches top_p; ties at the edge all stay in."""
    if top_p >= 1.0:
        return logits
    scaled = logits.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    keep = int(np.searchsorted(cumulative, top_p)) + 1  # first index where the mass reaches top_p
    threshold = probs[order[min(keep, probs.size) - 1]]
    return np.where(probs >= threshold, logits, -np.inf)


def next_token(logits: np.ndarray, params: GenerationParams, rng: np.random.Generator) -> int:
    sampling = params.sampling
    if not sampling.greedy:
        logits = nucleus(logits, params.temperature, params.top_p)
    return pick(logits, sampling, rng)


# emit(ids, text, finish_reason or None, error or None): called on the scheduler thread, in order;
# exactly one call has a finish reason and it is the last.
Emit = Callable[[list[int], str, str | None, str | None], None]


@dataclass(eq=False)
class Sequence:
    """One request in flight."""

    prompt_ids: list[int]
    params: GenerationParams
    emit: Emit
    is_cancelled: Callable[[], bool] = lambda: False
    new_ids: list[int] = field(default_factory=list)
    text: str = ""
    held_ids: list[int] = field(default_factory=list)  # generated, not yet emitted
    held_text: str = ""
    seq: int | None = None  # its handle in the batch decoder while it holds a slot
    rng: np.random.Generator | None = None
    budget: int = 0
    submitted_s: float = field(default_factory=time.perf_counter)


class StepScheduler:
    """Runs sequences on one BatchDecoder (each its own KV cache, shared weights).

    Up to batch.max_sequences are in flight (memory: one cache each); the rest wait in order.
    """

    def __init__(
        self,
        batch: BatchDecoder,
        decode_text: Callable[[list[int]], str],
        *,
        on_finish: Callable[[Sequence, str], None] | None = None,
        responses_per_turn: int = 4,
    ):
        if responses_per_turn < 1:
            raise UsageError(f"responses_per_turn must be >= 1, got {responses_per_turn}")
        self.batch, self.decode_text = batch, decode_text
        self.responses_per_turn = responses_per_turn
        self.max_context, self.max_active = batch.max_context, batch.max_sequences
        self.on_finish = on_finish
        self.waiting: queue.Queue[Sequence] = queue.Queue()
        self.active: list[Sequence] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deamoe-step-scheduler", daemon=True)

    def submit(self, sequence: Sequence) -> None:
        """Queue sequence; UsageError (nothing queued) for a prompt this model cannot take."""
        check_prompt(sequence.prompt_ids, self.max_context)
        self.waiting.put(sequence)

    def start(self) -> StepScheduler:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    # The loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit(block=not self.active)
            self._advance()

    def _admit(self, *, block: bool) -> None:
        while len(self.active) < self.max_active:
            try:
                sequence = self.waiting.get(timeout=0.05) if block else self.waiting.get_nowait()
            except queue.Empty:
                return
            block = False
            if sequence.is_cancelled():
                self._finish(sequence, CANCELLED)
                continue
            try:
                sequence.rng = np.random.default_rng(sequence.params.seed)
                sequence.budget = min(sequence.params.max_tokens, self.max_context - len(sequence.prompt_ids))
                sequence.seq, logits = self.batch.open(list(sequence.prompt_ids))
                token = next_token(logits, sequence.params, sequence.rng)
            except Exception as exc:  # a failure of this request must not stop the others
                self._finish(sequence, ERROR, error=f"{type(exc).__name__}: {exc}")
                continue
            self.active.append(sequence)
            self._emit_token(sequence, token)

    def _advance(self) -> None:
        """One batched step for every active sequence not cancelled."""
        for sequence in list(self.active):
            if sequence.is_cancelled():
                self._finish(sequence, CANCELLED)
        stepping = list(self.active)
        if not stepping:
            return
        try:
            # every active sequence holds a slot, so its seq is set
            rows = self.batch.step([cast(int, s.seq) for s in stepping], [s.new_ids[-1] for s in stepping])
        except Exception as exc:  # the step's sequences fail; the server goes on with new ones
            for sequence in stepping:
                self._finish(sequence, ERROR, error=f"{type(exc).__name__}: {exc}")
            return
        for sequence, row in zip(stepping, rows, strict=True):
            try:
                token = next_token(row, sequence.params, sequence.rng)
            except Exception as exc:
                self._finish(sequence, ERROR, error=f"{type(exc).__name__}: {exc}")
                continue
            self._emit_token(sequence, token)

    def _emit_token(self, sequence: Sequence, token: int) -> None:
        sequence.new_ids.append(token)
        piece = self.decode_text([token])
        searched_from = max(0, len(sequence.text) - max((len(s) for s in sequence.params.stop), default=0))
        sequence.text += piece
        finish = None
        if any(stop in sequence.text[searched_from:] for stop in sequence.params.stop):
            finish = STOP
        elif len(sequence.new_ids) >= sequence.budget:
            finish = LENGTH if sequence.budget == sequence.params.max_tokens else CONTEXT
        sequence.held_ids.append(token)
        sequence.held_text += piece
        per_response = -(-len(self.active) // self.responses_per_turn)
        if finish is None and len(sequence.new_ids) > 1 and len(sequence.held_ids) < per_response:
            return
        ids, text = sequence.held_ids, sequence.held_text
        sequence.held_ids, sequence.held_text = [], ""
        try:
            sequence.emit(ids, text, finish, None)
        except Exception:
            # The client is gone (or its stream broke): stop spending steps on it.
            self._finish(sequence, CANCELLED, notify=False)
            return
        if finish is not None:
            self._finish(sequence, finish, notify=False)

    def _finish(self, sequence: Sequence, reason: str, *, error: str | None = None, notify: bool = True) -> None:
        if sequence in self.active:
            self.active.remove(sequence)
        if sequence.seq is not None:
            with contextlib.suppress(Exception):  # a slot the decoder no longer holds is free already
                self.batch.close(sequence.seq)
        sequence.seq = None  # its slot is free now, not when the client lets go
        if notify:
            with contextlib.suppress(Exception):  # nobody left to tell
                sequence.emit([], "", reason, error)
        if self.on_finish is not None:
            try:
                self.on_finish(sequence, reason)
            except Exception:  # bookkeeping (metrics) must not stop the loop that serves everyone
                traceback.print_exc()
