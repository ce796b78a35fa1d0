"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

Takes a layer/stack checkpoint or a whole language-model checkpoint. The departments' shared
parts, the experts' private parts and the shared experts are quantized (symmetric, ONNX
Runtime QMoE's packing); the router and the shared-expert gate stay as they are, and so do a
language model's attention, embeddings, norms, dense MLPs and head. A language model
(--method rtn) gets the error table of each DeaMoE FFN on random tokens and the held-out
perplexity of the input and of the quantized model, measured in the same run on the same
windows of the shipped text; with --method awq it calibrates on --calibration TEXTFILE
(default: the shipped text's training part) and prints RTN's and AWQ's error per FFN on
held-out text and the input's, RTN's and AWQ's held-out perplexity. For a layer checkpoint,
--method rtn (default) rounds to nearest and prints the error against the input checkpoint
on random tokens (or on --eval FILE's). --method awq (activation-aware,
docs/quantization.md) chooses channel scales and clipping from --calibration FILE's layer
inputs and prints round to nearest's and its own error on held-out tokens (--eval FILE, or
the last quarter of the calibration tokens, which the search does not see). Both print how
many tokens changed experts (none can: the router is not quantized).

--no-compare skips the error table and the perplexities. A language model's plain round to
nearest (--method rtn, no --linears) is then streamed: each tensor read from the input on
disk, quantized and written in turn, holding one tensor rather than the model (the same
bytes as the in-memory path), so models larger than memory quantize. The measurements,
--method awq and --linears hold the whole model.
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    from ..quant import BITS, GROUP_SIZES, METHODS

    parser = subparsers.add_parser(
        "quantize", help="quantize a checkpoint's FFN weights to int8 or int4", description=__doc__
    )
    common.add_checkpoint(parser, help="layer/stack or language-model checkpoint directory")
    common.add_output(parser, help="quantized checkpoint directory to write (same kind as the input)", directory=True)
    parser.add_argument("--bits", type=int, required=True, choices=BITS, help="bits per weight: 8 or 4")
    parser.add_argument(
        "--group-size", type=int, default=64, choices=GROUP_SIZES, help="input columns per scale (default 64)"
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="rtn",
        help="rtn: round to nearest (default); awq: activation-aware, needs --calibration",
    )
    parser.add_argument(
        "--calibration",
        metavar="FILE",
        help="--method awq: for a layer checkpoint a safetensors file of layer inputs, 'hidden_states' [T, d] (the "
        "first layer's) or 'layers.{i}.hidden_states' for every layer, or 'random:N' for N Gaussian tokens (a demo); "
        "for a language model a text file (default: the shipped text's training part, never the held-out part)",
    )
    parser.add_argument(
        "--eval",
        metavar="FILE",
        help="held-out layer inputs (same format) to measure the error on; --method awq's default: the last "
        "quarter of the calibration tokens",
    )
    parser.add_argument(
        "--tokens",
        type=common.int_in_range(1, 1 << 20, "a token count"),
        default=64,
        help="--method rtn without --eval: random tokens to measure the error on (default 64)",
    )
    parser.add_argument(
        "--linears",
        default="",
        metavar="PARTS",
        help="language models: also quantize these projections with the same bits and group size, comma-separated "
        "of attention, dense, head (default: the DeaMoE FFNs only); the held-out perplexity of each added part is "
        "printed",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="--method rtn: skip the error table and the perplexities; a language model without --linears is then "
        "quantized tensor by tensor from disk (bounded memory), the measurements, awq and --linears hold the model",
    )
    common.add_seed(parser)
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from .._io import check_not_input, json_format_is, replaced_directory
    from ..checkpoint import FORMAT
    from ..errors import UsageError
    from ..lm.checkpoint import FORMAT as LM_FORMAT
    from ..lm.checkpoint import is_lm_checkpoint
    from ..quant import QuantConfig

    check_not_input(args.output, [args.checkpoint])  # it is read while the output is written
    if args.method == "rtn" and args.calibration:
        raise UsageError("--calibration is for --method awq (round to nearest uses no data); --eval FILE measures")
    if args.no_compare and args.method != "rtn":
        raise UsageError(f"--no-compare is for --method rtn; --method {args.method} prints its own error tables")
    quant = QuantConfig(args.bits, args.group_size, args.method)
    args.linears = _linears(args.linears)
    lm = is_lm_checkpoint(args.checkpoint)
    # The output is written whole beside its place and then takes it: an interrupted run leaves
    # nothing, and no file of an older output stays. Only a checkpoint of the same kind is replaced.
    ours = json_format_is(LM_FORMAT if lm else FORMAT)
    kind = "language-model checkpoint" if lm else "layer checkpoint"
    with replaced_directory(args.output, ours, kind, force=args.force, note=common.note) as staging:
        args.shown_output, args.output = args.output, str(staging)
        return _run_lm(args, quant) if lm else _run_layers(args, quant)


