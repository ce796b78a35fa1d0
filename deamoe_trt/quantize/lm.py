"""Whole language models with weight-only int8/int4 DeaMoE FFNs (docs/quantization.md).

`quantize_lm` is the one entry point the `quantize` command and the samples use: every
DeaMoE FFN's weights quantized by the config's method, attention, embeddings, norms, dense
MLPs and routers kept as they are. `held_out_loss` measures a model on the held-out part of
the shipped text (the windows `deamoe-trt train-tiny` validates on), so a quantized model's
perplexity is reported next to its source's, on the same data.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import UsageError
from ..lm.model import DeaMoELM
from ..lm.tokenizer import NoTokenizer, Tokenizer
from ..quant import QuantConfig
from .awq import AwqPlan

if TYPE_CHECKING:
    from ..work_folder import WorkCache


def quantize_lm(
    model: DeaMoELM, quant: QuantConfig, calibration: torch.Tensor | None = None, *, linears: tuple[str, ...] = ()
) -> DeaMoELM:
    """model with its DeaMoE FFNs quantized as quant says, and the projections of `linears`
    (deamoe_trt.lm.qlinear: attention, dense, head) round to nearest with the same bits and
    group size.

    calibration: token ids [N] AWQ runs the float model on to see each block's FFN inputs
    (quantize_lm_awq); round to nearest ("rtn") needs none and ignores it."""
    if quant.method == "rtn":
        return model.quantized(quant, linears=linears)
    if quant.method == "awq":
        if calibration is None:
            raise UsageError("--method awq needs calibration token ids")
        return quantize_lm_awq(model, quant, calibration, progress=False, linears=linears).model
    raise UsageError(f"--method {quant.method} is not implemented for language models")


# AWQ ------------------------------------------------------------------------------------------

CALIBRATION_WINDOWS = 16  # of the model's evaluation length (128 tokens): 2048 calibration tokens


@dataclasses.dataclass
class LMAwq:
    """quantize_lm_awq's result.

    model: the quantized model; folded: the float model with the input scales folded in (the
    same function as the input, bit for bit), whose FFNs the quantized ones stand for;
    input_scales: block -> s [d], the gate_up input scales (block input = norm output / s);
    plans: block -> the AWQ plan (down channel scales, clipping) of its FFN; tokens: calibration tokens."""

    model: DeaMoELM
    folded: DeaMoELM
    input_scales: dict[int, torch.Tensor]
    plans: dict
    tokens: int


def calibration_windows(ids: torch.Tensor, length: int, count: int = CALIBRATION_WINDOWS) -> list[torch.Tensor]:
    """Up to `count` windows of `length` token ids spread evenly over ids (deterministic); one
    shorter window when ids has fewer than `length`."""
    if ids.numel() == 0:
        raise UsageError("the calibration text encodes to no tokens")
    if ids.numel() <= length:
        return [ids]
    count = min(count, ids.numel() // length)
    step = (ids.numel() - length) // max(count - 1, 1)
    return [ids[i * step : i * step + length] for i in range(count)]


@torch.no_grad()
def ffn_inputs(model: DeaMoELM, windows: list[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Each DeaMoE block's FFN inputs [tokens, d] (its post-attention RMSNorm's output) when
    model runs on each window [S] of token ids."""
    captured: dict[int, list[torch.Tensor]] = {i: [] for i in model.moe_layers()}
    hooks = [
        model.layers[i].post_attention_layernorm.register_forward_hook(
            lambda _m, _i, out, i=i: captured[i].append(out.detach().reshape(-1, out.shape[-1]))
        )
        for i in captured
    ]
    try:
        for window in windows:
            model(window[None])
    finally:
        for hook in hooks:
            hook.remove()
    return {i: torch.cat(parts) for i, parts in captured.items()}


