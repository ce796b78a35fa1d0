"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

Takes a layer/stack checkpoint or a whole language-model checkpoint. The departments' shared
parts, the experts' private parts and the shared experts are quantized (symmetric, ONNX
Runtime QMoE's packing); the router and the shared-expert gate stay as they are, and so do
a language model's attention, embeddings, norms, dense MLPs and head. A language model
(--method rtn) gets the error table of each DeaMoE FFN on random tokens and the held-out
perplexity of the input and of the quantized model, measured in the same run on the same
windows of the shipped text. --method rtn (default) rounds to nearest and prints the error against the
input checkpoint on random tokens (or on --eval FILE's). --method awq (activation-aware,
docs/quantization.md) chooses channel scales and clipping from --calibration FILE's layer
inputs and prints round to nearest's and its own error on held-out tokens (--eval FILE, or
the last quarter of the calibration tokens, which the search does not see). Both print how
many tokens changed experts (none can: the router is not quantized).
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
        help="--method awq: safetensors file of layer inputs, 'hidden_states' [T, d] (the first layer's) or "
        "'layers.{i}.hidden_states' for every layer; 'random:N' for N Gaussian tokens (a demo)",
    )
    parser.add_argument(
        "--eval",
        metavar="FILE",
        help="held-out layer inputs (same format) to measure the error on; --method awq's default: the last "
        "quarter of the calibration tokens",
    )
    parser.add_argument(
        "--tokens",
        type=common.positive_int,
        default=64,
        help="--method rtn without --eval: random tokens to measure the error on (default 64)",
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import UsageError
    from ..layer import DeaMoEStack
    from ..lm.checkpoint import is_lm_checkpoint
    from ..quant import QuantConfig

    if Path(args.output).resolve() == Path(args.checkpoint).resolve():
        raise UsageError("--output must differ from the input checkpoint (it is read while the output is written)")
    if args.method == "awq" and not args.calibration:
        raise UsageError(
            "--method awq needs --calibration FILE (layer inputs as safetensors; random:N for a Gaussian demo)"
        )
    if args.method == "rtn" and args.calibration:
        raise UsageError("--calibration is for --method awq (round to nearest uses no data); --eval FILE measures")
    quant = QuantConfig(args.bits, args.group_size, args.method)
    if is_lm_checkpoint(args.checkpoint):
        return _run_lm(args, quant)
    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    if stack.quant is not None:
        stack.layers[0].quantized(quant)  # the one "already quantized" error
    if args.method == "awq":
        quantized = _awq(args, stack, quant)
    else:
        quantized = stack.quantized(quant)
        _print_error(args, stack, quantized)
    path = quantized.save_pretrained(args.output)
    _print_written(args, f"{len(stack.layers)} layer(s)", path)
    return 0


def _run_lm(args, quant) -> int:
    from ..errors import UsageError
    from ..lm.checkpoint import load_lm, save_lm
    from ..lm.quantize import quantize_lm

    if args.eval:
        raise UsageError(
            "--eval takes layer inputs, for layer checkpoints; a language model is measured by its held-out "
            "perplexity on the shipped text"
        )
    loaded = load_lm(args.checkpoint)
    model = loaded.model
    # A calibrated method (--method awq) would pass the token ids of its --calibration text here.
    quantized = quantize_lm(model, quant)
    blocks = model.moe_layers()
    _print_error(
        args,
        [model.layers[i].mlp for i in blocks],
        [quantized.layers[i].mlp for i in blocks],
        labels=[f"block {i}" for i in blocks],
    )
    record = {"source": str(args.checkpoint), **quant.to_dict()}
    perplexity = _print_perplexity(args.checkpoint, loaded.tokenizer, model, quantized)
    if perplexity is not None:
        record["held_out_perplexity"] = perplexity
    training = {**loaded.training, "quantization": record}
    path = save_lm(quantized, args.output, tokenizer=loaded.tokenizer, training=training)
    _print_written(args, f"{len(blocks)} DeaMoE FFN(s) of {len(model.layers)} block(s)", path)
    return 0


def _print_perplexity(checkpoint, tokenizer, model, quantized) -> dict | None:
    """Print both models' held-out perplexity side by side; return them (None: no tokenizer for the text)."""
    import math

    from ..checkpoint import dtype_name
    from ..lm.quantize import held_out_loss
    from ..lm.train import TEXT_SOURCE
    from ..report import format_table

    q = quantized.config.quantization
    name = f"int{q.bits}, group {q.group_size}"
    print(f"measuring the held-out perplexity of {checkpoint} and of its {name} model ...", flush=True)
    base = held_out_loss(model, tokenizer)
    if base is None:
        print(f"(no held-out perplexity: the model's {tokenizer.describe()} cannot encode the shipped text)")
        return None
    loss = held_out_loss(quantized, tokenizer)
    rows = [
        (label, f"{value:.4f}", f"{math.exp(value):.3f}", f"{math.exp(value - base):.4f}x")
        for label, value in ((f"input ({dtype_name(model.dtype)})", base), (name, loss))
    ]
    title = f"Held-out perplexity (last 10% of {TEXT_SOURCE}; same windows for both)"
    print(format_table(("model", "held-out loss", "perplexity", "vs input"), rows, title=title))
    return {"input": round(math.exp(base), 4), "quantized": round(math.exp(loss), 4)}


def _print_error(args, reference, quantized, labels=None) -> None:
    """The error table of round to nearest: on --eval FILE's layer inputs, else on random tokens."""
    from ..awq import read_calibration
    from ..report import format_table
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
    from ..awq import quantize_stack_awq, read_calibration, split_held_out
    from ..quant import QuantConfig
    from ..report import format_table
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

    from ..report import format_bytes

    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    print(f"wrote {what}, int{args.bits}, group size {args.group_size}, {args.method}, {format_bytes(size)} to {path}")