def _run_layers(args, quant) -> int:
    from ..errors import UsageError
    from ..layer import DeaMoEStack

    if args.linears:
        raise UsageError("--linears is for language-model checkpoints (a layer checkpoint holds only FFNs)")
    if args.method == "awq" and not args.calibration:
        raise UsageError(
            "--method awq needs --calibration FILE (layer inputs as safetensors; random:N for a Gaussian demo)"
        )
    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    if stack.quant is not None:
        stack.layers[0].quantized(quant)  # the one "already quantized" error
    if args.method == "awq":
        quantized = _awq(args, stack, quant)
    else:
        quantized = stack.quantized(quant)
        if not args.no_compare:
            _print_error(args, stack, quantized)
    path = quantized.save_pretrained(args.output)
    _print_written(args, f"{len(stack.layers)} layer(s)", path)
    return 0


def _run_lm(args, quant) -> int:
    from ..errors import UsageError
    from ..lm.checkpoint import load_lm
    from ..quantize.lm import quantize_lm

    if args.eval:
        raise UsageError(
            "--eval takes layer inputs, for layer checkpoints; a language model is measured by its held-out "
            "perplexity on the shipped text"
        )
    if args.no_compare and not args.linears:
        return _run_lm_streamed(args, quant)
    loaded = load_lm(args.checkpoint)
    model = loaded.model
    if model.config.quantization is not None:
        model.quantized(quant)  # the one "already quantized" error, before any work
    if quant.method == "awq":
        import torch

        # Many small matmuls: on the tiny LM one thread took 9.7 s where two took 85 s (2-core VM, shared).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _run_lm_awq(args, quant, loaded)
        finally:
            torch.set_num_threads(threads)
    # One model per choice: the FFNs, then each part of --linears added in turn.
    choices = [args.linears[:n] for n in range(len(args.linears) + 1)]
    models = [(_quant_name(quant, parts), quantize_lm(model, quant, linears=parts)) for parts in choices]
    quantized = models[-1][1]
    if args.no_compare:
        _save_lm(args, loaded, quantized, {}, None)
        return 0
    blocks = model.moe_layers()
    _print_error(
        args,
        [model.layers[i].mlp for i in blocks],
        [quantized.layers[i].mlp for i in blocks],
        labels=[f"block {i}" for i in blocks],
    )
    perplexity = _print_perplexity(args.checkpoint, loaded.tokenizer, model, models)
    _save_lm(args, loaded, quantized, {}, perplexity)
    return 0


def _run_lm_streamed(args, quant) -> int:
    """Round to nearest tensor by tensor from disk (deamoe_trt.quantize.lm.quantize_checkpoint_streamed)."""
    from ..lm.checkpoint import read_lm_header
    from ..quantize.lm import quantize_checkpoint_streamed

    path = quantize_checkpoint_streamed(args.checkpoint, args.output, quant, _record(args, quant, {}, None))
    config = read_lm_header(path)["config"]
    moe = sum(not config.is_dense(i) for i in range(config.num_layers))
    what = f"{moe} DeaMoE FFN(s) of {config.num_layers} block(s)"
    _print_written(args, what, path)
    return 0


def _linears(text: str) -> tuple[str, ...]:
    from ..errors import UsageError
    from ..lm.qlinear import LINEAR_PARTS

    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if any(p not in LINEAR_PARTS for p in parts) or len(set(parts)) != len(parts):
        raise UsageError(f"--linears takes distinct parts of {', '.join(LINEAR_PARTS)}, comma-separated; got {text!r}")
    return parts


def _save_lm(args, loaded, quantized, details: dict, perplexity) -> None:
    from ..lm.checkpoint import save_lm

    record = _record(args, quantized.config.quantization, details, perplexity)
    training = {**loaded.training, "quantization": record}
    path = save_lm(quantized, args.output, tokenizer=loaded.tokenizer, training=training)
    model = loaded.model
    what = f"{len(model.moe_layers())} DeaMoE FFN(s) of {len(model.layers)} block(s)"
    parts = quantized.config.quantized_linears
    _print_written(args, what + (f" and the {', '.join(parts)} projections" if parts else ""), path)


def _record(args, quant, details: dict, perplexity) -> dict:
    """The "quantization" entry of the output's training record."""
    record = {"source": str(args.checkpoint), **quant.to_dict(), **details}
    if perplexity is not None:
        record["held_out_perplexity"] = perplexity
    return record


def _quant_name(quant, linears: tuple[str, ...] = ()) -> str:
    name = f"int{quant.bits}, group {quant.group_size}" + (f", {quant.method}" if quant.method != "rtn" else "")
    return name + "".join(f" + {part}" for part in linears)


def _calibration_ids(args, tokenizer):
    """(Token ids of --calibration TEXTFILE, or of the shipped text's training part; where they come from)."""
    from pathlib import Path

    import torch

    from ..errors import UsageError
    from ..train.lm import TrainSettings, shipped_text, split_text

    if args.calibration is None:
        try:
            ids, _ = split_text(shipped_text(), tokenizer, TrainSettings().val_fraction)
        except UsageError as exc:
            raise UsageError(
                f"the model's tokenizer cannot encode the shipped training text ({exc}); pass --calibration TEXTFILE"
            ) from None
        return ids, "the shipped text's training part (its first 90%)"
    path = Path(args.calibration)
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


