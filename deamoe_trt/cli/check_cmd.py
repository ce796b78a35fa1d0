"""`deamoe-trt check-gpu`, `check-trt` and `check-edgellm`: the device checks.

Each command parses its own flags (check_gpu_cmd, check_trt_cmd, check_edgellm_cmd) and calls
its check's run_check with the values.
"""

from __future__ import annotations


def register(subparsers) -> None:
    from . import check_edgellm_cmd, check_gpu_cmd, check_trt_cmd

    for command in (check_gpu_cmd, check_trt_cmd, check_edgellm_cmd):
        command.register(subparsers)
