"""Finding and loading the DeaMoE plugin: the C++ library, or the Python (QDP) route.

`--plugin` takes one value everywhere (build, validate, doctor, the device check):
  PATH     a plugin library: libdeamoe_plugin.so (registers itself when loaded) or
           libdeamoe_plugin_dynamic.so (registered through IPluginRegistry.load_library);
  python   the `tensorrt.plugin` (QDP) registration in deamoe_trt.trt.qdp (TensorRT 10.6+);
  omitted  the library, found in DEAMOE_TRT_PLUGIN or the usual build folders; none is
           needed when the model has no DeaMoE node.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import contract
from ..checkout import checkout_root
from ..cuda.tuning import TABLE_DIR
from ..errors import MissingDependencyError, UsageError

PLUGIN_NAME = contract.OP_TYPE
PLUGIN_VERSION = contract.PLUGIN_VERSION
PLUGIN_NAMESPACE = contract.PLUGIN_NAMESPACE
PYTHON = "python"
ENV_VAR = "DEAMOE_TRT_PLUGIN"
TABLES_ENV_VAR = "DEAMOE_TRT_KERNEL_TABLES"  # plugins/deamoe/deamoeVariantTable.h

_LIB_NAMES = (
    ("libdeamoe_plugin.so", "libdeamoe_plugin_dynamic.so")
    if sys.platform != "win32"
    else (
        "deamoe_plugin.dll",
        "deamoe_plugin_dynamic.dll",
    )
)

BUILD_HINT = (
    "build it with: cmake -S plugins -B build/plugins -DTENSORRT_ROOT=<TensorRT prefix, /usr on JetPack> "
    "&& cmake --build build/plugins -j (docs/deploying.md), then pass --plugin build/plugins/libdeamoe_plugin.so "
    "or set DEAMOE_TRT_PLUGIN; or use --plugin python (TensorRT 10.6+)"
)


@dataclass(frozen=True)
class PluginChoice:
    """What --plugin resolved to: a library path, the Python route, or nothing found."""

    kind: str  # "library" | "python" | "none"
    path: Path | None = None
    searched: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "library":
            return str(self.path)
        if self.kind == "python":
            return "python (tensorrt.plugin QDP route)"
        return "none found"


def candidate_paths() -> Iterator[Path]:
    """Where a built library is looked for when --plugin is not given, in order."""
    env = os.environ.get(ENV_VAR)
    if env:
        yield Path(env)
    roots = [Path.cwd(), *filter(None, [checkout_root()])]
    folders = ["build/plugins", "build", "build/plugins/deamoe", "build/plugins/lib", "build/lib"]
    seen = set()
    for root in roots:
        for folder in folders:
            for name in _LIB_NAMES[:1]:  # the self-registering library first
                path = (root / folder / name).resolve()
                if path not in seen:
                    seen.add(path)
                    yield path
    for prefix in ("/usr/local/lib", "/usr/lib"):
        yield Path(prefix) / _LIB_NAMES[0]


def resolve_plugin(value: str | os.PathLike | None) -> PluginChoice:
    """--plugin's value -> what to load. A given path must exist; nothing given searches."""
    if value is not None and str(value) == PYTHON:
        return PluginChoice("python")
    if value is not None:
        path = Path(value).expanduser()
        if path.is_dir():
            for name in _LIB_NAMES:
                if (path / name).is_file():
                    return PluginChoice("library", (path / name).resolve())
            raise UsageError(f"--plugin {path} is a folder without {' or '.join(_LIB_NAMES)}")
        if not path.is_file():
            raise UsageError(f"--plugin {path}: no such file ({BUILD_HINT})")
        return PluginChoice("library", path.resolve())
    searched = []
    for path in candidate_paths():
        searched.append(str(path))
        if path.is_file():
            return PluginChoice("library", path)
    return PluginChoice("none", None, tuple(searched))


def _find_creator(trt, name=PLUGIN_NAME, version=PLUGIN_VERSION, namespace=PLUGIN_NAMESPACE):
    registry = trt.get_plugin_registry()
    getter = getattr(registry, "get_creator", None)  # IPluginCreatorInterface lookup, TensorRT 10+
    if getter is not None:
        return getter(name, version, namespace)
    return registry.get_plugin_creator(name, version, namespace)  # pragma: no cover - TensorRT 9


_loaded: dict[str, object] = {}  # keeps libraries (and their creators) alive for the process


def load_plugin(choice: PluginChoice, trt=None) -> str:
    """Make the DeaMoE creator available to TensorRT's registry; returns what was loaded.

    Call after importing tensorrt: a library's libnvinfer dependency then resolves (by
    soname) to the libnvinfer the bindings already loaded, so it registers into the same
    registry the parser and runtime use.
    """
    from ._tensorrt import import_tensorrt

    trt = trt or import_tensorrt()
    if choice.kind == "python":
        from .qdp import register

        register()
        return "python (QDP deamoe_trt::DeaMoE)"
    if choice.kind == "none":
        raise MissingDependencyError(f"the DeaMoE plugin library was not found ({BUILD_HINT})")
    path = str(choice.path)
    if path in _loaded:
        return path
    if _find_creator(trt) is not None:
        # Already registered (another library, or an earlier call with another path).
        _loaded[path] = None
        return path
    # The library reads this GPU's kernel variant table from here (plugins/deamoe/README.md,
    # "Kernel variants"), as the Python bindings do; a folder the caller named stays.
    os.environ.setdefault(TABLES_ENV_VAR, str(TABLE_DIR))
    try:
        # RTLD_GLOBAL: the kernels' symbols stay resolvable for anything loaded later.
        library = ctypes.CDLL(path, mode=getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0))
    except OSError as exc:
        raise MissingDependencyError(f"the DeaMoE plugin library {path} does not load: {exc}") from None
    handle = None
    if _find_creator(trt) is None and hasattr(library, "getCreators"):
        # The dynamic variant registers nothing by itself: hand it to the registry.
        handle = trt.get_plugin_registry().load_library(path)
    if _find_creator(trt) is None:
        raise MissingDependencyError(
            f"{path} loaded but registered no {PLUGIN_NAME} v{PLUGIN_VERSION} plugin creator; was it built against "
            f"this TensorRT ({trt.__version__})? Rebuild it ({BUILD_HINT})"
        )
    _loaded[path] = (library, handle)
    return path
