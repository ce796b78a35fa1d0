"""`deamoe-trt train-tiny`: train the tiny-lm preset on the shipped text (deterministic, CPU)."""

from __future__ import annotations

from . import args as common

DEFAULT_STEPS = 500


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-tiny",
        help="train the tiny-lm language model on the shipped text (about 2 minutes on a CPU core)",
        description=__doc__,
    )
    common.add_output(parser, required=False, help="checkpoint directory to write (default ./tiny-lm)", directory=True)
    parser.add_argument(
        "--steps",
        type=common.positive_int,
        default=None,
        help=f"optimizer steps (default {DEFAULT_STEPS}; --quick: 40)",
    )
    common.add_seed(parser)
    parser.add_argument("--quick", action="store_true", help="a few seconds: small batches, 40 steps (for tests)")
    parser.add_argument(
        "--threads",
        type=common.thread_count,
        default=1,
        help="torch CPU threads (default 1: the same seed gives the same weights on any machine)",
    )
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from ..train.lm import QUICK, TrainSettings
    from ..train.tiny import run_train_tiny

    base = QUICK if args.quick else TrainSettings(steps=DEFAULT_STEPS)
    settings = dataclasses.replace(base, steps=args.steps or base.steps, seed=args.seed, threads=args.threads)
    return run_train_tiny(args.output or "tiny-lm", settings, force=args.force, note=common.note)
