"""ONNX Runtime (CPU) as a runtime: a layer's `ort` export form (deamoe_trt.export), one session.

The vanilla anchor is the `ort` form of DeaMoELayer.vanilla(): router logits straight into
com.microsoft.MoE, which does its own softmax top-k routing (deamoe_trt/export/ort_form.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ..dtypes import DTYPES
from ..errors import MissingDependencyError, UsageError
from .base import Prepared, RuntimeBase, state_bytes

# ONNX Runtime's CPU MoE has no bf16 kernel.
ONNX_DTYPES = {d.torch: d.name for d in DTYPES if d.name != "bf16"}
# Initializers at least this big are handed to ONNX Runtime as in-memory arrays.
_IN_MEMORY_MIN_BYTES = 1 << 16
BUILDER = "deamoe_trt.export.build_model"


def build_ort_model(layer):
    """The layer's `ort` form as a ModelProto."""
    from ..export import build_model

    dtype = ONNX_DTYPES.get(layer.dtype)
    if dtype is None:
        raise UsageError(f"the ort form runs fp32 or fp16 here, not {layer.dtype}")
    return build_model(layer, "ort", dtype=dtype)


class OrtModel:
    """An ONNX Runtime CPU session and the arrays that hold its weights (kept alive with it)."""

    def __init__(self, session, arrays: dict):
        self.session = session
        self.arrays = arrays
        self.input_name = session.get_inputs()[0].name
        self.output_name = session.get_outputs()[0].name

    def run(self, x):
        return self.session.run([self.output_name], {self.input_name: x})[0]


def make_session(model, threads: int | None, *, spinning: bool = False) -> OrtModel:
    """An ONNX Runtime CPU session for model (consumed: its weights are moved out of it).

    The weights reach ONNX Runtime as in-memory initializers (numpy arrays it uses in place),
    not in a serialized model, a measured fix: protobuf cannot hold more than 2 GB, and
    weights saved as external data are memory-mapped from the file, where a host that
    reclaims cold page cache (DAMON pageout, as on this project's CI VMs) drops them and
    steps then read them from disk.
    """
    try:
        import onnx
        import onnxruntime as ort
        from onnx import external_data_helper, numpy_helper

        from ..validation.session import make_session as make_validation_session
        from ..validation.session import session_options
    except ImportError as exc:
        raise MissingDependencyError(f"ONNX Runtime contenders need onnx and onnxruntime: {exc}") from None

    arrays: dict[str, np.ndarray] = {}

    def to_memory(tensor) -> None:
        arrays[tensor.name] = np.ascontiguousarray(numpy_helper.to_array(tensor))
        external_data_helper.set_external_data(tensor, location="deamoe-bench-in-memory")
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL

    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL and len(tensor.raw_data) >= _IN_MEMORY_MIN_BYTES:
            to_memory(tensor)

    # Spinning threads keep a core busy after each run; in an interleaved benchmark they
    # would steal it from the next contender.
    options = session_options(threads, spinning=spinning)
    if arrays:
        names = list(arrays)
        options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(arrays[n]) for n in names])
    return OrtModel(make_validation_session(model, options=options), arrays)


class OnnxRuntime(RuntimeBase):
    name = "ort"
    label = "ONNX Runtime CPU"
    dtypes = tuple(ONNX_DTYPES)

    def available(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return f"needs onnx and onnxruntime: {exc}"
        return None

    def prepare(self, module, *, dtype=None, device=None, threads=None, spinning: bool = False, **options) -> Prepared:
        """One session over the layer's `ort` form (a stack: not exported as one graph here)."""
        from ..layer import DeaMoEStack

        if isinstance(module, DeaMoEStack):
            raise UsageError(f"{self.label} runs one layer's export; a stack is not exported as one graph")
        self.require()
        module = self.cast(module, dtype)
        model = build_ort_model(module)
        session = make_session(model, threads, spinning=spinning)
        del model
        info = {"builder": BUILDER, "threads": threads, "spinning": spinning, "execution_mode": "sequential"}
        return Prepared(
            self.name,
            session.run,
            to_input=lambda x: x.numpy(),
            to_torch=torch.from_numpy,
            memory_bytes=state_bytes(module),
            info=info,
            keep_alive=session,
        )

    def decoder(self, model, *, threads=None):
        from ..lm.ort import OrtDecoder

        return OrtDecoder.from_model(model, form="ort", threads=threads)


RUNTIME = OnnxRuntime()
