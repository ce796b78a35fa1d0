"""Validate an exported language model (logits and KV cache) against its checkpoint's PyTorch model.

Reuses deamoe_trt.validation's machinery: the one adapter between two runtimes
(validation.pair: the ONNX Runtime session, plugin-form nodes run through the reference op,
and the PyTorch model as its two sides), its tolerances and its report. What is particular
to a language model is here: the feeds (token ids and a KV cache) and the PyTorch forward
that returns logits and present.* like the graph.

For each token count t: a prefill of t random tokens on an empty cache, then one decode
step of 1 token on the t-token cache the reference computed (so both sides see the same
inputs). Rows are named "<output> @past=<P>", with tokens = the new-token count T. Then the
model decodes on its runtime ("ort": load_decoder) beside the reference's decoder over one
random sequence, each keeping its own cache (pair.compare_decoders): a note says whether
their greedy tokens agree at every position and the worst logits error there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from polygraphy.common import TensorMetadata

from .. import runtimes
from ..errors import UsageError
from ..export.dtypes import DTYPES, to_numpy
from ..export.lm import INPUT_IDS, LOGITS, lm_export_info, past_names, present_names, stored_scales
from ..export.metadata import load_model
from ..inputs import input_generator
from ..lm.checkpoint import load_lm
from ..lm.model import DeaMoELM
from ..runtimes.onnxruntime import make_session
from .compare import compare
from .pair import Side, compare_decoders
from .report import ValidationReport, ort_cpu_int8_tolerances, tolerances

DEFAULT_TOKENS = (1, 5, 16)
DECODED_TOKENS = 8  # greedy positions the decoders are compared over after the prompt


def graph_inputs(model: DeaMoELM, np_dtype: np.dtype) -> TensorMetadata:
    """The exported graph's inputs: token ids and each block's past key and value."""
    c = model.config
    meta = TensorMetadata().add(INPUT_IDS, dtype=np.dtype(np.int64), shape=["batch", "tokens"])
    for i in range(c.num_layers):
        for name, (heads, width) in zip(past_names(i), c.cache_shapes(), strict=True):
            meta.add(name, dtype=np.dtype(np_dtype), shape=["batch", heads, "past", width])
    return meta


def reference_outputs(model: DeaMoELM, np_dtype: np.dtype, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The PyTorch model on one of the graph's feeds: logits and present.*, as the graph returns them."""
    c = model.config
    ids = torch.from_numpy(np.ascontiguousarray(feed[INPUT_IDS]))
    cache = [
        tuple(torch.from_numpy(np.ascontiguousarray(feed[n])).to(model.dtype) for n in past_names(i))
        for i in range(c.num_layers)
    ]
    with torch.no_grad():
        out = model(ids, cache)
    result = {LOGITS: out.logits.float().numpy()}
    for i, kv in enumerate(out.past_key_values):
        for name, tensor in zip(present_names(i), kv, strict=True):
            result[name] = tensor.numpy().astype(np_dtype, copy=False)
    return result


