"""Whole language models with weight-only int8/int4 DeaMoE FFNs (docs/quantization.md).

`quantize_lm` is the one entry point the `quantize` command and the samples use: every
DeaMoE FFN's weights quantized by the config's method, attention, embeddings, norms, dense
MLPs and routers kept as they are. `held_out_loss` measures a model on the held-out part of
the shipped text (the windows `deamoe-trt train-tiny` validates on), so a quantized model's
perplexity is reported next to its source's, on the same data.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import UsageError
from ..quant import QuantConfig
from .model import DeaMoELM
from .tokenizer import NoTokenizer, Tokenizer


def quantize_lm(model: DeaMoELM, quant: QuantConfig, calibration: torch.Tensor | None = None) -> DeaMoELM:
    """model with its DeaMoE FFNs quantized as quant says.

    calibration: token ids a calibrated method runs the model on to see each block's FFN
    inputs (AWQ would run deamoe_trt.awq.quantize_awq per block on those inputs and pass the
    results to model.quantized(quant, ffns)); round to nearest ("rtn", the only method for
    language models so far) needs none and ignores it."""
    if quant.method == "rtn":
        return model.quantized(quant)
    raise UsageError(
        f"--method {quant.method} is not implemented for language models yet (layer checkpoints only); use --method rtn"
    )


def held_out_loss(model: DeaMoELM, tokenizer: Tokenizer) -> float | None:
    """Mean next-token cross-entropy (nats per token) on the held-out 10% of the shipped text,
    over the fixed windows of deamoe_trt.lm.train.evaluate (no longer than the model's
    context); None when the model's tokenizer cannot encode the text (an imported model without
    tokenizer.json, a byte tokenizer with a smaller alphabet)."""
    from .train import TrainSettings, evaluate, shipped_text, split_text

    if isinstance(tokenizer, NoTokenizer):
        return None
    settings = TrainSettings()
    settings = dataclasses.replace(settings, seq_len=min(settings.seq_len, model.config.max_position_embeddings))
    try:
        _, held_out = split_text(shipped_text(), tokenizer, settings.val_fraction)
    except UsageError:  # a character outside the tokenizer's alphabet
        return None
    return evaluate(model, held_out, settings)
