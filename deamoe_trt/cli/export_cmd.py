"""`deamoe-trt export`: a checkpoint as ONNX. A layer or stack: one graph in the plugin, ort or
onnx form. A language model: one graph of prefill and decode with its KV cache as inputs and
outputs (or, with --target genai, an ONNX Runtime GenAI folder). `export-lm` is an alias of
export, kept for one release."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a layer, stack or language-model checkpoint to ONNX (plugin, ort or onnx form)",
        description=__doc__ + " Flags override the recipe's values; a flag the checkpoint does not take is refused.",
    )
    _add_flags(parser)
    alias_help = "alias of export, kept for one release"
    alias = subparsers.add_parser(
        "export-lm", help=alias_help, description="Alias of export, kept for one release. " + __doc__
    )
    _add_flags(alias)


def _add_flags(parser) -> None:
    common.add_checkpoint(parser, help="checkpoint directory: a layer, a stack or a language model")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        type=_output_path,
        help="ONNX file to write (weights go to <file>.data beside it past 2 GB; --target genai: the model folder)",
    )
    parser.add_argument(
        "--form",
        choices=("plugin", "ort", "onnx"),
        help="plugin: DeaMoE nodes for TensorRT; ort: stock ONNX Runtime (com.microsoft.MoE); onnx: standard ops "
        "only (a language model: ort by default; a layer needs --form or a recipe)",
    )
    parser.add_argument(
        "--dtype", choices=tuple(common.DTYPE_NAMES), help="weights and activations (default fp32; bf16: plugin only)"
    )
    parser.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    parser.add_argument(
        "--external-data-threshold",
        type=common.non_negative_int,
        metavar="BYTES",
        help="weights past this many bytes go to <file>.data (default: protobuf's 2 GiB less 64 MiB)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="then compare the model with the checkpoint's PyTorch reference (`deamoe-trt validate`)",
    )
    layer = parser.add_argument_group("layers and stacks")
    layer.add_argument("--max-tokens", type=common.positive_int, help="largest tokens per step, recorded for TensorRT")
    layer.add_argument("--layers", metavar="all|I,J,...", help="checkpoint layers to export (default all)")
    layer.add_argument("--recipe", metavar="TOML", help="export recipe, e.g. export-recipes/tiny-ort.toml")
    lm = parser.add_argument_group("language models")
    lm.add_argument(
        "--twin",
        choices=("deamoe", "expanded", "vanilla"),
        help="export the model (default), its expanded twin (same outputs, no sharing) or its vanilla twin",
    )
    lm.add_argument(
        "--target",
        choices=("onnx", "genai"),
        help="onnx: one ONNX file (default); genai: an ONNX Runtime GenAI model folder (model.onnx, "
        "genai_config.json, tokenizer files)",
    )
    common.add_force(lm)
    parser.set_defaults(func=run)


def _output_path(text: str) -> str:
    """A writable file, or a writable existing folder (what --target genai fills)."""
    from pathlib import Path

    try:
        folder = Path(text).is_dir()
    except OSError:  # a name too long: writable_path says so in one line
        folder = False
    return common.writable_directory(text) if folder else common.writable_path(text)


def run(args) -> int:
    import sys

    from ..errors import DeaMoEError, UsageError
    from ..export.run import ExportOptions, export_checkpoint

    if args.validate and args.target == "genai":
        raise UsageError("--validate checks a single ONNX file; with --target genai, export without it")
    options = ExportOptions(
        form=args.form,
        dtype=args.dtype,
        opset=args.opset,
        external_data_threshold=args.external_data_threshold,
        layers=args.layers,
        max_tokens=args.max_tokens,
        recipe=args.recipe,
        twin=args.twin,
        target=args.target,
        force=args.force,
    )
    # Big layers take a while: a progress line on a terminal; nothing in logs, so errors stay one line.
    exported = export_checkpoint(args.checkpoint, args.output, options, progress=sys.stderr.isatty(), note=common.note)
    print(exported.message())
    if args.validate:
        from ..validation import validate
        from ..validation.lm import validate_lm

        # validate_lm: a language model's own token counts (validate's are a layer's).
        check = validate_lm if exported.checkpoint.artifact == "lm" else validate
        report = check(exported.path, args.checkpoint)
        print(report.table())
        if not report.passed:
            raise DeaMoEError(report.failure())
    return 0