def _run_lm_awq(args, quant, loaded) -> int:
    """AWQ for a language model: calibrate on text, print RTN's and AWQ's error per block on
    held-out FFN inputs and both models' held-out perplexity next to the input's."""
    import torch

    from ..console import format_table
    from ..errors import UsageError
    from ..quant import QuantConfig
    from ..quantize.lm import calibration_windows, ffn_inputs, quantize_lm_awq
    from ..summary import layer_error
    from ..train.lm import TrainSettings, shipped_text, split_text

    model, tokenizer = loaded.model, loaded.tokenizer
    model.config.replace(quantization=quant)  # widths against the group size: before reading any text
    ids, source = _calibration_ids(args, tokenizer)
    length = min(128, model.config.max_position_embeddings)
    try:
        _, held_ids = split_text(shipped_text(), tokenizer, TrainSettings().val_fraction)
        held_out = ffn_inputs(model, calibration_windows(held_ids, length))
        where = "FFN inputs from the shipped text's held-out last 10%"
    except UsageError:  # a tokenizer that cannot encode the held-out text: random tokens instead
        gen = torch.Generator().manual_seed(args.seed)
        d = model.config.hidden_size
        held_out = {i: torch.randn(args.tokens, d, generator=gen).to(model.dtype) for i in model.moe_layers()}
        where = f"{args.tokens} random tokens (the model's tokenizer cannot encode the held-out text)"
    result = quantize_lm_awq(model, quant, ids, linears=args.linears)
    print(f"calibration (what the search sees): {result.tokens} tokens of {source}")
    print(f"held out (what the tables measure, not seen by the search): {where}")
    rtn = model.quantized(QuantConfig(quant.bits, quant.group_size), linears=args.linears)
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
            title=f"Relative FFN output error ||y_q - y|| / ||y|| vs {args.checkpoint} on {where}",
        )
    )
    name = _quant_name(quant, args.linears)
    rtn_name = _quant_name(quant).removesuffix(", awq") + ", rtn" + name.removeprefix(_quant_name(quant))
    perplexity = _print_perplexity(args.checkpoint, tokenizer, model, [(rtn_name, rtn), (name, result.model)])
    details = {"calibration": source, "calibration_tokens": result.tokens}
    _save_lm(args, loaded, result.model, details, perplexity)
    return 0


def _print_perplexity(checkpoint, tokenizer, model, quantized: list) -> dict | None:
    """Print the held-out perplexity of the input and of each (label, quantized model) side by
    side; return them by label (None: no tokenizer for the text)."""
    import math
    from typing import cast

    from ..checkpoint import dtype_name
    from ..console import format_table
    from ..quantize.lm import held_out_loss
    from ..train.lm import TEXT_SOURCE

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


def _print_error(args, reference, quantized, labels=None) -> None:
    """The error table of round to nearest: on --eval FILE's layer inputs, else on random tokens."""
    from ..console import format_table
    from ..quantize.awq import read_calibration
    from ..summary import quantization_error

    if args.eval:
        inputs = read_calibration(args.eval, reference, what="--eval")
        where = f"{inputs[0].shape[0]} tokens of {args.eval}"
    else:
        inputs, where = None, f"{args.tokens} random tokens"
    rows = quantization_error(reference, quantized, tokens=args.tokens, seed=args.seed, inputs=inputs, labels=labels)
    print(
        format_table(
            ("layer", "relative error", "max abs error", "tokens with other experts"),
            rows,
            title=f"Quantization error on {where} (vs {args.checkpoint})",
        )
    )


def _awq(args, stack, quant):
    """Quantize with AWQ and print RTN's and AWQ's held-out error side by side."""
    from ..console import format_table
    from ..quant import QuantConfig
    from ..quantize.awq import quantize_stack_awq, read_calibration, split_held_out
    from ..summary import layer_error

    inputs = read_calibration(args.calibration, stack, seed=args.seed)
    if args.eval:
        calibration, held_out = inputs, read_calibration(args.eval, stack, seed=args.seed + 1, what="--eval")
        where = args.eval
    else:
        calibration, held_out = split_held_out(inputs)
        where = "the last quarter of the calibration tokens, not used by the search"
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
            title=f"Relative output error ||y_q - y|| / ||y|| vs {args.checkpoint}, held out: {where}",
        )
    )
    return awq


def _print_written(args, what: str, path) -> None:
    from pathlib import Path

    from ..console import format_bytes

    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    shown = getattr(args, "shown_output", path)  # where the output goes once whole
    print(f"wrote {what}, int{args.bits}, group size {args.group_size}, {args.method}, {format_bytes(size)} to {shown}")
