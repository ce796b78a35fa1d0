"""Polygraphy runners: the PyTorch reference, and one for the model under test (ONNX or engine)."""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner
from polygraphy.common import TensorMetadata

from ..errors import MissingDependencyError
from ..layer import DeaMoELayer, DeaMoEStack
from ..runtimes.onnxruntime import make_session

ENGINE_SUFFIXES = (".engine", ".plan")


class ReferenceRunner(BaseRunner):
    """A DeaMoELayer or DeaMoEStack as a polygraphy runner: the expected side of a comparison.

    It takes the same feed as the model (input_dtype: what the model's input is fed as),
    runs the module in its own dtype and returns the output as the model does: fp16 as fp16,
    bf16 and fp32 as float32 (numpy has no bf16, and bf16 models are fed float32)."""

    def __init__(
        self,
        module: DeaMoELayer | DeaMoEStack,
        *,
        input_name: str,
        output_name: str,
        input_dtype: np.dtype,
        name: str = "pytorch-reference",
    ):
        super().__init__(name=name, prefix="pytorch-reference")
        self.module = module
        self.input_name, self.output_name = input_name, output_name
        self.input_dtype = np.dtype(input_dtype)

    def get_input_metadata_impl(self):
        hidden = self.module.config.hidden_size
        return TensorMetadata().add(self.input_name, dtype=self.input_dtype, shape=["T", hidden])

    def infer_impl(self, feed_dict):
        x = torch.from_numpy(np.ascontiguousarray(feed_dict[self.input_name])).to(self.module.dtype)
        start = time.perf_counter()
        with torch.no_grad():
            y = self.module(x)
        self.inference_time = time.perf_counter() - start
        out = y.numpy() if y.dtype == torch.float16 else y.float().numpy()
        return OrderedDict([(self.output_name, out)])


def onnx_runner(path: str | Path, provider: str = "cpu") -> OnnxrtRunner:
    """Polygraphy's ONNX Runtime runner over our session (the plugin form's reference op registered).

    The session is made now, so a model ONNX Runtime cannot load fails here in one line."""
    return OnnxrtRunner(make_session(path, provider), name=f"onnxruntime-{provider}")


def engine_runner(path: str | Path, plugin: str | Path | None = None) -> BaseRunner:
    """A TensorRT engine's runner from the TensorRT runtime (deamoe_trt.runtimes.tensorrt), imported lazily."""
    try:
        from ..runtimes.tensorrt import make_engine_runner
    except ImportError as exc:
        raise MissingDependencyError(
            f"TensorRT engine validation needs deamoe_trt.runtimes.tensorrt and TensorRT (pip install tensorrt): {exc}"
        ) from None
    return make_engine_runner(str(path), plugin_path=None if plugin is None else str(plugin))


def is_engine(path: str | Path) -> bool:
    return Path(path).suffix.lower() in ENGINE_SUFFIXES