@torch.no_grad()
def fold_ffn_input_scales(model: DeaMoELM, scales: dict[int, torch.Tensor]) -> DeaMoELM:
    """A copy of the float model whose DeaMoE block i gets norm output / scales[i] [d] as its
    FFN input: post-attention RMSNorm weight / s, the FFN's router, gate_ups and shared-expert
    gate * s on their input columns (awq.fold_input_scales). Powers of two: the copy's logits
    and expert choices are the model's, bit for bit. Other tensors are shared with model."""
    from ..quantize.awq import fold_input_scales

    folded = model._twin(model.config, {i: fold_input_scales(model.layers[i].mlp, s) for i, s in scales.items()})
    for i, s in scales.items():
        norm = folded.layers[i].post_attention_layernorm
        norm.weight = torch.nn.Parameter(norm.weight.detach() / s.to(norm.weight.dtype))
    return folded


@torch.no_grad()
def quantize_lm_awq(
    model: DeaMoELM,
    quant: QuantConfig,
    calibration: torch.Tensor,
    *,
    progress: bool = True,
    linears: tuple[str, ...] = (),
    work: WorkCache | None = None,
) -> LMAwq:
    """AWQ for every DeaMoE FFN, from the FFN inputs the float model computes on calibration
    token ids [N] (up to CALIBRATION_WINDOWS windows of min(128, context) tokens).

    Beyond the layer path (deamoe_trt.quantize.awq.quantize_awq): a block's FFN input is its
    pre-FFN RMSNorm's output, so gate_up's input channels get AWQ scales too
    (awq.search_input_scales), folded as norm weight / s and router, gate_up and shared-expert
    gate columns * s (awq.fold_input_scales): powers of two, so the float model and every
    expert choice stay exactly as they were. `linears`' projections: round to nearest.

    work: where each block's finished search is kept and, when a killed run left it, taken
    from (deamoe_trt/work_folder.py; the caller keys it by the model, the calibration and quant)."""
    from ..console import Progress
    from . import awq

    if model.config.quantization is not None:
        model.quantized(quant)  # the one "already quantized" error
    if quant.method != "awq":
        quant = QuantConfig(quant.bits, quant.group_size, "awq")
    model.config.replace(quantization=quant)  # checks every width against the group size, before the search
    blocks = model.moe_layers()
    windows = calibration_windows(calibration.reshape(-1), min(128, model.config.max_position_embeddings))
    inputs = ffn_inputs(model, windows)
    bar = Progress(sum(1 + 2 * awq.group_count(model.layers[i].mlp) for i in blocks), "awq search", enabled=progress)
    ffns, scales, plans = {}, {}, {}
    for i in blocks:
        scales[i] = _piece(
            work,
            f"block{i}-input-scales",
            functools.partial(awq.search_input_scales, model.layers[i].mlp, quant, inputs[i]),
            lambda s: ({"s": s}, None),
            lambda tensors, _: tensors["s"],
        )
        bar.update(f"block {i}: gate_up input scales")
    folded = fold_ffn_input_scales(model, scales)
    for i in blocks:
        ffn = folded.layers[i].mlp
        x = inputs[i] / scales[i].to(inputs[i].dtype)  # what the folded block's FFN sees, exactly
        searched = bar.done
        plans[i] = _piece(work, f"block{i}-plan", functools.partial(awq.search, ffn, quant, x, bar), *_PLAN_FORM)
        if bar.done == searched:  # taken from the work folder: no search step was counted
            bar.update(f"block {i}: from the work folder", step=2 * awq.group_count(ffn))
        ffns[i] = awq.fold(ffn, plans[i]).quantized(quant, clip=plans[i].clip)  # awq.quantize_awq's last step
    model = folded.quantized(quant, ffns, linears=linears)
    return LMAwq(model, folded, scales, plans, sum(w.numel() for w in windows))


def _piece(
    work: WorkCache | None,
    key: str,
    compute: Callable[[], Any],
    pack: Callable[[Any], tuple[dict[str, torch.Tensor], Any]],
    unpack: Callable[[dict[str, torch.Tensor], Any], Any],
) -> Any:
    return compute() if work is None else work.piece(key, compute, pack, unpack)


def _pack_plan(plan: AwqPlan) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {f"scales.{n}": t for n, t in plan.channel_scales.items()}
    tensors.update({f"clip.{n}": t for n, t in plan.clip.items()})
    return tensors, {"uncalibrated": plan.uncalibrated, "groups": plan.groups}


