"""The `quantize` workflow: a checkpoint (layer/stack or language model) quantized into a new
one, with the error tables and held-out perplexities the command prints.

`quantize_checkpoint` is the one entry point (the command parses its flags and calls it). The
output is written whole beside its place and then takes it (_io.replaced_directory). A
language model's AWQ keeps each block's finished search in OUTPUT.work (work_folder.py's
work folder, keyed by the source weights, the calibration tokens and the settings), so a
killed run rerun with the same arguments redoes only the blocks it had not finished; the
folder goes once the output is in place.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from ..errors import UsageError
from ..quant import QuantConfig


@dataclasses.dataclass(frozen=True)
class _Request:
    """What one run was asked: the command's flags as plain values."""

    checkpoint: str
    output: str  # where the files are written (a staging folder beside `shown_output`)
    shown_output: str  # where they end up
    quant: QuantConfig
    calibration: str | None
    eval: str | None
    tokens: int
    linears: tuple[str, ...]
    compare: bool
    seed: int


def quantize_checkpoint(
    checkpoint: str,
    output: str,
    quant: QuantConfig,
    *,
    calibration: str | None = None,
    eval: str | None = None,
    tokens: int = 64,
    linears: str = "",
    compare: bool = True,
    seed: int = 0,
    force: bool = False,
    note: Callable[[str], None] | None = None,
) -> str:
    """Quantize the checkpoint at `checkpoint` into the folder `output`, printing the error
    tables (unless not compare) as they are measured; returns the line saying what was written.

    calibration: AWQ's data (a layer checkpoint: layer inputs or 'random:N'; a language model:
    a text file, default the shipped text's training part); eval: held-out layer inputs;
    tokens: random tokens to measure on without eval; linears: the language model's projections
    to quantize too, comma-separated; note(text) hears of a replaced output."""
    from .._io import check_not_input, json_format_is, replaced_directory
    from ..checkpoint import FORMAT
    from ..lm.checkpoint import FORMAT as LM_FORMAT
    from ..lm.checkpoint import read
    from ..work_folder import work_dir

    check_not_input(output, [checkpoint])  # it is read while the output is written
    if quant.method == "rtn" and calibration:
        raise UsageError("--calibration is for --method awq (round to nearest uses no data); --eval FILE measures")
    if not compare and quant.method != "rtn":
        raise UsageError(f"--no-compare is for --method rtn; --method {quant.method} prints its own error tables")
    parts = _linears(linears)
    lm = read(checkpoint).artifact == "lm"
    # The output is written whole beside its place and then takes it: an interrupted run leaves
    # nothing, and no file of an older output stays. Only a checkpoint of the same kind is replaced.
    ours = json_format_is(LM_FORMAT if lm else FORMAT)
    kind = "language-model checkpoint" if lm else "layer checkpoint"
    work = work_dir(output)
    with replaced_directory(output, ours, kind, force=force, note=note) as staging:
        request = _Request(
            str(checkpoint), str(staging), str(output), quant, calibration, eval, tokens, parts, compare, seed
        )
        written = _run_lm(request, work) if lm else _run_layers(request)
    shutil.rmtree(work, ignore_errors=True)  # the finished blocks, once the output is in place
    return written


def _run_layers(req: _Request) -> str:
    from ..layer import DeaMoEStack

    if req.linears:
        raise UsageError("--linears is for language-model checkpoints (a layer checkpoint holds only FFNs)")
    if req.quant.method == "awq" and not req.calibration:
        raise UsageError(
            "--method awq needs --calibration FILE (layer inputs as safetensors; random:N for a Gaussian demo)"
        )
    stack = DeaMoEStack.from_pretrained(req.checkpoint)
    if stack.quant is not None:
        stack.layers[0].quantized(req.quant)  # the one "already quantized" error
    if req.quant.method == "awq":
        quantized = _awq(req, stack)
    else:
        quantized = stack.quantized(req.quant)
        if req.compare:
            _print_error(req, stack, quantized)
    path = quantized.save_pretrained(req.output)
    return _written(req, f"{len(stack.layers)} layer(s)", path)


