"""`deamoe-trt check-gpu`, `check-trt` and `check-edgellm`: the device checks.

check-trt and check-edgellm parse their own flags (check_trt_cmd, check_edgellm_cmd) and call
their check's run_check with the values; check-gpu passes its arguments to deamoe_trt.checks.gpu.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from . import check_edgellm_cmd, check_trt_cmd

    summary = "on a CUDA GPU: the kernels' correctness and speed vs the expanded twin (--dry-run: CPU)"
    # No options of its own (prefix "+", never used): every argument goes to the check.
    parser = subparsers.add_parser("check-gpu", help=summary, description=summary, add_help=False, prefix_chars="+")
    parser.add_argument("check_args", nargs=argparse.REMAINDER, help="the check's own arguments")
    parser.set_defaults(func=run)
    for command in (check_trt_cmd, check_edgellm_cmd):
        command.register(subparsers)


def run(args) -> int:
    from ..checks import gpu

    return gpu.main(args.check_args)
