"""GPU check of the DeaMoE CUDA kernels: `deamoe-trt check-gpu` (its --help: the cli module)."""

from .cases import shrink
from .cli import main, parse_args

__all__ = ["main", "parse_args", "shrink"]
