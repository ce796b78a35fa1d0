"""Validate an exported language model (logits and KV cache) against its checkpoint's PyTorch model.

Reuses deamoe_trt.validation's machinery: the ONNX Runtime runner (plugin-form nodes run
through the reference op), polygraphy's comparison (validation.compare), its tolerances
and its report. What is particular to a language model is here: the feeds (token ids and a
KV cache) and a PyTorch runner that returns logits and present.* like the graph.

For each token count t: a prefill of t random tokens on an empty cache, then one decode
step of 1 token on the t-token cache the reference computed (so both sides see the same
inputs). Rows are named "<output> @past=<P>", with tokens = the new-token count T.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.common import TensorMetadata

from ..errors import UsageError
from ..export.dtypes import DTYPES, to_numpy
from ..export.lm import INPUT_IDS, LOGITS, lm_export_info, past_names, present_names, stored_scales
from ..export.metadata import load_model
from ..inputs import input_generator
from ..lm.checkpoint import load_lm
from ..lm.model import DeaMoELM
from ..runtimes.onnxruntime import make_session
from ..validation.compare import compare
from ..validation.report import ValidationReport, ort_cpu_int8_tolerances, tolerances

DEFAULT_TOKENS = (1, 5, 16)


class LMReferenceRunner(BaseRunner):
    """The PyTorch model as a polygraphy runner with the exported graph's inputs and outputs."""

    def __init__(self, model: DeaMoELM, np_dtype: np.dtype, name: str = "pytorch-reference"):
        super().__init__(name=name, prefix="pytorch-reference")
        self.model, self.np_dtype = model.eval(), np.dtype(np_dtype)

    def get_input_metadata_impl(self):
        c = self.model.config
        meta = TensorMetadata().add(INPUT_IDS, dtype=np.dtype(np.int64), shape=["batch", "tokens"])
        for i in range(c.num_layers):
            for name, (heads, width) in zip(past_names(i), c.cache_shapes(), strict=True):
                meta.add(name, dtype=self.np_dtype, shape=["batch", heads, "past", width])
        return meta

    def infer_impl(self, feed_dict):
        c = self.model.config
        ids = torch.from_numpy(np.ascontiguousarray(feed_dict[INPUT_IDS]))
        cache = [
            tuple(torch.from_numpy(np.ascontiguousarray(feed_dict[n])).to(self.model.dtype) for n in past_names(i))
            for i in range(c.num_layers)
        ]
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model(ids, cache)
        self.inference_time = time.perf_counter() - start
        result = OrderedDict([(LOGITS, out.logits.float().numpy())])
        for i, kv in enumerate(out.past_key_values):
            for name, tensor in zip(present_names(i), kv, strict=True):
                result[name] = tensor.numpy().astype(self.np_dtype, copy=False)
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
    runner = OnnxrtRunner(make_session(model), name=f"onnxruntime-{provider}")
    ref_runner = LMReferenceRunner(reference, np_dtype)
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
    c = info.config
    description = (
        f"language model, {c.num_layers} blocks, FFNs in the {info.form} form, {info.dtype}, {info.twin}; "
        "prefill then one decode step per token count"
    )
    return ValidationReport(str(model), str(checkpoint), description, provider, atol, rtol, rows, notes)


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
