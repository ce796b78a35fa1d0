"""`deamoe-trt export`: a checkpoint as an ONNX model in the plugin, ort or onnx form."""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a checkpoint to ONNX (plugin, ort or onnx form)",
        description=__doc__ + " Flags override the recipe's values.",
    )
    common.add_checkpoint(parser)
    common.add_output(parser, help="model file to write (weights go to <file>.data beside it past 2 GB)")
    parser.add_argument(
        "--form",
        choices=("plugin", "ort", "onnx"),
        help="plugin: one DeaMoE node per layer for TensorRT; ort: stock ONNX Runtime (com.microsoft.MoE); "
        "onnx: standard ops only",
    )
    parser.add_argument(
        "--dtype", choices=tuple(common.DTYPE_NAMES), help="weights and activations (default fp32; bf16: plugin only)"
    )
    parser.add_argument("--opset", type=int, help="ONNX opset (default 17)")
    parser.add_argument("--max-tokens", type=common.positive_int, help="largest tokens per step, recorded for TensorRT")
    parser.add_argument("--layers", metavar="all|I,J,...", help="checkpoint layers to export (default all)")
    parser.add_argument("--recipe", metavar="TOML", help="export recipe, e.g. export-recipes/tiny-ort.toml")
    parser.add_argument(
        "--external-data-threshold",
        type=common.int_at_least(0, "a byte count >= 0"),
        metavar="BYTES",
        help="weights past this many bytes go to <file>.data (default: protobuf's 2 GiB less 64 MiB)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    import sys

    from .._io import check_not_input
    from ..console import Progress, format_bytes
    from ..errors import UsageError
    from ..export import EXTERNAL_DATA_THRESHOLD, build_model, data_path, save_model
    from ..layer import DeaMoEStack

    check_not_input(args.output, [args.checkpoint])  # before reading: the input stays whole
    settings = _settings(args)
    # Big layers take a while: a progress line on a terminal; nothing in logs, so errors stay one line.
    progress = Progress(3, "export", enabled=sys.stderr.isatty())
    stack = DeaMoEStack.from_pretrained(args.checkpoint)
    progress.update("checkpoint read")
    indices = list(settings.layers) if settings.layers is not None else list(range(len(stack.layers)))
    out_of_range = [i for i in indices if i >= len(stack.layers)]
    if out_of_range:
        raise UsageError(
            f"layer {out_of_range[0]} is out of range: {args.checkpoint} holds {len(stack.layers)} layer(s)"
        )
    # One layer exports as the layer (y = layer(x)); several as the stack (x <- x + layer(x)).
    layers = [stack.layers[i] for i in indices]
    module = layers[0] if len(layers) == 1 else type(stack).from_layers(layers)
    model = build_model(
        module, settings.form, settings.dtype, settings.opset, max_tokens=settings.max_tokens, layer_indices=indices
    )
    progress.update("graph built")
    threshold = EXTERNAL_DATA_THRESHOLD if args.external_data_threshold is None else args.external_data_threshold
    path = save_model(model, args.output, external_data_threshold=threshold)
    progress.update("written")

    size, extra = path.stat().st_size, ""
    if data_path(path).exists():
        size += data_path(path).stat().st_size
        extra = f", weights in {data_path(path).name}"
    what = "1 layer" if len(indices) == 1 else f"{len(indices)} layers"
    print(f"wrote {path} ({settings.form} form, {settings.dtype}, {what}, {format_bytes(size)}{extra})")
    return 0


def _settings(args):
    """The recipe (if any) with the command line's flags put over it, checked."""
    import dataclasses

    from ..errors import UsageError
    from ..export.recipe import Recipe, load_recipe, parse_layers

    recipe = load_recipe(args.recipe) if args.recipe else Recipe()
    layers = parse_layers(args.layers) if args.layers is not None else None
    settings = recipe.overridden(
        form=args.form, dtype=args.dtype, opset=args.opset, max_tokens=args.max_tokens, layers=layers
    )
    if args.layers == "all":  # overrides a recipe's list of layers
        settings = dataclasses.replace(settings, layers=None)
    if settings.form is None:
        raise UsageError("no form given: pass --form plugin|ort|onnx or a --recipe that sets form")
    return settings.overridden(dtype=settings.dtype or "fp32").check()