def _run_lm(req: _Request, work: Path) -> str:
    from ..lm.checkpoint import load_lm
    from .lm import quantize_lm

    if req.eval:
        raise UsageError(
            "--eval takes layer inputs, for layer checkpoints; a language model is measured by its held-out "
            "perplexity on the shipped text"
        )
    if not req.compare and not req.linears:
        return _run_lm_streamed(req)
    loaded = load_lm(req.checkpoint)
    model = loaded.model
    if model.config.quantization is not None:
        model.quantized(req.quant)  # the one "already quantized" error, before any work
    if req.quant.method == "awq":
        # Many small matmuls: on the tiny LM one thread took 9.7 s where two took 85 s (2-core VM, shared).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _run_lm_awq(req, loaded, work)
        finally:
            torch.set_num_threads(threads)
    # One model per choice: the FFNs, then each part of --linears added in turn.
    choices = [req.linears[:n] for n in range(len(req.linears) + 1)]
    models = [(_quant_name(req.quant, parts), quantize_lm(model, req.quant, linears=parts)) for parts in choices]
    quantized = models[-1][1]
    if not req.compare:
        return _save_lm(req, loaded, quantized, {}, None)
    blocks = model.moe_layers()
    _print_error(
        req,
        [model.layers[i].mlp for i in blocks],
        [quantized.layers[i].mlp for i in blocks],
        labels=[f"block {i}" for i in blocks],
    )
    perplexity = _print_perplexity(req.checkpoint, loaded.tokenizer, model, models)
    return _save_lm(req, loaded, quantized, {}, perplexity)


def _run_lm_streamed(req: _Request) -> str:
    """Round to nearest tensor by tensor from disk (lm.quantize_checkpoint_streamed)."""
    from ..lm.checkpoint import read_lm_header
    from .lm import quantize_checkpoint_streamed

    path = quantize_checkpoint_streamed(req.checkpoint, req.output, req.quant, _record(req, req.quant, {}, None))
    config = read_lm_header(path)["config"]
    moe = sum(not config.is_dense(i) for i in range(config.num_layers))
    return _written(req, f"{moe} DeaMoE FFN(s) of {config.num_layers} block(s)", path)


def _linears(text: str) -> tuple[str, ...]:
    from ..lm.qlinear import LINEAR_PARTS

    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if any(p not in LINEAR_PARTS for p in parts) or len(set(parts)) != len(parts):
        raise UsageError(f"--linears takes distinct parts of {', '.join(LINEAR_PARTS)}, comma-separated; got {text!r}")
    return parts


def _save_lm(req: _Request, loaded, quantized, details: dict, perplexity) -> str:
    from ..lm.checkpoint import save_lm

    record = _record(req, quantized.config.quantization, details, perplexity)
    training = {**loaded.training, "quantization": record}
    path = save_lm(quantized, req.output, tokenizer=loaded.tokenizer, training=training)
    model = loaded.model
    what = f"{len(model.moe_layers())} DeaMoE FFN(s) of {len(model.layers)} block(s)"
    parts = quantized.config.quantized_linears
    return _written(req, what + (f" and the {', '.join(parts)} projections" if parts else ""), path)


def _record(req: _Request, quant: QuantConfig, details: dict, perplexity) -> dict:
    """The "quantization" entry of the output's training record."""
    record = {"source": req.checkpoint, **quant.to_dict(), **details}
    if perplexity is not None:
        record["held_out_perplexity"] = perplexity
    return record


def _quant_name(quant: QuantConfig, linears: tuple[str, ...] = ()) -> str:
    name = f"int{quant.bits}, group {quant.group_size}" + (f", {quant.method}" if quant.method != "rtn" else "")
    return name + "".join(f" + {part}" for part in linears)


def _calibration_ids(req: _Request, tokenizer) -> tuple[torch.Tensor, str]:
    """(Token ids of --calibration TEXTFILE, or of the shipped text's training part; where they come from)."""
    from ..train.lm import TrainSettings, shipped_text, split_text

    if req.calibration is None:
        try:
            ids, _ = split_text(shipped_text(), tokenizer, TrainSettings().val_fraction)
        except UsageError as exc:
            raise UsageError(
                f"the model's tokenizer cannot encode the shipped training text ({exc}); pass --calibration TEXTFILE"
            ) from None
        return ids, "the shipped text's training part (its first 90%)"
    path = Path(req.calibration)
    if not path.is_file():
        raise UsageError(f"--calibration {path}: no such file (a language model calibrates on a text file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--calibration {path} is not a readable UTF-8 text file: {exc}") from None
    if not text.strip():
        raise UsageError(f"--calibration {path} is empty")
    ids = tokenizer.encode(text, what=f"--calibration {path}")
    return torch.tensor(ids, dtype=torch.long), f"{path} (not checked against the held-out text: keep them apart)"


