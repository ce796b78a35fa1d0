"""The runtime interface: what every runtime of deamoe_trt.runtimes implements.

A runtime takes a DeaMoE layer (or stack) the PyTorch reference defines and runs its
forward pass its own way. `prepare` does the one-off work (packing, export, engine build)
and returns a `Prepared`: `run` is the step a benchmark times, on an input already in the
runtime's form (`to_input`, untimed), and `to_torch` turns its output back for checks. A
runtime that also decodes whole language models has a `decoder`, a `Decoder` (prefill a
prompt, then step one token at a time, each returning the last position's logits), which
deamoe_trt.runtimes.decode's loop drives and times; the others raise a UsageError saying so.

Several sequences decode together through a `BatchDecoder`: sequences open (prefill) and
close between steps, and one `step` feeds one token to each of the sequences it names, so a
runtime with a batched step reads every weight once for all of them. A runtime without one
gets `SerialBatchDecoder`, which steps its pooled single-sequence decoders in turn; a
`Decoder` is the one-sequence case (`OneSequence` adapts a BatchDecoder to it).

Each runtime declares what it can do in one `Capabilities`; commands and benchmarks derive
their choices from those (deamoe_trt.runtimes.names(can=...)) rather than keep lists of
names. `load(path)` and `load_decoder(path)` open a saved artifact (a checkpoint, an ONNX
file, an engine: whatever the runtime runs) so that no caller opens one itself.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from ..errors import MissingDependencyError, UsageError


def identity(x: Any) -> Any:
    return x


def as_numpy(x: torch.Tensor) -> np.ndarray:
    """x as an array a file's input takes: bf16 as float32 holding its values (numpy has no bf16)."""
    return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()


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


class BatchDecoder(Protocol):
    """Up to max_sequences sequences of one model decoding together, each with its own KV
    cache, position and length. Sequences are named by the int open() returns; they join
    (open) and leave (close) between steps."""

    name: str
    max_context: int
    max_sequences: int

    def open(self, ids: list[int]) -> tuple[int, np.ndarray]:
        """Prefill a new sequence with prompt ids: its handle and the last position's logits."""
        ...

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens[i] to sequence seqs[i] (each open, named once) in one step; the logits,
        [len(seqs), vocab] float32, row i for seqs[i]."""
        ...

    def close(self, seq: int) -> None:
        """End sequence seq: its cache slot is free for the next open()."""
        ...

    def length(self, seq: int) -> int:
        """Tokens in sequence seq's cache."""
        ...


Ability = Literal["layers", "decoding", "batched"]
ABILITIES: tuple[Ability, ...] = ("layers", "decoding", "batched")


@dataclass(frozen=True)
class Capabilities:
    """What one runtime can do, declared once beside it; commands derive their choices from it."""

    layers: bool = True  # prepare() runs a layer (and a stack, unless stacks is False)
    decoding: bool = False  # decoder() decodes a language model
    batched: bool = False  # batch_decoder() reads each weight once for all sequences of a step
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)  # weights it runs
    bits: tuple[int, ...] = (0, 8, 4)  # weight formats it runs: 0 float, 8 and 4 the quantized ones
    needs: frozenset[str] = frozenset()  # what a machine must have: "gpu", "tensorrt", "onnxruntime", "compiler"
    files: tuple[str, ...] = ("checkpoint",)  # what load() and load_decoder() open: "checkpoint", "onnx", "engine"
    stacks: bool = True  # prepare() takes a DeaMoEStack too
    reference: bool = False  # the expectation the others meet (benchmarks time it beside, not as, a contender)
    emulated: bool = False  # slow by design (a flow checked on the CPU): benchmarks leave it out
    modes: tuple[str, ...] = ()  # decoder modes benchmarks time apart, named RUNTIME-MODE ("cpu-native")

    def can(self, ability: Ability) -> bool:
        if ability not in ABILITIES:
            raise UsageError(f"unknown ability {ability!r}; choose one of: {', '.join(ABILITIES)}")
        return bool(getattr(self, ability))


