"""`deamoe-trt validate`: run an exported model on ONNX Runtime (or a TensorRT engine) and compare it
with the PyTorch reference of its checkpoint on random inputs; exits 1 above tolerance."""

from __future__ import annotations

from . import args as common

TOLERANCE = common.number("a number >= 0", lambda v: v >= 0)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate", help="compare an exported model or engine with the PyTorch reference", description=__doc__
    )
    parser.add_argument("model", metavar="MODEL", help="model.onnx from `deamoe-trt export`, or a .engine/.plan")
    parser.add_argument("--against", required=True, metavar="CKPT", help="checkpoint the model was exported from")
    common.add_tokens(parser, default="1,4,16")
    parser.add_argument(
        "--atol", type=TOLERANCE, help="absolute tolerance (default by dtype: fp32 1e-4, fp16 1e-2, bf16 5e-2)"
    )
    parser.add_argument(
        "--rtol", type=TOLERANCE, help="relative tolerance (default by dtype: fp32 1e-3, fp16 1e-2, bf16 5e-2)"
    )
    common.add_seed(parser)
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu", help="ONNX Runtime execution provider")
    parser.add_argument("--plugin", metavar="PATH", help="plugin library for TensorRT engines")
    parser.add_argument("--inputs", metavar="NPY", help="hidden states [T, d] (.npy) to use instead of random ones")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..errors import DeaMoEError
    from ..validation import validate

    inputs = _load_inputs(args.inputs) if args.inputs else None
    report = validate(
        args.model,
        args.against,
        tokens=args.tokens,
        atol=args.atol,
        rtol=args.rtol,
        seed=args.seed,
        provider=args.provider,
        plugin=args.plugin,
        inputs=inputs,
    )
    print(report.table())
    if not report.passed:
        raise DeaMoEError(report.failure())
    return 0


def _load_inputs(path: str):
    import numpy as np

    from ..errors import UsageError, one_line

    expected = f"cannot read inputs from {path} (a .npy array of [T, d] is expected)"
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as exc:
        raise UsageError(f"{expected}: {exc.strerror or exc}") from None
    if magic != b"\x93NUMPY":  # numpy reads anything else as a pickle, and says so
        raise UsageError(f"{expected}: it is not a .npy file (no NUMPY header)")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{expected}: {one_line(exc, first=True)}") from None
