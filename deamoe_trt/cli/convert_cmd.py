"""`deamoe-trt convert`: turn a trained vanilla MoE (layer, stack or language model) into a
DeaMoE with departments and shared parts, and report what it costs in quality.

Experts are clustered into departments, their neurons aligned, each department's shared
part fitted on calibration data, and (with --heal-steps) the result distilled from the
source. The report compares, at equal bytes per decoding step, the converted model before
and after healing, a naive conversion and a merged-experts alternative with the source."""

from __future__ import annotations

from . import args as common
from . import convert_method


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert a trained vanilla MoE into a DeaMoE (departments + shared parts)", description=__doc__
    )
    common.add_checkpoint(parser, name="source", help="layer/stack or language-model checkpoint of a vanilla MoE")
    common.add_output(parser, help="checkpoint directory to write (same kind as the source)", directory=True)
    parser.add_argument("--departments", type=common.positive_int, metavar="D", help="D (divides the experts)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shared-size", type=common.non_negative_int, metavar="F_S", help="shared neurons/department")
    size.add_argument("--shared-fraction", type=common.unit_fraction, metavar="X", help="f_s / the expert width f")
    parser.add_argument(
        "--private-size", type=common.non_negative_int, metavar="F_P", help="private neurons per expert (default f-f_s)"
    )
    parser.add_argument("--top-departments", type=common.positive_int, metavar="G", help="departments per token")
    convert_method.add_arguments(parser)
    parser.add_argument(
        "--grouping",
        choices=("cluster", "coverage", "keep"),
        default="cluster",
        help="cluster experts (default); coverage: then swap them to keep more of each token's routing weight "
        "in its G departments; keep: the source's order",
    )
    parser.add_argument(
        "--department-score",
        choices=("max", "sum_top2", "sum"),
        help="default: the one that best keeps the source's expert choices",
    )
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--data",
        metavar="PATH",
        help="language models: calibration, healing and held-out text from a UTF-8 text, a JSONL file "
        '(a "text" field a line), a parquet file (a "text" column; needs pyarrow) or a folder of them',
    )
    data.add_argument(
        "--calibration",
        metavar="FILE",
        help="language models: a UTF-8 text (default: the shipped text) or a safetensors file with input_ids; "
        "layers: a safetensors file with hidden_states [T, d] (default: random hidden states)",
    )
    parser.add_argument(
        "--data-tokens", type=common.positive_int, metavar="N", help="--data: read at most N tokens (default: all)"
    )
    parser.add_argument(
        "--heldout-fraction",
        type=common.unit_fraction,
        default=0.1,
        metavar="X",
        help="--data: the last X of the tokens is held out for every reported number (default 0.1)",
    )
    parser.add_argument(
        "--heldout-windows",
        type=common.positive_int,
        metavar="N",
        help="language models: how many held-out windows every reported number is measured on (default 16)",
    )
    parser.add_argument(
        "--calibration-tokens",
        type=common.positive_int,
        metavar="N",
        default=4096,
        help="layers without --calibration: random calibration hidden states (default 4096, plus 1/4 held out)",
    )
    parser.add_argument(
        "--heal-steps", type=common.non_negative_int, default=0, metavar="N", help="distillation steps (default 0)"
    )
    parser.add_argument(
        "--heal-lr",
        type=common.number("a number > 0", lambda v: 0 < v < float("inf")),
        default=1e-3,
        help="healing learning rate (default 1e-3)",
    )
    parser.add_argument(
        "--heal-batch",
        type=common.positive_int,
        default=8,
        metavar="W",
        help="windows per end-to-end healing step, over all processes (default 8)",
    )
    parser.add_argument(
        "--heal-checkpoint",
        metavar="DIR",
        help="write end-to-end healing checkpoints here and resume from those found (one per healed model)",
    )
    parser.add_argument(
        "--checkpoint-every", type=common.non_negative_int, default=0, metavar="N", help="steps between checkpoints"
    )
    parser.add_argument(
        "--heal-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="end-to-end healing device; under `accelerate launch` or torchrun each process heals on its share "
        "of every batch (gloo on cpu, NCCL on cuda)",
    )
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="with several processes, shard the healed blocks' weights, gradients and Adam state over them "
        "(FSDP; also on under `accelerate launch --use_fsdp`)",
    )
    parser.add_argument(
        "--report", metavar="R.json", type=common.writable_path, help="write the comparison report as JSON"
    )
    parser.add_argument(
        "--plot",
        metavar="R.png",
        type=common.writable_path,
        help="also convert at shared fractions 0.25/0.5/0.75 and plot quality against it; R-frontier.png "
        "beside it: quality against bytes per step at 1, 4 and 8 tokens per step, with the frontier",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="skip the baselines; a language model without --heal-steps or --plot is then converted one block at "
        "a time in bounded memory (every mode resumes a killed run rerun with the same arguments: OUTPUT.work)",
    )
    parser.add_argument(
        "--lm-eval",
        nargs="?",
        const=0,
        type=common.non_negative_int,
        metavar="DOCS",
        help="language models: also run lm-evaluation-harness's local tasks (held-out perplexity, a multiple-choice "
        "continuation task, deamoe_trt/hf/lm_eval_task.py) on the source and the converted model, offline; "
        "into --report and printed (DOCS: the first DOCS documents of each task; default all)",
    )
    parser.add_argument("--threads", type=common.thread_count, default=1, help="torch CPU threads (default 1)")
    common.add_seed(parser)
    common.add_force(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import fields

    from ..convert.workflow import ConvertRequest, convert_checkpoint

    request = ConvertRequest(**{f.name: getattr(args, f.name) for f in fields(ConvertRequest)})
    return convert_checkpoint(request, note=common.note)
