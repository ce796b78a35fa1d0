"""`deamoe-trt check-trt`: the TensorRT plugin on a GPU (deamoe_trt.checks.trt_device)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import args as common


def route_list(text: str) -> str | list[str]:
    """'auto' or a comma-separated subset of the routes (cpp, python)."""
    from ..checks.trt_device import ROUTES

    if text.strip() == "auto":
        return "auto"
    return common.name_list(ROUTES, "route")(text)


def register(subparsers) -> None:
    from ..checks import trt_device as check
    from ..presets import PRESETS as KNOWN

    summary = "on a GPU with TensorRT: plugin build, engines, validation and timing"
    parser = subparsers.add_parser(
        "check-trt", help=summary, description=check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=common.writable_directory, help="folder for results.json (and work/ while running)")
    parser.add_argument(
        "--presets",
        type=common.name_list(tuple(KNOWN), "preset"),
        default=list(check.PRESETS),
        help=f"comma-separated (default {','.join(check.PRESETS)})",
    )
    common.add_dtype(parser, default="fp16")
    common.add_tokens(parser, default="1,2,4,8,16")
    parser.add_argument("--iterations", type=common.positive_int, default=200, help="timed runs per token count (200)")
    parser.add_argument("--warmup", type=common.non_negative_int, default=20, help="untimed runs first (20)")
    parser.add_argument("--plugin", help="a built libdeamoe_plugin.so (skips the CMake build)")
    parser.add_argument("--tensorrt-root", help="TensorRT prefix for the plugin build (default: TENSORRT_ROOT, /usr)")
    parser.add_argument("--tensorrt-include", help="TensorRT headers for a pip TensorRT (see above)")
    parser.add_argument(
        "--routes", type=route_list, default="auto", help="cpp, python or both (default: cpp, and python on 10.6+)"
    )
    parser.add_argument("--target", default="auto", help="build target (default auto)")
    common.add_seed(parser)
    parser.add_argument("--keep", action="store_true", help="keep work/ (checkpoints, models, engines)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..checks.trt_device import TrtCheckOptions, run_check

    return run_check(
        TrtCheckOptions(
            out=Path(args.out),
            presets=list(args.presets),
            dtype=args.dtype,
            tokens=sorted(set(args.tokens)),
            iterations=args.iterations,
            warmup=args.warmup,
            plugin=args.plugin,
            tensorrt_root=args.tensorrt_root,
            tensorrt_include=args.tensorrt_include,
            routes=args.routes,
            target=args.target,
            seed=args.seed,
            keep=args.keep,
        )
    )
