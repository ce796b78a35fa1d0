"""`deamoe-trt check-gpu`: the CUDA kernels' correctness and speed on a GPU (deamoe_trt.checks.gpu)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import args as common


def weight_bits(text: str) -> set[int]:
    """'0,4' -> {0, 4}: FFN weight formats, 0 float, 4 int4, 8 int8."""
    from ..checks.gpu.run import WEIGHT_BITS

    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or any(p not in {str(b) for b in WEIGHT_BITS} for p in parts):
        raise argparse.ArgumentTypeError(f"takes 0, 4 and/or 8 (float, int4, int8), got {text!r}")
    return {int(p) for p in parts}


def shared_library(text: str) -> str:
    """A shared library file, as an absolute path: dlopen searches the library path for a bare
    name and would report an existing file as missing."""
    path = Path(text)
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror}") from None
    if magic != b"\x7fELF":
        raise argparse.ArgumentTypeError(f"{text} is not a shared library (no ELF header)")
    return str(path.resolve())


def register(subparsers) -> None:
    from ..checks.gpu import run as check
    from ..checks.gpu.cases import CASES

    # --help shows what the check does; the module map after it is for readers of the code.
    doc = (check.__doc__ or "").split("\nModules:")[0]
    summary = "on a CUDA GPU: the kernels' correctness and speed vs the expanded twin (--dry-run: CPU)"
    parser = subparsers.add_parser(
        "check-gpu", help=summary, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", required=True, type=common.writable_directory, help="folder for gpu_check.json and gpu_check.txt"
    )
    parser.add_argument(
        "--library", type=shared_library, help="a built libdeamoe_kernels.so (default: build for this GPU, cached)"
    )
    common.add_tokens(parser, default="1,2,4,8,16")
    parser.add_argument("--iters", type=common.positive_int, default=40, help="timed iterations per kernel measurement")
    parser.add_argument(
        "--torch-iters", type=common.positive_int, default=10, help="timed iterations of the PyTorch reference"
    )
    parser.add_argument(
        "--pdl-tokens",
        type=common.token_counts,
        default=[1, 4, 16],
        metavar="N,N,...",
        help="token counts also timed with programmatic launch (default 1,4,16)",
    )
    parser.add_argument("--skip-bench", action="store_true", help="correctness only")
    parser.add_argument(
        "--tune", action="store_true", help="time every kernel variant and write this GPU's variant table to --out"
    )
    parser.add_argument(
        "--sm-limit",
        type=common.positive_int,
        metavar="N",
        help="--tune, and time the variants again with the kernels on N SMs (16: an Orin's bytes per SM)",
    )
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting benchmarks after this many s")
    parser.add_argument("--dry-run", action="store_true", help="CPU + SIMT-emulated kernels, shrunken presets")
    parser.add_argument(
        "--presets",
        type=common.name_list(tuple(CASES), "preset"),
        default=check.DEFAULT_PRESETS.split(","),
        help=f"presets to run (default {check.DEFAULT_PRESETS})",
    )
    parser.add_argument(
        "--bits", type=weight_bits, default=set(check.WEIGHT_BITS), help="FFN weight formats: 0 float, 4 int4, 8 int8"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    import shlex

    from ..checks.gpu.run import GpuCheckOptions, run_check

    return run_check(
        GpuCheckOptions(
            out=Path(args.out),
            library=args.library,
            tokens=list(args.tokens),
            iters=args.iters,
            torch_iters=args.torch_iters,
            pdl_tokens=list(args.pdl_tokens),
            skip_bench=args.skip_bench,
            tune=args.tune,
            sm_limit=args.sm_limit,
            budget_s=args.budget_s,
            dry_run=args.dry_run,
            presets=list(args.presets),
            bits=set(args.bits),
            command="deamoe-trt " + shlex.join(args.argv),
        )
    )
