"""`deamoe-trt build`: compile an exported ONNX model into a TensorRT engine on this device.

Engines only run on the GPU architecture and TensorRT version that built them, so build
on the target itself: the command checks this GPU against --target (auto picks one).
"""

from __future__ import annotations

from . import args as common


def register(subparsers) -> None:
    from ..trt.targets import TARGET_CHOICES

    parser = subparsers.add_parser(
        "build", help="build a TensorRT engine from an exported model, on the target GPU", description=__doc__
    )
    parser.add_argument("model", metavar="MODEL.onnx", help="model from `deamoe-trt export --form plugin` (or onnx)")
    parser.add_argument(
        "--target",
        choices=TARGET_CHOICES,
        default="auto",
        help="device profile: precision, workspace, token range (default auto: from this GPU)",
    )
    common.add_output(parser, help="engine file to write (e.g. model.engine)")
    parser.add_argument(
        "--max-tokens",
        type=common.positive_int,
        metavar="N",
        help="most tokens per step the engine accepts (default: the model's max_tokens, else the target's)",
    )
    parser.add_argument(
        "--plugin",
        metavar="PATH|python",
        help="plugin library (libdeamoe_plugin.so), or 'python' for the tensorrt.plugin route "
        "(default: DEAMOE_TRT_PLUGIN or build/plugins)",
    )
    parser.add_argument(
        "--timing-cache",
        metavar="PATH",
        help="TensorRT timing cache to read and update ('none': no cache; default: one per target in ~/.cache)",
    )
    typing = parser.add_mutually_exclusive_group()
    typing.add_argument(
        "--strongly-typed",
        dest="strongly_typed",
        action="store_const",
        const=True,
        help="TensorRT 10: keep every tensor in the model's dtype (TensorRT 11 always does)",
    )
    typing.add_argument(
        "--weakly-typed",
        dest="strongly_typed",
        action="store_const",
        const=False,
        help="TensorRT 10: let the target's fp16/bf16 flag lower float32 layers",
    )
    parser.add_argument(
        "--workspace",
        type=common.int_at_least(1, "a size in MiB (an integer >= 1)"),
        metavar="MiB",
        help="override the target's workspace pool limit",
    )
    parser.add_argument(
        "--device-memory",
        type=common.gigabytes,
        metavar="GB",
        help="the device's memory, for the fit check (default: the target's smallest device, or this GPU's)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="TensorRT's INFO messages too")
    parser.set_defaults(func=run, strongly_typed=None)


def run(args) -> int:
    from pathlib import Path

    from ..trt.builder import BuildOptions, build_engine

    result = build_engine(
        BuildOptions(
            model=Path(args.model),
            output=Path(args.output),
            target=args.target,
            max_tokens=args.max_tokens,
            plugin=args.plugin,
            timing_cache=args.timing_cache,
            strongly_typed=args.strongly_typed,
            workspace_mib=args.workspace,
            device_memory=int(args.device_memory * 2**30) if args.device_memory else None,
            verbose=args.verbose,
        )
    )
    print("\n".join(result.lines()))
    return 0
