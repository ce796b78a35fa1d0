"""`deamoe-trt quantize`: a checkpoint's FFN weights as int8 or int4 with per-group scales.

The departments' shared parts, the experts' private parts and the shared experts are
quantized (round to nearest, symmetric, ONNX Runtime QMoE's packing); the router and the
shared-expert gate stay as they are. Prints the quantization error against the input
checkpoint on random tokens: relative error of the output and how many tokens changed
experts (none can: the router is not quantized).
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
    parser.add_argument("--method", choices=METHODS, default="rtn", help="rtn: round to nearest (default)")
    parser.add_argument(
        "--tokens", type=common.positive_int, default=64, help="random tokens to measure the error on (default 64)"
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import UsageError
    from ..layer import DeaMoEStack
    from ..quant import QuantConfig
    from ..report import format_bytes, format_table
    from ..summary import quantization_error

    if Path(args.output).resolve() == Path(args.checkpoint).resolve():
        raise UsageError("--output must differ from the input checkpoint (it is read while the output is written)")
    quant = QuantConfig(args.bits, args.group_size, args.method)
    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    quantized = stack.quantized(quant)
    path = quantized.save_pretrained(args.output)
    rows = quantization_error(stack, quantized, tokens=args.tokens, seed=args.seed)
    print(
        format_table(
            ("layer", "relative error", "max abs error", "tokens with other experts"),
            rows,
            title=f"Quantization error on {args.tokens} random tokens (vs {args.checkpoint})",
        )
    )
    size = sum(f.stat().st_size for f in Path(path).iterdir())
    print(
        f"wrote {len(stack.layers)} layer(s), int{args.bits}, group size {args.group_size}, "
        f"{format_bytes(size)} to {path}"
    )
    return 0