def validate_lm(
    model: str | Path,
    checkpoint: str | Path,
    *,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
    provider: str = "cpu",
) -> ValidationReport:
    """Compare an exported language model with the PyTorch model of checkpoint (see the module docstring)."""
    if provider != "cpu":
        raise UsageError("language-model validation runs on the cpu provider only for now")
    proto = load_model(model)
    info = lm_export_info(proto, str(model), directory=Path(model).parent)
    loaded = load_lm(checkpoint)
    dtype = DTYPES[info.dtype]
    if dtype.name not in ("fp32", "fp16"):
        raise UsageError(f"language-model validation on ONNX Runtime needs an fp32 or fp16 export, not {dtype.name}")
    reference = loaded.model.twin(info.twin).to(dtype.torch)
    if reference.config != info.config:
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: its {info.twin} config differs from the exported one"
        )
    _check_head(proto, reference, dtype, checkpoint)
    np_dtype = dtype.numpy
    reference.eval()
    inputs = graph_inputs(reference, np_dtype)
    session = make_session(model)
    outputs = [o.name for o in session.get_outputs()]
    runner = Side(
        f"onnxruntime-{provider}", lambda feed: dict(zip(outputs, session.run(outputs, feed), strict=True)), inputs
    )
    ref_runner = Side("pytorch-reference", lambda feed: reference_outputs(reference, np_dtype, feed), inputs)
    feeds, labels = _feeds(reference, np_dtype, tokens, seed)
    notes = ["note: plugin-form DeaMoE nodes ran through the PyTorch reference op"] if info.form == "plugin" else []
    quant = info.config.quantization
    if info.form == "ort" and quant is not None and quant.bits == 8:
        atol, rtol, note = ort_cpu_int8_tolerances(atol, rtol)
        notes.append(note + "; in a language model the error grows from block to block")
    atol, rtol = tolerances(dtype.name, atol, rtol)
    rows = compare(runner, ref_runner, feeds, atol=atol, rtol=rtol)
    # compare() labels rows by the first feed's leading dim (the batch here): relabel per feed.
    per_feed = len(rows) // len(feeds)
    rows = [
        dataclasses.replace(
            row, output=f"{row.output} @past={labels[i // per_feed][0]}", tokens=labels[i // per_feed][1]
        )
        for i, row in enumerate(rows)
    ]
    notes.append(_decoded(model, reference, min(tokens), seed, atol=atol, rtol=rtol))
    c = info.config
    description = (
        f"language model, {c.num_layers} blocks, FFNs in the {info.form} form, {info.dtype}, {info.twin}; "
        "prefill then one decode step per token count"
    )
    return ValidationReport(str(model), str(checkpoint), description, provider, atol, rtol, rows, notes)


def _decoded(model: str | Path, reference: DeaMoELM, prompt: int, seed: int, *, atol: float, rtol: float) -> str:
    """The note on the model's decoder (runtime "ort") beside the reference's over one random sequence."""
    c = reference.config
    length = min(prompt + DECODED_TOKENS, c.max_position_embeddings - 1)
    ids = torch.randint(0, c.vocab_size, (length,), generator=input_generator(seed + 1)).tolist()
    model_decoder, reference_decoder = runtimes.get("ort").load_decoder(model), runtimes.get("torch").decoder(reference)
    decoded = compare_decoders(model_decoder, reference_decoder, ids, prompt, atol=atol, rtol=rtol)
    worst = max(decoded.rows, key=lambda r: r.max_abs)
    return (
        f"note: decoded on ONNX Runtime beside the reference, each with its own cache, {length - prompt} token(s) "
        f"after a {prompt}-token prompt: {decoded.summary()}; worst logits error {worst.max_abs:.3e} "
        f"({worst.output})"
    )


def _check_head(proto: onnx.ModelProto, reference: DeaMoELM, dtype, checkpoint) -> None:
    """The model's lm_head (its scales when quantized) equals the checkpoint's bit for bit (a model
    exported from another checkpoint of the same shape fails here in one line, before any error table)."""
    quantized = "head" in reference.config.quantized_linears
    name = "lm_head.weight.scales" if quantized else "lm_head.weight"
    tensor = next((t for t in proto.graph.initializer if t.name == name), None)
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return
    expected = reference.state_dict()[name]
    if tensor.raw_data != to_numpy(stored_scales(expected) if quantized else expected, dtype).tobytes():
        raise UsageError(
            f"checkpoint {checkpoint} does not match the model: {name} differs "
            "(was the model exported from another checkpoint?)"
        )


def _feeds(model: DeaMoELM, np_dtype, tokens: Sequence[int], seed: int):
    """Per token count t: prefill of t tokens (past 0), then a 1-token step on the reference's t-token cache."""
    c = model.config
    gen = input_generator(seed)
    feeds, labels = [], []
    for t in tokens:
        if not 1 <= t < c.max_position_embeddings:
            raise UsageError(f"token counts must be 1 to {c.max_position_embeddings - 1}, got {t}")
        ids = torch.randint(0, c.vocab_size, (1, t + 1), generator=gen)
        empty = model.empty_cache()
        with torch.no_grad():
            cache = model(ids[:, :t], empty).past_key_values
        for step_ids, past, past_len in ((ids[:, :t], empty, 0), (ids[:, t:], cache, t)):
            feed = {INPUT_IDS: step_ids.numpy()}
            for i, kv in enumerate(past):
                for name, tensor in zip(past_names(i), kv, strict=True):
                    feed[name] = tensor.numpy().astype(np_dtype)
            feeds.append(feed)
            labels.append((past_len, step_ids.shape[1]))
    return feeds, labels
