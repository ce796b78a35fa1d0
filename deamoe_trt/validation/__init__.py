"""Validate an exported model (or a TensorRT engine) against the PyTorch reference of its checkpoint.

validate() = the model loaded on its runtime and the reference prepared on "torch"
(deamoe_trt.runtimes), compared on random inputs per token count through the one adapter
between two runtimes (pair.compare_layers; a language model's decoders: pair.compare_decoders).
Its report holds one row per output and token count.
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
