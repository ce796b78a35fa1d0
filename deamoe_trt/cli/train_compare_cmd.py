"""`deamoe-trt train`: a DeaMoE language model and a vanilla MoE of equal expert parameters and
active neurons per token, trained from the same data, seed and steps, compared on held-out
perplexity and bytes per decoding step; one process or every process of an `accelerate launch`
or torchrun job (data parallel, or sharded with --fsdp)."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    from ..train.compare import PRESETS
    from ..train.lm import CORPORA

    parser = subparsers.add_parser(
        "train",
        help="train a DeaMoE LM and a vanilla MoE of equal size the same way, and compare them",
        description=__doc__,
    )
    common.add_output(parser, help="directory to write (one checkpoint per model and report.json)", directory=True)
    parser.add_argument(
        "--preset", choices=tuple(PRESETS), default="small", help="model sizes and budget (default small)"
    )
    parser.add_argument(
        "--steps", type=common.positive_int, default=None, help="optimizer steps of every model (default: the preset's)"
    )
    parser.add_argument(
        "--upcycle",
        action="store_true",
        help="also train both from one dense model (sparse upcycling): --dense-steps dense, the rest MoE",
    )
    parser.add_argument(
        "--upcycled-only", action="store_true", help="with --upcycle: only the upcycled models (not those from scratch)"
    )
    parser.add_argument(
        "--dense-steps",
        type=common.positive_int,
        default=None,
        help="dense steps before upcycling (default: the preset's)",
    )
    parser.add_argument(
        "--text", choices=tuple(CORPORA), default=None, help="shipped training text (default: the preset's, persuasion)"
    )
    common.add_seed(parser)
    parser.add_argument(
        "--threads", type=common.thread_count, default=1, help="torch CPU threads per process (default 1)"
    )
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="with several processes, shard every model's weights, gradients and optimizer state over them "
        "(FSDP; also on under `accelerate launch --use_fsdp`)",
    )
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..train.compare import run_comparison

    return run_comparison(
        args.output,
        preset_name=args.preset,
        text=args.text,
        steps=args.steps,
        dense_steps=args.dense_steps,
        upcycled=args.upcycle,
        scratch=not args.upcycled_only,
        seed=args.seed,
        threads=args.threads,
        fsdp=args.fsdp,
        force=args.force,
        note=common.note,
    )
