"""The one place that imports TensorRT, lazily, and turns its absence into one clear line."""

from __future__ import annotations

import re
from types import ModuleType

from ..errors import MissingDependencyError, one_line

INSTALL_HINT = (
    "pip install tensorrt (x86_64/SBSA; TensorRT 10.3+) or, on Jetson, the TensorRT of JetPack 6 "
    "(sudo apt install nvidia-tensorrt python3-libnvinfer)"
)
MIN_VERSION = (10, 3)

_override: ModuleType | None = None  # tests inject a fake module here


def import_tensorrt() -> ModuleType:
    """`import tensorrt`, or MissingDependencyError (exit 1) saying how to install it."""
    if _override is not None:
        return _override
    try:
        import tensorrt as trt
    except ImportError as exc:
        reason = one_line(exc, first=True)
        if isinstance(exc, ModuleNotFoundError) and exc.name == "tensorrt":
            reason = "no module named tensorrt"
        raise MissingDependencyError(f"TensorRT is not installed: {reason} ({INSTALL_HINT})") from None
    except OSError as exc:  # the bindings exist but libnvinfer does not load
        raise MissingDependencyError(
            f"TensorRT is not installed: its Python bindings failed to load libnvinfer: {exc} ({INSTALL_HINT})"
        ) from None
    # PyPI's bare `tensorrt` can be a stub that installs nothing real on some platforms.
    if not hasattr(trt, "Builder"):
        raise MissingDependencyError(
            f"TensorRT is not installed: the tensorrt module at {getattr(trt, '__file__', '?')} has no Builder "
            f"(a placeholder package?) ({INSTALL_HINT})"
        )
    version = parse_version(getattr(trt, "__version__", "0.0"))
    if version < MIN_VERSION:
        raise MissingDependencyError(
            f"TensorRT {trt.__version__} is too old: deamoe-trt needs {MIN_VERSION[0]}.{MIN_VERSION[1]}+ "
            f"(IPluginV3) ({INSTALL_HINT})"
        )
    return trt


def parse_version(text: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def tensorrt_version(trt: ModuleType | None = None) -> tuple[int, int]:
    trt = trt or import_tensorrt()
    return parse_version(trt.__version__)


def has_tensorrt() -> bool:
    try:
        import_tensorrt()
    except MissingDependencyError:
        return False
    return True


def make_logger(trt: ModuleType, verbose: bool = False):
    """A TensorRT logger at WARNING (INFO with verbose) that prints as TensorRT's own does."""
    return trt.Logger(trt.Logger.INFO if verbose else trt.Logger.WARNING)