def _awq_work(work: Path, model, quant: QuantConfig, ids: torch.Tensor):
    """The work folder of this AWQ run: resumed when the source weights, the calibration
    tokens and the settings are those of the run that left it, else started afresh."""
    from ..work_folder import fingerprint, open_work

    tensors = [*model.state_dict().values(), ids]
    key = fingerprint(tensors, quant, command="quantize")
    return open_work(work, key, command="quantize", what="quantization")


def _run_lm_awq(req: _Request, loaded, work: Path) -> str:
    """AWQ for a language model: calibrate on text, print RTN's and AWQ's error per block on
    held-out FFN inputs and both models' held-out perplexity next to the input's."""
    from ..console import format_table
    from ..summary import layer_error
    from ..train.lm import TrainSettings, shipped_text, split_text
    from .lm import calibration_windows, ffn_inputs, quantize_lm_awq

    quant = req.quant
    model, tokenizer = loaded.model, loaded.tokenizer
    model.config.replace(quantization=quant)  # widths against the group size: before reading any text
    ids, source = _calibration_ids(req, tokenizer)
    length = min(128, model.config.max_position_embeddings)
    try:
        _, held_ids = split_text(shipped_text(), tokenizer, TrainSettings().val_fraction)
        held_out = ffn_inputs(model, calibration_windows(held_ids, length))
        where = "FFN inputs from the shipped text's held-out last 10%"
    except UsageError:  # a tokenizer that cannot encode the held-out text: random tokens instead
        gen = torch.Generator().manual_seed(req.seed)
        d = model.config.hidden_size
        held_out = {i: torch.randn(req.tokens, d, generator=gen).to(model.dtype) for i in model.moe_layers()}
        where = f"{req.tokens} random tokens (the model's tokenizer cannot encode the held-out text)"
    result = quantize_lm_awq(model, quant, ids, linears=req.linears, work=_awq_work(work, model, quant, ids))
    print(f"calibration (what the search sees): {result.tokens} tokens of {source}")
    print(f"held out (what the tables measure, not seen by the search): {where}")
    rtn = model.quantized(QuantConfig(quant.bits, quant.group_size), linears=req.linears)
    rows = []
    for i in model.moe_layers():
        x, s = held_out[i], result.input_scales[i]
        folded_x = x / s.to(x.dtype)  # what the folded and the AWQ block's FFN see
        rtn_error, _, _ = layer_error(model.layers[i].mlp, rtn.layers[i].mlp, x)
        awq_error, _, _ = layer_error(result.folded.layers[i].mlp, result.model.layers[i].mlp, folded_x)
        awq_experts = result.model.layers[i].mlp.route(folded_x).expert_ids
        moved = int((model.layers[i].mlp.route(x).expert_ids != awq_experts).any(dim=-1).sum())
        exponents = torch.log2(s)
        plan = result.plans[i]
        rows.append(
            (
                f"block {i}",
                x.shape[0],
                f"{rtn_error:.3e}",
                f"{awq_error:.3e}",
                f"{awq_error / rtn_error:.3f}" if rtn_error else "-",
                "none (s = 1)" if not bool(exponents.any()) else f"2^{int(exponents.min())}..2^{int(exponents.max())}",
                f"{sum(plan.uncalibrated.values())}/{sum(plan.groups.values())}",
                moved,
            )
        )
    print(
        format_table(
            (
                "block",
                "held-out tokens",
                "RTN error",
                "AWQ error",
                "AWQ / RTN",
                "gate_up input scales",
                "parts without calibration tokens (RTN)",
                "tokens with other experts",
            ),
            rows,
            title=f"Relative FFN output error ||y_q - y|| / ||y|| vs {req.checkpoint} on {where}",
        )
    )
    name = _quant_name(quant, req.linears)
    rtn_name = _quant_name(quant).removesuffix(", awq") + ", rtn" + name.removeprefix(_quant_name(quant))
    perplexity = _print_perplexity(req.checkpoint, tokenizer, model, [(rtn_name, rtn), (name, result.model)])
    details = {"calibration": source, "calibration_tokens": result.tokens}
    return _save_lm(req, loaded, result.model, details, perplexity)


