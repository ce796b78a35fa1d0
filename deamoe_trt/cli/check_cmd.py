"""`deamoe-trt check-gpu`, `check-trt` and `check-edgellm`: the device checks (deamoe_trt.checks,
deamoe_trt.integrations.edgellm.device_check).

Each passes its arguments to the check's own parser: `deamoe-trt check-gpu --help` lists them.
"""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    for name, module, summary in (
        (
            "check-gpu",
            "checks.gpu",
            "on a CUDA GPU: the kernels' correctness and speed vs the expanded twin (--dry-run: CPU)",
        ),
        (
            "check-trt",
            "checks.trt_device",
            "on a GPU with TensorRT: plugin build, engines, validation and timing",
        ),
        (
            "check-edgellm",
            "integrations.edgellm.device_check",
            "on a GPU with TensorRT Edge-LLM: our export and the vanilla model's, engines, tokens and TPOT",
        ),
    ):
        # No options of its own (prefix "+", never used): every argument goes to the check.
        parser = subparsers.add_parser(name, help=summary, description=summary, add_help=False, prefix_chars="+")
        parser.add_argument("check_args", nargs=argparse.REMAINDER, help="the check's own arguments")
        parser.set_defaults(func=run, check_module=module)


def run(args) -> int:
    import importlib

    check = importlib.import_module(f"deamoe_trt.{args.check_module}")
    return check.main(args.check_args)
