"""A polygraphy runner for a built engine, with the DeaMoE plugin loaded first.

`deamoe-trt validate model.engine --against CKPT` compares it with the PyTorch reference
through the same comparator as the ONNX forms (deamoe_trt.validation).
"""

from __future__ import annotations

import mmap
from pathlib import Path

from ..errors import MissingDependencyError, UsageError
from .plugin import BUILD_HINT, PLUGIN_NAME, load_plugin, resolve_plugin


def make_engine_runner(path: str | Path, plugin_path: str | None = None):
    """polygraphy's TrtRunner over the engine at path.

    plugin_path: a plugin library, "python" for the QDP route, or None to use the library
    found in DEAMOE_TRT_PLUGIN / the build folders (an engine without DeaMoE layers needs
    none). The plugin is registered before the engine is deserialised, since TensorRT
    looks its creator up then.
    """
    from ._tensorrt import import_tensorrt

    path = Path(path)
    if path.is_dir() or not path.is_file():
        raise UsageError(f"no engine file at {path} (build one with `deamoe-trt build`)")
    trt = import_tensorrt()  # MissingDependencyError, one line, before polygraphy touches TensorRT
    choice = resolve_plugin(plugin_path)
    if choice.kind != "none":
        load_plugin(choice, trt)
    elif mentions_plugin(path):
        # Deserialisation would fail later, inside polygraphy, with a less direct message.
        raise MissingDependencyError(f"{path} has DeaMoE layers but no plugin was found ({BUILD_HINT})")

    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=f"tensorrt-{path.name}")


def mentions_plugin(path: Path) -> bool:
    """Whether the engine file names the DeaMoE plugin (a serialised plugin layer stores its name)."""
    with path.open("rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return data.find(PLUGIN_NAME.encode()) >= 0
        except ValueError:  # an empty file cannot be mapped
            return False


def load_engine(path: str | Path, plugin_path: str | None = None):
    """(tensorrt module, the deserialised engine at path), the DeaMoE plugin registered first
    (plugin_path as for make_engine_runner); a one-line UsageError for a file this TensorRT
    cannot load. For code that drives the engine itself (execution contexts, device buffers)."""
    from ._tensorrt import import_tensorrt, make_logger

    trt = import_tensorrt()
    choice = resolve_plugin(plugin_path)
    if choice.kind != "none":
        load_plugin(choice, trt)
    engine = trt.Runtime(make_logger(trt)).deserialize_cuda_engine(Path(path).read_bytes())
    if engine is None:
        raise UsageError(f"{path} is not a TensorRT engine this TensorRT ({trt.__version__}) can load")
    return trt, engine