def _print_perplexity(checkpoint: str, tokenizer, model, quantized: list) -> dict | None:
    """Print the held-out perplexity of the input and of each (label, quantized model) side by
    side; return them by label (None: no tokenizer for the text)."""
    from ..checkpoint import dtype_name
    from ..console import format_table
    from ..train.lm import TEXT_SOURCE
    from .lm import held_out_loss

    names = " and ".join(label for label, _ in quantized)
    print(f"measuring the held-out perplexity of {checkpoint} and of its {names} model(s) ...", flush=True)
    base = held_out_loss(model, tokenizer)
    if base is None:
        print(f"(no held-out perplexity: the model's {tokenizer.describe()} cannot encode the shipped text)")
        return None
    losses = [(f"input ({dtype_name(model.dtype)})", base)]
    # The input's tokenizer encoded the text, so every quantized copy's does: each loss is a float.
    losses += [(label, cast(float, held_out_loss(q, tokenizer))) for label, q in quantized]
    rows = [(label, f"{v:.4f}", f"{math.exp(v):.3f}", f"{math.exp(v - base):.4f}x") for label, v in losses]
    title = f"Held-out perplexity (last 10% of {TEXT_SOURCE}; same windows for all)"
    print(format_table(("model", "held-out loss", "perplexity", "vs input"), rows, title=title))
    result = {"input": round(math.exp(base), 4)}
    for label, value in losses[1:]:
        result["quantized" if len(losses) == 2 else label] = round(math.exp(value), 4)
    return result


def _print_error(req: _Request, reference, quantized, labels=None) -> None:
    """The error table of round to nearest: on --eval FILE's layer inputs, else on random tokens."""
    from ..console import format_table
    from ..summary import quantization_error
    from .awq import read_calibration

    if req.eval:
        inputs = read_calibration(req.eval, reference, what="--eval")
        where = f"{inputs[0].shape[0]} tokens of {req.eval}"
    else:
        inputs, where = None, f"{req.tokens} random tokens"
    rows = quantization_error(reference, quantized, tokens=req.tokens, seed=req.seed, inputs=inputs, labels=labels)
    print(
        format_table(
            ("layer", "relative error", "max abs error", "tokens with other experts"),
            rows,
            title=f"Quantization error on {where} (vs {req.checkpoint})",
        )
    )


def _awq(req: _Request, stack) -> Any:
    """Quantize with AWQ and print RTN's and AWQ's held-out error side by side."""
    from ..console import format_table
    from ..summary import layer_error
    from .awq import quantize_stack_awq, read_calibration, split_held_out

    assert req.calibration is not None  # _run_layers refused awq without it
    inputs = read_calibration(req.calibration, stack, seed=req.seed)
    if req.eval:
        calibration, held_out = inputs, read_calibration(req.eval, stack, seed=req.seed + 1, what="--eval")
        where = req.eval
    else:
        calibration, held_out = split_held_out(inputs)
        where = "the last quarter of the calibration tokens, not used by the search"
    quant = req.quant
    rtn = stack.quantized(QuantConfig(quant.bits, quant.group_size))
    awq, plans = quantize_stack_awq(stack, quant, calibration)
    rows = []
    for i, plan in enumerate(plans):
        x = held_out[i].to(stack.dtype)
        rtn_error, _, _ = layer_error(stack.layers[i], rtn.layers[i], x)
        awq_error, _, moved = layer_error(stack.layers[i], awq.layers[i], x)
        uncalibrated = sum(plan.uncalibrated.values())
        rows.append(
            (
                str(i),
                calibration[i].shape[0],
                held_out[i].shape[0],
                f"{rtn_error:.3e}",
                f"{awq_error:.3e}",
                f"{awq_error / rtn_error:.3f}" if rtn_error else "-",
                f"{uncalibrated}/{sum(plan.groups.values())}",
                moved,
            )
        )
    print(
        format_table(
            (
                "layer",
                "calibration tokens",
                "held-out tokens",
                "RTN error",
                "AWQ error",
                "AWQ / RTN",
                "parts without calibration tokens (RTN)",
                "tokens with other experts",
            ),
            rows,
            title=f"Relative output error ||y_q - y|| / ||y|| vs {req.checkpoint}, held out: {where}",
        )
    )
    return awq


def _written(req: _Request, what: str, path) -> str:
    """The line that says what was written where (the output's final place)."""
    from ..console import format_bytes

    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    q = req.quant
    settings = f"int{q.bits}, group size {q.group_size}, {q.method}"
    return f"wrote {what}, {settings}, {format_bytes(size)} to {req.shown_output}"