def _unpack_plan(tensors: dict[str, torch.Tensor], meta: dict) -> AwqPlan:
    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {n.removeprefix(prefix): t for n, t in tensors.items() if n.startswith(prefix)}

    return AwqPlan(part("scales."), part("clip."), meta["uncalibrated"], meta["groups"])


_PLAN_FORM = (_pack_plan, _unpack_plan)


def held_out_loss(model: DeaMoELM, tokenizer: Tokenizer) -> float | None:
    """Mean next-token cross-entropy (nats per token) on the held-out 10% of the shipped text,
    over the fixed windows of deamoe_trt.train.lm.evaluate (no longer than the model's
    context); None when the model's tokenizer cannot encode the text (an imported model without
    tokenizer.json, a byte tokenizer with a smaller alphabet)."""
    from ..train.lm import TrainSettings, evaluate, shipped_text, split_text

    if isinstance(tokenizer, NoTokenizer):
        return None
    settings = TrainSettings()
    settings = dataclasses.replace(settings, seq_len=min(settings.seq_len, model.config.max_position_embeddings))
    try:
        _, held_out = split_text(shipped_text(), tokenizer, settings.val_fraction)
    except UsageError:  # a character outside the tokenizer's alphabet
        return None
    return evaluate(model, held_out, settings)


# Streamed round to nearest --------------------------------------------------------------------


def quantize_checkpoint_streamed(
    source: str | Path, output: str | Path, quant: QuantConfig, record: dict[str, Any]
) -> Path:
    """The checkpoint at source with its DeaMoE FFNs round to nearest, written to output one
    tensor at a time: what save_lm(model.quantized(quant), ...) writes, byte for byte, while
    holding one source tensor and its codes rather than the model (a model larger than memory).

    record: the "quantization" entry added to the source's "training" record. Only plain
    round to nearest of the FFNs: AWQ, quantized projections and the error tables need the
    whole model (quantize_lm)."""
    from ..checkpoint import DTYPES, ROUTER_BIAS, WEIGHTS_FILE, write_files_streamed
    from ..errors import CheckpointError
    from ..lm.checkpoint import expected_tensors
    from ..lm.checkpoint_format import checked_index, lm_header, read_lm_header
    from ..lm.tokenizer import HFTokenizer
    from ..quant import quantize_rtn
    from ..safetensors_io import ShardReader

    source, output = Path(source), Path(output)
    if quant.method != "rtn":
        raise UsageError(f"streamed quantization is round to nearest only, not {quant.method}")
    header = read_lm_header(source)
    config, dtype, tokenizer = header["config"], DTYPES[header["dtype"]], header["tokenizer"]
    skeleton = DeaMoELM(config, dtype=dtype, device="meta")
    if config.quantization is not None:
        skeleton.quantized(quant)  # the one "already quantized" error
    quantized = config.replace(quantization=quant, quantized_linears=())  # checks the widths, before any work
    index = checked_index(source, expected_tensors(skeleton), header["dtype"])
    target = DeaMoELM(quantized, dtype=dtype, device="meta")
    schema = {name: (tuple(t.shape), t.dtype) for name, t in expected_tensors(target).items()}
    weights = source / WEIGHTS_FILE
    reader = ShardReader(index)

    def read(name: str) -> torch.Tensor:
        t = reader.get(name)
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{name} contains NaN or Inf ({weights})")
        return t

    def tensor(name: str) -> torch.Tensor:
        if name in index:  # kept as it is (router biases float32, as load_lm reads them)
            t = read(name)
            return t.float() if name.endswith(ROUTER_BIAS) else t
        # "<weight>.qweight" or "<weight>.scales": both from one rounding of the weight, done
        # for each (save_file's order puts a file's codes after all its scales).
        weight, part = name.rsplit(".", 1)
        codes, scales = quantize_rtn(read(weight), quant)
        return codes if part == "qweight" else scales

    training = {**(header.get("training") or {}), "quantization": record}
    try:
        if isinstance(tokenizer, HFTokenizer):
            output.mkdir(parents=True, exist_ok=True)
            tokenizer.save(output)
        return write_files_streamed(output, schema, tensor, lm_header(quantized, dtype, tokenizer, training))
    finally:
        reader.close()
