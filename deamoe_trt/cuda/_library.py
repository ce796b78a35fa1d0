"""Finding, or building on first use, libdeamoe_kernels.so."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..checkout import ENV_VAR as CHECKOUT_VAR
from ..checkout import checkout_root
from ..errors import MissingDependencyError
from ..native import cache_dir
from ._abi import bind
from ._sources import PACKAGED_DIR, kernel_sources

ENV_LIBRARY = "DEAMOE_TRT_KERNELS_LIB"
LIBRARY_NAME = "libdeamoe_kernels.so"

_loaded: dict[str, ctypes.CDLL] = {}


class CudaUnavailableError(MissingDependencyError):
    """deamoe_trt.cuda was used where PyTorch sees no CUDA GPU."""


class KernelBuildError(MissingDependencyError):
    """The kernel library is not there and could not be built (no nvcc/CMake, a failed build)."""


def source_tree_kernel_dir() -> Path | None:
    """native/cuda/ of the source checkout (deamoe_trt.checkout), None without one."""
    root = checkout_root()
    return None if root is None else root / "native" / "cuda"


def kernel_source_dir(package_dir: Path | None = None) -> Path:
    """Where the kernel sources are (the folder holding their CMakeLists.txt and headers): the
    copy a wheel carries (deamoe_trt/cuda/_src/, see setup.py) if there is one, else the
    checkout's native/cuda/ (editable installs); the packaged folder, absent, if neither."""
    packaged = (package_dir or Path(__file__).resolve().parent) / PACKAGED_DIR
    if (packaged / "CMakeLists.txt").is_file():
        return packaged
    return source_tree_kernel_dir() or packaged


def cache_root() -> Path:
    return cache_dir() / "cuda"


def load_library(path: str | os.PathLike | None = None, *, cuda_architectures: str | None = None) -> ctypes.CDLL:
    """The DeaMoE kernel library, loaded once per path.

    Looks at, in order: `path`; the environment variable DEAMOE_TRT_KERNELS_LIB; a build
    cached under deamoe_trt.native.cache_dir()/cuda/<hash>/ (hash of the kernel sources, the CUDA
    compiler and the architectures). When none exists it builds one with CMake and nvcc
    for `cuda_architectures` (default: the current GPU's, e.g. "90"), printing progress
    to stderr; that takes a minute or two, once.
    """
    if path is None:
        path = os.environ.get(ENV_LIBRARY) or None
    if path is None:
        path = _cached_or_built(cuda_architectures)
    path = str(Path(path).expanduser().resolve())
    if path not in _loaded:
        if not Path(path).is_file():
            raise KernelBuildError(f"DeaMoE kernel library {path} does not exist")
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise KernelBuildError(f"cannot load the DeaMoE kernel library {path}: {exc}") from None
        try:
            _loaded[path] = bind(lib)
        except AttributeError as exc:
            raise KernelBuildError(f"{path} is not a DeaMoE kernel library of this version: {exc}") from None
    return _loaded[path]


def _cached_or_built(cuda_architectures: str | None) -> Path:
    source = kernel_source_dir()
    if not (source / "CMakeLists.txt").is_file():
        raise KernelBuildError(
            f"the DeaMoE kernel sources are not at {source}; set {CHECKOUT_VAR} to a deamoe-trt checkout, "
            f"or build libdeamoe_kernels.so (native/cuda/build_kernels.sh) and set {ENV_LIBRARY} to its path"
        )
    archs = cuda_architectures or _local_architecture()
    nvcc = _find_nvcc()
    cmake = shutil.which("cmake")
    if cmake is None:
        raise KernelBuildError(f"building the DeaMoE kernels needs CMake (>= 3.18) on PATH; or set {ENV_LIBRARY}")
    key = _build_key(source, nvcc, archs)
    target_dir = cache_root() / key
    library = target_dir / LIBRARY_NAME
    if library.is_file():
        return library
    target_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(target_dir / ".lock"):
        if not library.is_file():  # another process may have built it meanwhile
            _build(source, target_dir, library, cmake, nvcc, archs)
    return library


def _local_architecture() -> str:
    import torch

    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            "deamoe_trt.cuda needs a CUDA GPU to pick the architecture to build for: "
            "torch.cuda.is_available() is False (pass cuda_architectures=, or set "
            f"{ENV_LIBRARY})"
        )
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def _find_nvcc() -> str:
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KernelBuildError(
        f"building the DeaMoE kernels needs nvcc (the CUDA toolkit): not on PATH, CUDA_HOME or /usr/local/cuda; "
        f"or set {ENV_LIBRARY}"
    )


def _build_key(source: Path, nvcc: str, archs: str) -> str:
    digest = hashlib.sha256()
    for file in kernel_sources(source):
        digest.update(file.relative_to(source).as_posix().encode())
        digest.update(file.read_bytes())
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = nvcc
    digest.update(version.encode())
    digest.update(archs.encode())
    return f"{digest.hexdigest()[:16]}-sm{archs.replace(';', '_')}"


def _build(source: Path, target_dir: Path, library: Path, cmake: str, nvcc: str, archs: str) -> None:
    print(
        f"deamoe_trt.cuda: building the DeaMoE CUDA kernels for sm_{archs} into {target_dir} "
        "(first use only; a minute or two)...",
        file=sys.stderr,
        flush=True,
    )
    build_dir = Path(tempfile.mkdtemp(prefix="build-", dir=target_dir))
    configure = [
        cmake,
        "-S",
        str(source),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
    ]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    steps = [
        configure,
        [cmake, "--build", str(build_dir), "--target", "deamoe_kernels", "-j", str(os.cpu_count() or 2)],
    ]
    log = build_dir / "build.log"
    with log.open("w") as out:
        for step in steps:
            result = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, check=False)
            if result.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise KernelBuildError(
                    f"building the DeaMoE kernels failed ({' '.join(step[:2])} ...); full log: {log}\n{tail}"
                )
    built = build_dir / LIBRARY_NAME
    if not built.is_file():
        raise KernelBuildError(f"the DeaMoE kernel build finished but {built} is missing; log: {log}")
    partial = library.with_suffix(".so.partial")
    shutil.copy2(built, partial)
    os.replace(partial, library)
    shutil.rmtree(build_dir, ignore_errors=True)
    print(f"deamoe_trt.cuda: built {library}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
