"""Entry point of `deamoe-trt`: builds the subcommand parser and turns errors into one line."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from ..errors import DeaMoEError, one_line
from .args import Parser

# Each module defines register(subparsers) and sets func(args) -> int | None on its parser.
SUBCOMMANDS = (
    "deamoe_trt.cli.demo_cmd",
    "deamoe_trt.cli.init_cmd",
    "deamoe_trt.cli.info_cmd",
    "deamoe_trt.cli.import_cmd",
    "deamoe_trt.cli.quantize_cmd",
    "deamoe_trt.cli.export_cmd",
    "deamoe_trt.cli.validate_cmd",
    "deamoe_trt.cli.bench_cmd",
    "deamoe_trt.cli.build_cmd",
    "deamoe_trt.cli.doctor_cmd",
    "deamoe_trt.cli.check_cmd",
    "deamoe_trt.cli.train_cmd",
    "deamoe_trt.cli.train_compare_cmd",
    "deamoe_trt.cli.generate_cmd",
    "deamoe_trt.cli.convert_cmd",
    "deamoe_trt.cli.triton_repo_cmd",
    "deamoe_trt.cli.serve_bench_cmd",
    "deamoe_trt.cli.export_edgellm_cmd",
    "deamoe_trt.cli.export_vllm_cmd",
    "deamoe_trt.cli.export_hf_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="deamoe-trt",
        description="Take DeaMoE models to NVIDIA GPUs: reference, export, kernels, TensorRT, benchmarks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


# Errors of a path the user gave: a name, a place, a permission.
_INPUT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOENT", "ENOTDIR", "EISDIR", "EACCES", "EPERM", "EROFS", "ENAMETOOLONG", "ELOOP", "EEXIST", "EINVAL")
)


def _terminated(signum, frame):
    # SIGTERM unwinds like Ctrl-C, so every temporary the run made is removed on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal

    parser = build_parser()
    prog = "deamoe-trt"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread: leave the handler alone
        previous = None
    try:
        # The argument checks touch the file system (writable outputs): inside the boundary.
        args = parser.parse_args(argv)
        # The command line as given, for the records a command stamps with how it was run.
        args.argv = list(sys.argv[1:] if argv is None else argv)
        prog = f"deamoe-trt {args.command}"
        return int(args.func(args) or 0)
    except DeaMoEError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `deamoe-trt ... | head` closed our stdout: not an error of ours, and nothing left to say.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (OSError, RecursionError, MemoryError, OverflowError) as exc:
        # What the system refused (a path, a permission, memory) or a nesting or size past
        # Python's limits: one line, exit 2 where the input is at fault, 1 (a failed run: a
        # full disk, a lost device) otherwise.
        if os.environ.get("DEAMOE_TRT_DEBUG"):
            raise
        print(f"{prog}: error: {_system_error(exc)}", file=sys.stderr)
        return 2 if not isinstance(exc, OSError) or exc.errno in _INPUT_ERRNOS else 1
    except Exception as exc:  # the CLI promises one line, not a traceback
        if os.environ.get("DEAMOE_TRT_DEBUG"):
            raise
        print(
            f"{prog}: internal error: {type(exc).__name__}: {one_line(exc)} "
            "(rerun with DEAMOE_TRT_DEBUG=1 for the traceback and report it)",
            file=sys.stderr,
        )
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _system_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to read"
    if isinstance(exc, MemoryError):
        return "out of memory: the input asks for more than this machine holds"
    return one_line(exc, limit=300)


if __name__ == "__main__":
    sys.exit(main())
