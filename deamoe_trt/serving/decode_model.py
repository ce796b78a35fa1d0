"""Alias of deamoe_trt.integrations.triton.decode_model for repositories an earlier release wrote
(see this package's docstring)."""

from ..integrations.triton.decode_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