class Runtime(Protocol):
    name: str  # registry key and the name in result files: "cpu", "ort"...
    label: str  # for tables: "deamoe-trt CPU kernel"
    capabilities: Capabilities

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """Weight dtypes it runs (capabilities.dtypes)."""
        ...

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

    def batch_decoder(
        self, model, *, max_sequences: int, threads: int | None = None, twin: str = "deamoe", **options: Any
    ) -> BatchDecoder:
        """A BatchDecoder for up to max_sequences sequences of the language model at once."""
        ...

    def load(self, path: str | Path, *, threads: int | None = None, **options: Any) -> Prepared:
        """The layer (or stack) saved at path, ready on this runtime: a checkpoint, or the file
        this runtime runs (capabilities.files: an ONNX export, an engine)."""
        ...

    def load_decoder(self, path: str | Path, *, threads: int | None = None, **options: Any) -> Decoder:
        """A Decoder for the language model saved at path (capabilities.files say which kinds)."""
        ...

    def load_batch_decoder(
        self, path: str | Path, *, max_sequences: int, threads: int | None = None, **options: Any
    ) -> BatchDecoder:
        """A BatchDecoder for the language model saved at path."""
        ...


class RuntimeBase:
    """Defaults shared by the implementations: availability from `available()`, no decoder,
    checkpoints opened with deamoe_trt.lm.checkpoint.read."""

    name = ""
    label = ""
    capabilities = Capabilities()

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return self.capabilities.dtypes

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

    def batch_decoder(
        self, model, *, max_sequences: int, threads: int | None = None, twin: str = "deamoe", **options: Any
    ) -> BatchDecoder:
        """Runtimes without a batched step: their pooled decoders stepped one after another."""
        check_max_sequences(max_sequences)
        pool = self.decoder_pool(model, threads=threads, size=max_sequences, twin=twin, **options)
        return SerialBatchDecoder(pool, max_sequences)

    def load(self, path: str | Path, *, threads: int | None = None, **options: Any) -> Prepared:
        from ..lm.checkpoint import read

        checkpoint = read(path).expect("layer", "stack")
        stack = checkpoint.stack()
        runtime = typing.cast(Runtime, self)  # every implementation defines prepare
        return runtime.prepare(stack.layers[0] if checkpoint.artifact == "layer" else stack, threads=threads, **options)

    def load_decoder(self, path: str | Path, *, threads: int | None = None, **options: Any) -> Decoder:
        return self.decoder(load_lm_model(path), threads=threads, **options)

    def load_batch_decoder(
        self, path: str | Path, *, max_sequences: int, threads: int | None = None, **options: Any
    ) -> BatchDecoder:
        return self.batch_decoder(load_lm_model(path), max_sequences=max_sequences, threads=threads, **options)

    def __repr__(self) -> str:
        return f"<runtime {self.name}>"


def load_lm_model(path: str | Path):
    """The language model (a DeaMoELM) of the checkpoint at path; a one-line error for another artifact."""
    from ..lm.checkpoint import read

    return read(path).expect("lm").lm().model


