"""`deamoe-trt convert`: turn a trained vanilla MoE (layer, stack or language model) into a
DeaMoE with departments and shared parts, and report what it costs in quality.

Experts are clustered into departments, their neurons aligned, each department's shared
part fitted on calibration data, and (with --heal-steps) the result distilled from the
source. The report compares, at equal bytes per decoding step, the converted model before
and after healing, a naive conversion and a merged-experts alternative with the source."""

from __future__ import annotations

import json
import shutil

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
        "--grouping", choices=("cluster", "keep"), default="cluster", help="cluster experts (default) or keep order"
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
    from ..convert.distill import world
    from ..train.determinism import deterministic_threads

    with deterministic_threads(args.threads):
        code = _run(args)
        if code == 0 and args.lm_eval is not None and world()[0] == 0:
            _lm_eval(args)
        return code


def _lm_eval(args) -> None:
    """The local lm-eval tasks on the source and the written model; into the report."""
    import tempfile
    from pathlib import Path

    from .._io import atomic_write_text
    from ..hf.lm_eval_task import run_local_tasks
    from ..lm.checkpoint import load_lm

    source, converted = load_lm(args.source), load_lm(args.output)
    models = {"source": source.model, "converted": converted.model}
    with tempfile.TemporaryDirectory(prefix="deamoe-lm-eval-") as folder:
        results = run_local_tasks(models, converted.tokenizer, folder, limit=args.lm_eval or None)
    for name, tasks in results.items():
        for task, metrics in tasks.items():
            print(f"lm-eval {name} {task}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))
    if args.report:
        report = json.loads(Path(args.report).read_text())
        report["lm_eval"] = {"limit": args.lm_eval or None, "results": results}
        atomic_write_text(args.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report} (with lm-eval)")


def _run(args) -> int:
    import torch

    from .._io import atomic_write_text, replaced_directory
    from ..convert.core import ConvertSettings
    from ..convert.distill import init_distributed
    from ..convert.metrics import STEP_TOKENS
    from ..convert.report import frontier_plot_path, report_table, write_frontier_plot, write_plot
    from ..convert.run import SWEEP, convert_model
    from ..convert.sharding import fsdp_requested
    from ..convert.sources import HELDOUT_WINDOWS, lm_source, read_calibration_tensor, read_text, stack_source
    from ..errors import UsageError
    from ..lm.checkpoint import read
    from ..work_folder import work_dir

    found = read(args.source)
    is_lm = found.artifact == "lm"
    if args.lm_eval is not None:  # before the conversion, not after it
        from ..hf.lm_eval_task import check_tokenizer

        if not is_lm:
            raise UsageError("--lm-eval evaluates language models; the source is a layer checkpoint")
        check_tokenizer(found.header["tokenizer"])
    ours = _check_outputs(args, is_lm)
    size = convert_method.check(args, found.config.moe if is_lm else found.config)
    torch.manual_seed(args.seed)
    settings = ConvertSettings(
        departments=args.departments,
        top_departments=args.top_departments,
        shared_size=args.shared_size,
        shared_fraction=args.shared_fraction,
        private_size=args.private_size,
        grouping=args.grouping,
        department_score=args.department_score,
        heal_steps=args.heal_steps,
        heal_lr=args.heal_lr,
        heal_batch=args.heal_batch,
        heal_checkpoint=args.heal_checkpoint,
        heal_checkpoint_every=args.checkpoint_every,
        heal_device=args.heal_device,
        heal_fsdp=fsdp_requested(args.fsdp),
        seed=args.seed,
    )
    rank, _ = init_distributed(args.heal_device)
    if args.heal_device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--heal-device cuda: no CUDA device is visible")
    data = None
    if is_lm:
        from ..train.lm import shipped_text

        text: str | torch.Tensor
        header = found.header
        if args.data:
            from ..convert.data import read_tokens

            window = min(128, header["config"].max_position_embeddings - 1) + 1
            data = read_tokens(
                args.data,
                header["tokenizer"],
                budget=args.data_tokens,
                heldout_fraction=args.heldout_fraction,
                window=window,
            )
            text = data.ids
        elif not args.calibration:
            text = shipped_text()
        elif args.calibration.endswith(".safetensors"):
            text = read_calibration_tensor(args.calibration, "input_ids")
        else:
            text = read_text(args.calibration)
        if args.no_compare and not args.heal_steps and not args.plot:
            return _run_blockwise(args, settings, text, data)
        loaded = found.lm()
        for i in loaded.model.moe_layers():  # dense blocks stay as they are
            settings.check(loaded.model.layers[i].mlp.config)
        source = lm_source(
            loaded.model,
            loaded.tokenizer,
            text,
            heldout_fraction=args.heldout_fraction,
            heal_on_all=data is not None,
            heldout_windows=args.heldout_windows or HELDOUT_WINDOWS,
        )
    else:
        if args.data:
            raise UsageError("--data takes text for a language model; give a layer --calibration hidden_states")
        stack = found.stack()
        settings.check(stack.config)
        hidden = read_calibration_tensor(args.calibration, "hidden_states") if args.calibration else None
        source = stack_source(stack, hidden, seed=args.seed, tokens=args.calibration_tokens)

    if size is not None:
        return convert_method.write(args, source, settings, size, ours, loaded.tokenizer if is_lm else None, data)
    sweep = SWEEP if args.plot else ()
    work = work_dir(args.output)
    result, report = convert_model(
        source,
        settings,
        compare=not args.no_compare,
        sweep=sweep,
        progress=rank == 0,
        work=str(work),
        work_writer=rank == 0,
    )
    if rank != 0:  # every process converted the same; the first one writes
        return 0
    report["source"]["path"] = str(args.source)
    if data is not None:
        report["data"] = data.summary
    kept = [r for r in report["rows"] if r["method"] == "source" or r["shared_fraction"] == result.fraction]
    summary = {
        "converted_from": str(args.source),
        "source": report["source"],
        "expert_order": [order.tolist() for order in result.orders],
        "report": [r for r in kept if r["method"] in ("source", result.name)],
    }
    what = "language-model checkpoint" if is_lm else "layer checkpoint"
    with replaced_directory(args.output, ours, what, force=args.force, note=common.note) as staging:
        if is_lm:
            result.lm.save_pretrained(staging, tokenizer=loaded.tokenizer, training={"conversion": summary})
        else:
            from ..layer import DeaMoEStack

            converted = DeaMoEStack.from_layers(result.layers)
            converted.source = summary
            converted.save_pretrained(staging)
    out = args.output
    print(report_table(report, fraction=result.fraction))
    if args.report:
        atomic_write_text(args.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report}")
    shutil.rmtree(work, ignore_errors=True)  # the finished pieces, once every output is written
    if args.plot:
        for tokens in STEP_TOKENS:
            print()
            print(report_table(report, tokens=tokens))
        write_plot(report, args.plot)
        print(f"wrote {args.plot}")
        print(f"wrote {write_frontier_plot(report, frontier_plot_path(args.plot))}")
    print(f"wrote {out} ({result.name}, department score {result.layers[0].config.department_score})")
    return 0


def _check_outputs(args, is_lm: bool):
    """The output and reports checked before any work: none of them the source or inside it,
    and an existing output directory replaceable (ours, of the same kind, or --force). The
    test of "ours" for the output's kind."""
    from .._io import check_not_input, check_replaceable, json_format_is
    from ..checkpoint import FORMAT
    from ..lm.checkpoint import FORMAT as LM_FORMAT

    for flag, path in (("-o", args.output), ("--report", args.report), ("--plot", args.plot)):
        if path:
            check_not_input(path, [args.source], flag=flag)
    ours = json_format_is(LM_FORMAT if is_lm else FORMAT)
    check_replaceable(args.output, ours, "language-model checkpoint" if is_lm else "layer checkpoint", force=args.force)
    return ours


def _run_blockwise(args, settings, text, data) -> int:
    """A language model without baselines or healing: one block at a time, resumable."""
    from .._io import atomic_write_text
    from ..convert.blockwise import convert_lm_blockwise

    summary = convert_lm_blockwise(args.source, args.output, settings, text, heldout_fraction=args.heldout_fraction)
    if args.report:
        report = {**summary, **({"data": data.summary} if data is not None else {})}
        atomic_write_text(args.report, json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report}")
    errors = ", ".join(f"{e:.4f}" for e in summary["relative_error"])
    print(f"held-out FFN relative error per block: {errors}")
    print(f"wrote {args.output} (converted block by block, department score {summary['department_score']})")
    return 0
