"""`deamoe-trt info`: a checkpoint's config, parameters and weights loaded per step."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="show a checkpoint's config and bytes per step", description=__doc__)
    common.add_checkpoint(parser)
    common.add_tokens(parser)
    parser.add_argument("--samples", type=common.positive_int, default=16, help="random batches per token count")
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..checkpoint import load_checkpoint
    from ..summary import config_table, parameter_table, traffic_table

    stack = load_checkpoint(args.checkpoint)
    print(config_table(stack.config), end="\n\n")
    print(parameter_table(stack), end="\n\n")
    print(traffic_table(stack, args.tokens, samples=args.samples, seed=args.seed))
    return 0