def state_bytes(module) -> int:
    """Bytes of a module's tensors (its state dict)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


MAX_SEQUENCES = 256  # the most sequences one batched step takes (a sanity bound on slots)


def check_max_sequences(max_sequences: int) -> None:
    if isinstance(max_sequences, bool) or not isinstance(max_sequences, int) or not 1 <= max_sequences <= MAX_SEQUENCES:
        raise UsageError(f"max_sequences must be an integer from 1 to {MAX_SEQUENCES}, got {max_sequences!r}")


class Slots:
    """The bookkeeping every BatchDecoder shares: which handles are open, their lengths, and
    the one-line refusals for a bad step (one source for those messages)."""

    def __init__(self, max_sequences: int, max_context: int):
        check_max_sequences(max_sequences)
        self.max_sequences = max_sequences
        self.max_context = max_context
        self.lengths: dict[int, int] = {}  # open handle -> tokens in its cache

    def free(self) -> int:
        """The lowest free slot; UsageError when every slot is taken."""
        for slot in range(self.max_sequences):
            if slot not in self.lengths:
                return slot
        raise UsageError(
            f"all {self.max_sequences} sequences of this batch decoder are open; close one before opening another"
        )

    def check_open(self, ids: list[int]) -> int:
        """The slot a new sequence with prompt ids takes (not yet marked open)."""
        if not ids:
            raise UsageError("the prompt is empty; give at least one token")
        if len(ids) >= self.max_context:
            raise UsageError(
                f"the prompt is {len(ids)} tokens but the context holds {self.max_context} "
                "and needs room for at least one new token"
            )
        return self.free()

    def check_step(self, seqs: Sequence[int], tokens: Sequence[int]) -> None:
        if len(seqs) == 0:
            raise UsageError("a batched step needs at least one sequence; the batch is empty")
        if len(seqs) != len(tokens):
            raise UsageError(f"a batched step got {len(seqs)} sequences but {len(tokens)} tokens")
        if len(seqs) > self.max_sequences:
            raise UsageError(
                f"a batched step of {len(seqs)} sequences is over this decoder's maximum of {self.max_sequences}"
            )
        if len(set(seqs)) != len(seqs):
            raise UsageError("a batched step names a sequence more than once")
        for seq in seqs:
            if seq not in self.lengths:
                raise UsageError(f"sequence {seq} is not open")
            if self.lengths[seq] >= self.max_context:
                raise UsageError(f"sequence {seq} has filled its context of {self.max_context} tokens; close it")

    def check_close(self, seq: int) -> None:
        if seq not in self.lengths:
            raise UsageError(f"sequence {seq} is not open")

    def release(self, seq: int) -> None:
        """Free open sequence seq's slot."""
        self.check_close(seq)
        del self.lengths[seq]

    def length(self, seq: int) -> int:
        """Tokens in open sequence seq's cache."""
        self.check_close(seq)
        return self.lengths[seq]


class SerialBatchDecoder:
    """A BatchDecoder over a DecoderPool: each sequence its own decoder, a step runs them in
    turn (no weight read is shared; the fallback for runtimes without a batched step)."""

    def __init__(self, pool: DecoderPool, max_sequences: int):
        first = pool.acquire()
        self.pool = pool
        self.name = first.name
        self.max_context = first.max_context
        self.slots = Slots(max_sequences, first.max_context)
        self.max_sequences = max_sequences
        self._spare: list[Decoder] = [first]
        self._decoders: dict[int, Decoder] = {}

    def open(self, ids: list[int]) -> tuple[int, np.ndarray]:
        slot = self.slots.check_open(ids)
        decoder = self._spare.pop() if self._spare else self.pool.acquire()
        logits = decoder.prefill(list(ids))
        self._decoders[slot] = decoder
        self.slots.lengths[slot] = len(ids)
        return slot, logits

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        self.slots.check_step(seqs, tokens)
        rows = [self._decoders[s].step(int(t)) for s, t in zip(seqs, tokens, strict=True)]
        for s in seqs:
            self.slots.lengths[s] += 1
        return np.stack(rows).astype(np.float32, copy=False)

    def close(self, seq: int) -> None:
        self.slots.release(seq)
        self._spare.append(self._decoders.pop(seq))

    def length(self, seq: int) -> int:
        return self.slots.length(seq)


class OneSequence:
    """A Decoder over a BatchDecoder: the one-sequence case of batched decoding."""

    def __init__(self, batch: BatchDecoder):
        self.batch = batch
        self.name = batch.name
        self.max_context = batch.max_context
        self._seq: int | None = None

    def prefill(self, ids: list[int]) -> np.ndarray:
        if self._seq is not None:
            self.batch.close(self._seq)
            self._seq = None
        self._seq, logits = self.batch.open(list(ids))
        return logits

    def step(self, token: int) -> np.ndarray:
        if self._seq is None:
            raise UsageError("step() before prefill(): give the prompt first")
        return self.batch.step([self._seq], [token])[0]
