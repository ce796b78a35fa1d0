"""`deamoe-trt init`: write a randomly initialised checkpoint of a preset."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    from ..presets import PRESETS

    parser = subparsers.add_parser("init", help="write a random checkpoint of a preset", description=__doc__)
    parser.add_argument("--preset", choices=list(PRESETS), default="tiny", help="layer shape (default tiny)")
    parser.add_argument("--layers", type=common.positive_int, default=1, help="layers in the stack (default 1)")
    common.add_output(parser, help="checkpoint directory to write", directory=True)
    common.add_seed(parser)
    common.add_dtype(parser, choices=tuple(common.DTYPE_NAMES))
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..presets import write_random

    dtype = common.DTYPE_NAMES[args.dtype]
    write_random(args.output, args.preset, args.layers, seed=args.seed, dtype=dtype, force=args.force, note=common.note)
    print(f"wrote {args.preset} ({args.layers} layer(s), {args.dtype}) to {args.output}")
    return 0
