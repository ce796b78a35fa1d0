"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

The departments' shared parts, the experts' private parts and the shared experts are
quantized (symmetric, ONNX Runtime QMoE's packing); the router and the shared-expert gate
stay as they are. --method rtn (default) rounds to nearest and prints the error against the
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
    common.add_checkpoint(parser)
    common.add_output(parser, help="quantized checkpoint directory to write", directory=True)
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
    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    if stack.quant is not None:
        stack.layers[0].quantized(quant)  # the one "already quantized" error
    if args.method == "awq":
        quantized = _awq(args, stack, quant)
    else:
        quantized = stack.quantized(quant)
        _print_rtn_error(args, stack, quantized)
    path = quantized.save_pretrained(args.output)
    _print_written(args, stack, path)
    return 0


def _print_rtn_error(args, stack, quantized) -> None:
    from ..awq import read_calibration
    from ..report import format_table
    from ..summary import quantization_error

    if args.eval:
        inputs = read_calibration(args.eval, stack, what="--eval")
        where = f"{inputs[0].shape[0]} tokens of {args.eval}"
    else:
        inputs, where = None, f"{args.tokens} random tokens"
    rows = quantization_error(stack, quantized, tokens=args.tokens, seed=args.seed, inputs=inputs)
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


def _print_written(args, stack, path) -> None:
    from pathlib import Path

    from ..report import format_bytes

    size = sum(f.stat().st_size for f in Path(path).iterdir())
    print(
        f"wrote {len(stack.layers)} layer(s), int{args.bits}, group size {args.group_size}, {args.method}, "
        f"{format_bytes(size)} to {path}"
    )
