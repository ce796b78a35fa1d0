"""`deamoe-trt convert --method pruned|top-k`: write one of the report's alternatives to the
DeaMoE conversion (experts pruned to a fraction of their neurons, or a lower top-k) as a
checkpoint of the source's kind, built and healed as the report builds and heals it."""

from __future__ import annotations

import json
import shutil

from . import args as common

METHODS = ("deamoe", "pruned", "top-k")
# The conversion's own flags: what --method pruned / top-k do not take.
CONVERSION_FLAGS = {
    "departments": "--departments",
    "top_departments": "--top-departments",
    "shared_size": "--shared-size",
    "shared_fraction": "--shared-fraction",
    "private_size": "--private-size",
    "department_score": "--department-score",
    "plot": "--plot",
}
open_fraction = common.number("a number in (0, 1)", lambda v: 0 < v < 1)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="deamoe",
        help="deamoe (default): departments and shared parts; pruned: every expert keeps its most important "
        "neurons (--keep-fraction); top-k: the source's experts with a lower top-k (--top-k); both healed with "
        "--heal-steps as the report heals them",
    )
    parser.add_argument(
        "--keep-fraction",
        type=open_fraction,
        metavar="X",
        help="--method pruned: each expert keeps round(X f) of its f neurons, 0 < X < 1",
    )
    parser.add_argument(
        "--top-k", type=common.positive_int, metavar="K", help="--method top-k: experts per token, below the source's"
    )


def check(args, moe) -> int | None:
    """One-line refusals of flags that do not fit args.method; for pruned and top-k, the
    size (neurons per expert, or k) and args set up so the shared data path runs unchanged."""
    from ..errors import UsageError

    if args.method == "deamoe":
        for flag, given in (("--keep-fraction", args.keep_fraction), ("--top-k", args.top_k)):
            if given is not None:
                raise UsageError(f"{flag} takes --method pruned or top-k; the DeaMoE conversion does not use it")
        flags = (("--departments", args.departments), ("--top-departments", args.top_departments))
        missing = [flag for flag, value in flags if value is None]
        if args.shared_size is None and args.shared_fraction is None:
            missing.append("--shared-size or --shared-fraction")
        if missing:
            raise UsageError(f"convert needs {', '.join(missing)} (or --method pruned|top-k)")
        return None
    for dest, flag in CONVERSION_FLAGS.items():
        if getattr(args, dest) is not None:
            raise UsageError(f"{flag} is the DeaMoE conversion's; --method {args.method} does not take it")
    if args.no_compare:
        raise UsageError(f"--no-compare: --method {args.method} writes one model and compares no baselines")
    f, k = moe.expert_intermediate_size, moe.top_k
    if moe.shared_intermediate_size:
        raise UsageError(
            f"the source already has department shared parts (f_s = {moe.shared_intermediate_size}); "
            f"--method {args.method} takes a vanilla MoE (f_s = 0)"
        )
    if args.method == "pruned":
        if args.keep_fraction is None:
            raise UsageError("--method pruned needs --keep-fraction X (0 < X < 1)")
        if args.top_k is not None:
            raise UsageError("--top-k takes --method top-k, not pruned")
        size = round(args.keep_fraction * f)
        if not 0 < size < f:
            raise UsageError(f"--keep-fraction {args.keep_fraction} keeps {size} of {f} neurons; keep 1 to {f - 1}")
    else:
        if args.top_k is None:
            raise UsageError(f"--method top-k needs --top-k K (below the source's top-{k})")
        if args.keep_fraction is not None:
            raise UsageError("--keep-fraction takes --method pruned, not top-k")
        if args.top_k >= k:
            raise UsageError(f"--top-k {args.top_k} must be below the source's top-{k}")
        size = args.top_k
    # The shared path builds ConvertSettings and checks them: one department, nothing shared.
    args.departments, args.top_departments, args.shared_size = 1, 1, 0
    return size


def write(args, source, settings, size: int, ours, tokenizer, data) -> int:
    """Build (resumably, in OUTPUT.work), write the checkpoint and, with --report, its report."""
    from .._io import atomic_write_text, replaced_directory
    from ..convert.distill import world
    from ..convert.report import report_table
    from ..convert.run import alternative_model
    from ..work_folder import work_dir

    rank = world()[0]
    work = work_dir(args.output)
    variant, report = alternative_model(
        source, settings, args.method, size, progress=rank == 0, work=str(work), work_writer=rank == 0
    )
    if rank != 0:
        return 0
    report["source"]["path"] = str(args.source)
    if data is not None:
        report["data"] = data.summary
    summary = {"converted_from": str(args.source), "source": report["source"], **report["settings"]}
    summary["report"] = report["rows"]
    is_lm = source.lm is not None
    what = "language-model checkpoint" if is_lm else "layer checkpoint"
    with replaced_directory(args.output, ours, what, force=args.force, note=common.note) as staging:
        if is_lm:
            variant.lm.save_pretrained(staging, tokenizer=tokenizer, training={"conversion": summary})
        else:
            from ..layer import DeaMoEStack

            stack = DeaMoEStack.from_layers(variant.layers)
            stack.source = summary
            stack.save_pretrained(staging)
    print(report_table(report))
    if args.report:
        atomic_write_text(args.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report}")
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.output} ({variant.name}, {'k' if args.method == 'top-k' else 'f'}={size})")
    return 0
