"""`deamoe-trt triton-repo`: write a Triton Inference Server model repository.

Any mix of: --engine (a TensorRT engine of the plugin form, platform tensorrt_plan, with the
export it was built from for its inputs and outputs), --ort (the ort export on Triton's
onnxruntime backend) and --lm (a language-model checkpoint as a decoupled, streaming decode
service on the Python backend). Each config.pbtxt is checked against Triton's model config
schema when tritonclient is installed. See docs/serving.md.
"""

from __future__ import annotations

from ..integrations.triton.lm_runtimes import lm_runtimes
from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "triton-repo", help="write a Triton Inference Server model repository", description=__doc__
    )
    common.add_output(
        parser, help="repository folder to write (models already in it are kept or replaced by name)", directory=True
    )
    trt = parser.add_argument_group("TensorRT engine (platform tensorrt_plan)")
    trt.add_argument("--engine", metavar="ENGINE", help="engine from `deamoe-trt build` of the plugin form")
    trt.add_argument("--engine-onnx", metavar="MODEL.onnx", help="the export the engine was built from")
    trt.add_argument(
        "--plugin",
        metavar="PATH",
        help="where libdeamoe_plugin.so is on the server (for the tritonserver command line)",
    )
    trt.add_argument("--engine-name", default="deamoe_trt", help="model name (default deamoe_trt)")
    ort = parser.add_argument_group("ONNX Runtime (platform onnxruntime_onnx)")
    ort.add_argument("--ort", metavar="MODEL.onnx", help="the ort export (`deamoe-trt export --form ort`)")
    ort.add_argument("--ort-name", default="deamoe_ort", help="model name (default deamoe_ort)")
    ort.add_argument("--ort-kind", choices=("gpu", "cpu"), default="gpu", help="CUDA or CPU execution (default gpu)")
    lm = parser.add_argument_group("LM decode service (Python backend, decoupled)")
    lm.add_argument("--lm", metavar="CKPT", help="language-model checkpoint (e.g. deamoe_trt/lm/data/tiny-lm)")
    lm.add_argument("--lm-name", default="tiny_lm", help="model name (default tiny_lm)")
    lm.add_argument(
        "--lm-runtime",
        choices=lm_runtimes(),
        default="ort",
        help="decoder: ort (ONNX Runtime CPU, default), or another runtime that decodes; tensorrt (or trt, its older "
        "name) needs --lm-engine, and it and cuda a GPU",
    )
    lm.add_argument("--lm-engine", metavar="ENGINE", help="engine from build_lm_engine (--lm-runtime tensorrt)")
    lm.add_argument(
        "--max-active", type=common.positive_int, default=32, help="sequences in flight per instance (default 32)"
    )
    shared = parser.add_argument_group("all models")
    shared.add_argument("--instances", type=common.positive_int, default=1, help="instances per device (default 1)")
    shared.add_argument(
        "--gpus",
        type=common.int_list(0, "GPU indices", "0,1"),
        metavar="I,J",
        help="GPUs the instances go on (default: all)",
    )
    shared.add_argument("--threads", type=common.thread_count, default=1, help="CPU threads per instance (default 1)")
    shared.add_argument(
        "--max-batch-size",
        type=common.non_negative_int,
        metavar="N",
        help="Triton batch size for engine/ort (default: the export's max_tokens when tokens can batch; 0: off)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..errors import MissingDependencyError, UsageError
    from ..integrations.triton import repo as triton

    if not (args.engine or args.ort or args.lm):
        raise UsageError("nothing to write: give --engine (with --engine-onnx), --ort and/or --lm")
    if bool(args.engine) != bool(args.engine_onnx):
        raise UsageError("--engine and --engine-onnx go together (the engine's inputs come from its export)")
    out = Path(args.output)
    _check_names_and_inputs(args, out)
    written = []
    if args.engine:
        written.append(
            triton.write_tensorrt_model(
                out,
                Path(args.engine),
                Path(args.engine_onnx),
                name=args.engine_name,
                instances=args.instances,
                gpus=args.gpus,
                max_batch_size=args.max_batch_size,
            )
        )
    if args.ort:
        written.append(
            triton.write_onnxruntime_model(
                out,
                Path(args.ort),
                name=args.ort_name,
                kind=args.ort_kind,
                instances=args.instances,
                gpus=args.gpus,
                threads=args.threads,
                max_batch_size=args.max_batch_size,
            )
        )
    if args.lm:
        written.append(
            triton.write_lm_model(
                out,
                Path(args.lm),
                name=args.lm_name,
                runtime=args.lm_runtime,
                instances=args.instances,
                threads=args.threads,
                max_active=args.max_active,
                engine=Path(args.lm_engine) if args.lm_engine else None,
                plugin=args.plugin,
            )
        )
    plugins = [args.plugin] if args.plugin and args.engine else None
    triton.write_readme(out, plugins=plugins)
    for folder in written:
        try:
            triton.validate_config((folder / "config.pbtxt").read_text(), where=str(folder / "config.pbtxt"))
            checked = "checked against Triton's model config schema"
        except MissingDependencyError as exc:
            checked = f"not checked ({exc})"
        print(f"{folder}: {checked}")
    print(f"\nserve it with:\n    {triton.serve_command(out, plugins=plugins)}")
    return 0


def _check_names_and_inputs(args, out) -> None:
    """Each model its own folder, and no input inside a folder the command replaces."""
    from .._io import check_names, check_not_input
    from ..errors import UsageError

    models = [
        (flag, name)
        for flag, name, given in (
            ("--engine-name", args.engine_name, args.engine),
            ("--ort-name", args.ort_name, args.ort),
            ("--lm-name", args.lm_name, args.lm),
        )
        if given
    ]
    for flag, name in models:
        if not name or name.startswith(".") or "/" in name or "\0" in name:
            raise UsageError(f"{flag} {name!r} is not a model name: give a folder name, e.g. deamoe_lm")
        check_names(out / name)
    names = [name for _, name in models]
    for _, name in models:
        if names.count(name) > 1:
            others = " and ".join(f for f, n in models if n == name)
            raise UsageError(f"{others} are both {name!r}: each model needs its own name in the repository")
    # A model's folder is replaced whole: none of the inputs may be in it.
    inputs = [p for p in (args.engine, args.engine_onnx, args.ort, args.lm, args.lm_engine) if p]
    for _, name in models:
        check_not_input(out / name, inputs, flag="the model folder")
