"""Two runtimes on the same inputs: the one adapter every comparison of runtimes goes through.

A side is a runtime made ready by deamoe_trt.runtimes: for layers a `Prepared`
(`runtimes.get(name).prepare(module)`, or `.load(file)` for an export or an engine), for
language models a `Decoder` (`.decoder(model)`, `.load_decoder(file)`), or, where a graph's
own inputs and outputs are compared (a KV cache fed in, present.* read out), a function
from a feed to its outputs. `compare_layers` runs two prepared layers on the same inputs;
`compare_decoders` runs two decoders over one token sequence (the logits at every position
and the token each side picks there). Both tabulate through compare.compare, polygraphy's
Comparator, so every validation reports the same columns and holds models to the same rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from ..export.metadata import INPUT_NAME, OUTPUT_NAME
from ..runtimes.base import Decoder, Prepared, as_numpy
from .compare import Comparison, compare

Feed = dict[str, np.ndarray]
ENGINE_SUFFIXES = (".engine", ".plan")
TOKEN_IDS = "input_ids"
LOGITS = "logits"


class Side(BaseRunner):
    """One side of a comparison as polygraphy's Comparator takes it: run(feed) -> outputs."""

    def __init__(self, name: str, run: Callable[[Feed], dict[str, np.ndarray]], inputs: TensorMetadata):
        super().__init__(name=name, prefix=name)
        self.run, self.inputs = run, inputs

    def get_input_metadata_impl(self):
        return self.inputs

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.run(feed_dict)
        self.inference_time = time.perf_counter() - start
        return OrderedDict(outputs)


def read(y: torch.Tensor) -> np.ndarray:
    """An output as compared: fp16 as fp16, bf16 and fp32 as float32."""
    return y.numpy() if y.dtype == torch.float16 else y.float().numpy()


def layer_side(prepared: Prepared, name: str, *, dtype: torch.dtype, fed_as: np.dtype, hidden: int) -> Side:
    """A prepared layer (or stack) fed [T, hidden] arrays of fed_as that hold dtype's values."""

    def run(feed: Feed) -> dict[str, np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(feed[INPUT_NAME])).to(dtype)
        return {OUTPUT_NAME: read(prepared(x))}

    return Side(name, run, TensorMetadata().add(INPUT_NAME, dtype=np.dtype(fed_as), shape=["T", hidden]))


def compare_layers(
    model: Prepared,
    reference: Prepared,
    inputs: Sequence[torch.Tensor],
    *,
    atol: float,
    rtol: float,
    names: tuple[str, str] | None = None,
) -> list[Comparison]:
    """Both prepared layers on every input ([T, d], in the model's dtype); one Comparison per input."""
    first = inputs[0]
    feeds = [{INPUT_NAME: as_numpy(x)} for x in inputs]  # bf16: float32 holding its values
    model_name, reference_name = names or (model.runtime, f"{reference.runtime}-reference")
    sides = [
        layer_side(p, n, dtype=first.dtype, fed_as=feeds[0][INPUT_NAME].dtype, hidden=first.shape[-1])
        for p, n in ((model, model_name), (reference, reference_name))
    ]
    return compare(sides[0], sides[1], feeds, atol=atol, rtol=rtol)


@dataclass(frozen=True)
class DecoderComparison:
    """Two decoders over one sequence: logits rows ("logits @pos=P", tokens = tokens fed) and the
    token each side's logits pick at every position."""

    rows: list[Comparison]
    tokens: list[int]
    reference_tokens: list[int]

    @property
    def first_difference(self) -> int | None:
        """The first position (counted from the end of the prompt) whose greedy tokens differ; None if none."""
        pairs = zip(self.tokens, self.reference_tokens, strict=True)
        return next((i for i, (a, b) in enumerate(pairs) if a != b), None)

    def summary(self) -> str:
        """One line on the greedy tokens."""
        n, first = len(self.tokens), self.first_difference
        if first is None:
            return f"greedy tokens: the same as the reference's at all {n} position(s)"
        same = sum(a == b for a, b in zip(self.tokens, self.reference_tokens, strict=True))
        return f"greedy tokens: {same} of {n} the same as the reference's; the first differs at position {first}"


def decoder_side(decoder: Decoder, name: str, picked: list[int]) -> Side:
    """A decoder fed the prompt first (prefill), then one token per feed (step); picked gets its argmax each time."""
    started = False

    def run(feed: Feed) -> dict[str, np.ndarray]:
        nonlocal started
        ids = [int(t) for t in feed[TOKEN_IDS].reshape(-1)]
        logits = decoder.step(ids[0]) if started else decoder.prefill(ids)
        started = True
        logits = np.asarray(logits, dtype=np.float32)
        picked.append(int(np.argmax(logits)))
        return {LOGITS: logits}

    return Side(name, run, TensorMetadata().add(TOKEN_IDS, dtype=np.dtype(np.int64), shape=["tokens"]))


def compare_decoders(
    model: Decoder,
    reference: Decoder,
    ids: Sequence[int],
    prompt: int,
    *,
    atol: float,
    rtol: float,
    names: tuple[str, str] | None = None,
) -> DecoderComparison:
    """Both decoders over the same sequence ids: a prefill of its first prompt tokens, then a step
    per token after them; the last position's logits compared after each, and each side's greedy
    token there. Both are fed the same tokens, so a difference at one position does not carry on."""
    if not 1 <= prompt <= len(ids):
        raise ValueError(f"prompt must be 1 to {len(ids)} tokens, got {prompt}")
    feeds = [{TOKEN_IDS: np.asarray(ids[:prompt], dtype=np.int64)}]
    feeds += [{TOKEN_IDS: np.asarray([t], dtype=np.int64)} for t in ids[prompt:]]
    model_name, reference_name = names or (model.name, f"{reference.name}-reference")
    tokens: list[int] = []
    reference_tokens: list[int] = []
    rows = compare(
        decoder_side(model, model_name, tokens),
        decoder_side(reference, reference_name, reference_tokens),
        feeds,
        atol=atol,
        rtol=rtol,
    )
    rows = [dataclasses.replace(row, output=f"{row.output} @pos={prompt + i - 1}") for i, row in enumerate(rows)]
    return DecoderComparison(rows, tokens, reference_tokens)


def is_engine(path: str | Path) -> bool:
    return Path(path).suffix.lower() in ENGINE_SUFFIXES
