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
    from pathlib import Path

    from .. import runtimes
    from .._io import check_replaceable, json_format_is, replaced_directory
    from ..console import format_bytes, format_table
    from ..lm.checkpoint import FORMAT
    from ..runtimes.decode import generate
    from ..train.lm import QUICK, TEXT_SOURCE, TrainSettings, save_trained, train

    base = QUICK if args.quick else TrainSettings(steps=DEFAULT_STEPS)
    settings = dataclasses.replace(base, steps=args.steps or base.steps, seed=args.seed, threads=args.threads)
    out, ours, what = Path(args.output or "tiny-lm"), json_format_is(FORMAT), "language-model checkpoint"
    check_replaceable(out, ours, what, force=args.force)  # before the training, not after it
    print(f"training tiny-lm for {settings.steps} steps on {TEXT_SOURCE} (seed {settings.seed})")
    result = train(settings=settings)
    with replaced_directory(out, ours, what, force=args.force, note=common.note) as staging:
        save_trained(result, settings, staging)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        format_table(
            ("loss (nats per byte)", "value"),
            [
                ("validation, before training", f"{result.initial_val_loss:.3f}"),
                ("train (last 10% of steps)", f"{result.train_loss:.3f}"),
                ("validation, after training", f"{result.val_loss:.3f}"),
            ],
            title=f"Trained in {result.seconds:.0f} s",
        )
    )
    prompt = "Anne"
    sample = generate(runtimes.get("torch").decoder(result.model), result.tokenizer.encode(prompt), 80)
    print(f"\ngreedy sample: {prompt + result.tokenizer.decode(sample.new_ids)!r}")
    print(f"\nwrote {out} ({format_bytes(size)})")
    return 0
