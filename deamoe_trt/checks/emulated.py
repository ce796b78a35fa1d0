"""The kernel library built for the CPU under the SIMT emulator (deamoe_trt/cuda/simt_emulator/):
the real kernel source behind the real C ABI, on host memory. The kernel tests use it, and so
does `deamoe-trt check-gpu --dry-run`; the emulator and the kernel sources ship in the package."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..cuda import kernel_source_dir
from ..errors import MissingDependencyError
from ..native import find_cxx

KERNEL_DIR = kernel_source_dir()
EMULATOR_DIR = Path(__file__).resolve().parents[1] / "cuda" / "simt_emulator"


def find_cuda_include() -> Path | None:
    """A CUDA toolkit include directory (cuda_fp16.h, cuda_runtime_api.h), if any."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parents[1]))
    for home in homes:
        if home:
            include = Path(home) / "include"
            if (include / "cuda_fp16.h").is_file() and (include / "cuda_runtime_api.h").is_file():
                return include
            for include in sorted((Path(home) / "targets").glob("*/include")):
                if (include / "cuda_fp16.h").is_file():
                    return include
    return None


def emulated_library_command(cxx: str, include: Path, output: Path) -> list[str]:
    """The compiler command that builds libdeamoe_emulated.so."""
    return [
        cxx, "-std=c++20", "-O2", "-pthread", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unknown-pragmas",
        "-Werror", "-Wl,--no-undefined", f"-I{include}", f"-I{KERNEL_DIR}", f"-I{EMULATOR_DIR}",
        str(EMULATOR_DIR / "emulated_kernels.cpp"), "-shared", "-fPIC", "-o", str(output),
    ]  # fmt: skip


def build_emulated_library(output: Path) -> Path:
    """Builds the emulated library at `output`; MissingDependencyError when the compiler,
    the CUDA headers or the emulator source are missing."""
    cxx, include = find_cxx(), find_cuda_include()
    if cxx is None:
        raise MissingDependencyError("no C++ compiler (c++, g++ or clang++) on PATH to build the emulated kernels")
    if include is None:
        raise MissingDependencyError("no CUDA toolkit headers (cuda_fp16.h) via CUDA_HOME, nvcc or /usr/local/cuda")
    if not (EMULATOR_DIR / "emulated_kernels.cpp").is_file():
        raise MissingDependencyError(f"the SIMT emulator source is not here ({EMULATOR_DIR}): reinstall deamoe-trt")
    output.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        emulated_library_command(cxx, include, output), capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"compiling {output.name} failed:\n{result.stderr[-4000:]}")
    return output


def cached_emulated_library() -> Path:
    """The emulated library built once per source: under deamoe_trt.native.cache_dir()/
    cuda-emulated/<hash of the kernel and emulator sources, the CUDA headers, the compiler's
    command and version>/ (a build to a temporary name, renamed), so each process after the
    first loads it at once; the kernel tests load this build too."""
    import hashlib
    import tempfile

    from ..cuda._sources import kernel_sources
    from ..native import cache_dir

    cxx, include = find_cxx(), find_cuda_include()
    digest = hashlib.sha256()
    files = [*kernel_sources(KERNEL_DIR), *sorted(EMULATOR_DIR.glob("*"))]
    if include is not None:
        files += sorted(path for path in include.glob("cuda_*.h*") if path.is_file())
    for file in files:
        if file.is_file():
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    digest.update(f"{cxx} {include}".encode())
    if cxx is not None and include is not None:
        digest.update(" ".join(emulated_library_command(cxx, include, Path("OUTPUT"))).encode())
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
        digest.update(version.stdout.encode())
    library = cache_dir() / "cuda-emulated" / digest.hexdigest()[:16] / "libdeamoe_emulated.so"
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        built = build_emulated_library(Path(scratch) / library.name)
        os.replace(built, library)
    return library
