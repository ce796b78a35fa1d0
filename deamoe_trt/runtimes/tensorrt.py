"""TensorRT as a runtime: a layer's plugin-form export built into an engine on this GPU, run
through polygraphy with the DeaMoE plugin loaded (deamoe_trt.trt); a language model's
plugin-form export built into a two-profile engine and decoded by deamoe_trt.lm.trt.

TensorRT, polygraphy and a CUDA build of torch are imported when used: on a machine
without them `available()` says which is missing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import MissingDependencyError, one_line
from .base import Prepared, RuntimeBase


class TensorRTRuntime(RuntimeBase):
    name = "tensorrt"
    label = "TensorRT"
    # The layer's engine is fed numpy arrays, which have no bfloat16.
    dtypes = (torch.float32, torch.float16)

    def available(self) -> str | None:
        from ..trt import import_tensorrt

        try:
            import_tensorrt()
        except MissingDependencyError as exc:
            return one_line(exc)
        if not torch.cuda.is_available():
            return "needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
        return None

    def prepare(
        self,
        module,
        *,
        dtype=None,
        device=None,
        threads=None,
        plugin: str | None = None,
        max_tokens: int = 64,
        work_dir: str | Path | None = None,
        **options,
    ) -> Prepared:
        """Export (plugin form), build and load an engine for module; files go in work_dir
        (default: a temporary folder kept as long as the returned Prepared)."""
        from ..dtypes import of_torch
        from ..export import INPUT_NAME, OUTPUT_NAME, export
        from ..layer import DeaMoEStack
        from ..trt.builder import BuildOptions, build_engine
        from ..trt.runner import make_engine_runner

        self.require()
        module = self.cast(module, dtype)
        holder = None
        if work_dir is None:
            holder = tempfile.TemporaryDirectory(prefix="deamoe-trt-runtime-")
            work_dir = holder.name
        work = Path(work_dir)
        name = of_torch(module.dtype).name
        layer = module.layers[0] if isinstance(module, DeaMoEStack) and len(module.layers) == 1 else module
        onnx_path = export(layer, work / f"layer-{name}.onnx", "plugin", name, max_tokens=max_tokens)
        result = build_engine(
            BuildOptions(model=onnx_path, output=work / f"layer-{name}.engine", max_tokens=max_tokens, plugin=plugin)
        )
        runner = make_engine_runner(result.engine, plugin)
        runner.activate()
        np_dtype = of_torch(module.dtype).numpy

        def run(x: np.ndarray) -> np.ndarray:
            return runner.infer({INPUT_NAME: x})[OUTPUT_NAME]

        return Prepared(
            self.name,
            run,
            to_input=lambda x: np.ascontiguousarray(x.numpy().astype(np_dtype)),
            to_torch=lambda y: torch.from_numpy(np.asarray(y)),
            info={"engine": str(result.engine), "target": result.target, "gpu": result.gpu},
            keep_alive=(runner, holder),
        )

    def decoder(self, model, *, threads=None, plugin: str | None = None, work_dir: str | Path | None = None):
        """The model's plugin-form export built into a prefill + decode engine (deamoe_trt.lm.trt)."""
        from ..lm.onnx_export import export_lm
        from ..lm.trt import TrtDecoder, build_lm_engine

        self.require()
        holder = None
        if work_dir is None:
            holder = tempfile.TemporaryDirectory(prefix="deamoe-trt-runtime-")
            work_dir = holder.name
        work = Path(work_dir)
        half = model.dtype == torch.float16
        onnx_path = export_lm(model, work / "model.onnx", "plugin", "fp16" if half else "fp32")
        engine = build_lm_engine(onnx_path, work / "model.engine", model.config, plugin=plugin, fp16=half)
        decoder = TrtDecoder(engine, model.config, plugin=plugin)
        decoder.keep_alive = holder  # type: ignore[attr-defined]
        return decoder


RUNTIME = TensorRTRuntime()
