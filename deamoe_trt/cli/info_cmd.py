"""`deamoe-trt info`: a checkpoint's config, parameters and weights loaded per step, its size
and bytes per step at fp32/fp16/int8/int4, and which models fit which Jetson/Thor devices."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import args as common

if TYPE_CHECKING:
    from ..lm.checkpoint import Checkpoint


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="show a checkpoint's config and bytes per step", description=__doc__)
    parser.add_argument(
        "checkpoint",
        metavar="CKPT",
        nargs="?",
        help="checkpoint directory (config.json + model.safetensors); optional with --fit",
    )
    common.add_tokens(parser)
    parser.add_argument("--samples", type=common.positive_int, default=16, help="random batches per token count")
    parser.add_argument(
        "--fit",
        action="store_true",
        help="also print which presets and whole models (Qwen3-30B-A3B, DeepSeek-V3) fit Orin/Thor at fp16/int8/int4",
    )
    common.add_seed(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError

    if args.checkpoint is None and not args.fit:
        raise UsageError("give a checkpoint directory, or --fit for the device memory-fit table")
    if args.checkpoint is not None:
        from ..lm.checkpoint import read

        found = read(args.checkpoint)
        if found.artifact == "lm":
            _lm_info(found)
        else:
            from ..summary import bit_width_table, config_table, parameter_table, traffic_table

            stack = found.stack()
            print(config_table(stack.config), end="\n\n")
            print(parameter_table(stack), end="\n\n")
            print(traffic_table(stack, args.tokens, samples=args.samples, seed=args.seed), end="\n\n")
            print(bit_width_table(stack, args.tokens, samples=args.samples, seed=args.seed))
    if args.fit:
        from ..fit import fit_table

        if args.checkpoint is not None:
            print()
        print(fit_table())
    return 0


def _lm_info(found: Checkpoint) -> None:
    """A language model: its FFN config and what its attention caches and reads per token."""
    from ..checkpoint import DTYPES
    from ..lm.cache_report import cache_table
    from ..summary import config_table

    config = found.header["config"]  # an LMConfig
    attention = "multi-head latent attention" if config.is_mla else "grouped-query attention"
    print(f"language model: {config.num_layers} blocks, d={config.hidden_size}, {attention}, {found.dtype}")
    print(config_table(config.moe), end="\n\n")
    print(cache_table(config, DTYPES[found.dtype].itemsize))
