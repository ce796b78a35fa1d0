"""`deamoe-trt doctor`: check this machine for what building and running DeaMoE engines needs
(GPU, driver, TensorRT, the plugin, the kernels) and say what to do about each missing piece.
Exits 0 when everything needed is present, 1 otherwise."""

from __future__ import annotations


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check GPU, TensorRT, plugin and kernels on this device", description=__doc__
    )
    parser.add_argument(
        "--plugin",
        metavar="PATH|python",
        help="plugin library to check, or 'python' for the tensorrt.plugin route (default: search)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..trt.doctor import run_doctor

    report = run_doctor(args.plugin)
    print(report.table())
    return 0 if report.ok else 1
