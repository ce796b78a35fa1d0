"""`deamoe-trt export-lm`: a language-model checkpoint as one ONNX graph with its KV cache as inputs/outputs."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-lm",
        help="export a language-model checkpoint (prefill + decode, KV cache) to ONNX",
        description=__doc__,
    )
    common.add_checkpoint(parser, help="language-model checkpoint directory (e.g. deamoe_trt/lm/data/tiny-lm)")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        type=_output_path,
        help="ONNX file to write (--target genai: the model folder)",
    )
    parser.add_argument(
        "--form",
        choices=("plugin", "ort", "onnx"),
        default="ort",
        help="how each DeaMoE FFN is written: plugin (TensorRT), ort (ONNX Runtime MoE, default), onnx (standard ops)",
    )
    common.add_dtype(parser)
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default 17)")
    common.add_twin(parser)
    parser.add_argument(
        "--validate",
        action="store_true",
        help="then compare logits and cache with the PyTorch model (ort/onnx forms fast)",
    )
    parser.add_argument(
        "--target",
        choices=("onnx", "genai"),
        default="onnx",
        help="onnx: one ONNX file (default); genai: an ONNX Runtime GenAI model folder (model.onnx, "
        "genai_config.json, tokenizer files)",
    )
    parser.add_argument(
        "--external-data-threshold",
        type=common.non_negative_int,
        metavar="BYTES",
        help="--target onnx: weights past this many bytes go to <file>.data (default: protobuf's 2 GiB less 64 MiB)",
    )
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
    from pathlib import Path

    from .._io import check_not_input
    from ..console import format_bytes
    from ..errors import DeaMoEError
    from ..export.lm import export_lm
    from ..lm.checkpoint import load_lm

    check_not_input(args.output, [args.checkpoint])  # before reading: the input stays whole
    loaded = load_lm(args.checkpoint)
    if args.target == "genai":
        return _run_genai(args, loaded)
    threshold = args.external_data_threshold
    kwargs = {} if threshold is None else {"external_data_threshold": threshold}
    path = export_lm(
        loaded.model.twin(args.twin),
        Path(args.output),
        args.form,
        args.dtype,
        args.opset,
        tokenizer=loaded.tokenizer,
        twin=args.twin,
        **kwargs,
    )
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    print(f"wrote {path} ({args.twin}, {args.form} form, {args.dtype}, {format_bytes(size)})")
    if args.validate:
        from ..validation.lm import validate_lm

        report = validate_lm(path, args.checkpoint)
        print(report.table())
        if not report.passed:
            raise DeaMoEError(report.failure())
    return 0


def _run_genai(args, loaded) -> int:
    from pathlib import Path

    from ..console import format_bytes
    from ..errors import UsageError
    from ..export.genai import MODEL_FILE, export_genai

    if args.validate:
        raise UsageError("--validate checks a single ONNX file; with --target genai, run export-lm without it")
    if args.external_data_threshold is not None:
        raise UsageError("--external-data-threshold places a single ONNX file's weights; not with --target genai")
    folder = export_genai(
        loaded.model.twin(args.twin),
        Path(args.output),
        args.form,
        args.dtype,
        args.opset,
        tokenizer=loaded.tokenizer,
        twin=args.twin,
    )
    size = sum(p.stat().st_size for p in folder.glob(MODEL_FILE + "*"))
    print(f"wrote GenAI folder {folder} ({args.twin}, {args.form} form, {args.dtype}, {format_bytes(size)})")
    return 0
