"""Validate an exported model (or a TensorRT engine) against the PyTorch reference of its checkpoint.

validate() = a polygraphy runner for the model (runners.onnx_runner / runners.engine_runner)
+ the reference runner (runners.ReferenceRunner) + one comparison (compare.compare) on
random inputs per token count. Its report holds one row per output and token count.
"""

from ..runtimes.onnxruntime import make_session
from .layers import VALIDATORS, check_inputs, check_weights, reference_module, validate
from .report import DEFAULT_TOKENS, DEFAULT_TOLERANCES, ValidationReport

__all__ = [
    "DEFAULT_TOKENS",
    "DEFAULT_TOLERANCES",
    "VALIDATORS",
    "ValidationReport",
    "check_inputs",
    "check_weights",
    "make_session",
    "reference_module",
    "validate",
]
