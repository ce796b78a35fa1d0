"""TensorRT deployment of DeaMoE layers: build targets, engine builds, the plugin, doctor.

Nothing here imports TensorRT at import time: `_tensorrt.import_tensorrt()` does, when a
command needs it, and turns its absence into one MissingDependencyError line. The target
profiles (targets.py) and the ONNX preparation for the Python plugin (qdp.prepare_model)
work without TensorRT or a GPU.

    build:     builder.build_engine(BuildOptions(...))  (CLI: deamoe-trt build)
    run:       deamoe_trt.runtimes.tensorrt (load_engine, make_engine_runner: the engine loaders)
    doctor:    doctor.run_doctor(plugin)  (CLI: deamoe-trt doctor)
"""

from ._tensorrt import has_tensorrt, import_tensorrt, tensorrt_version

__all__ = ["has_tensorrt", "import_tensorrt", "tensorrt_version"]
