"""Build the CPU kernel at first use and load it with ctypes.

Why not a setuptools extension: the kernel is only fast when compiled for the CPU it runs
on (-march=native picks AVX-512 or AVX2, F16C, the cache-friendly tuning), which a wheel
built elsewhere cannot know; a plain C ABI also spares us the Python C API, so one build
serves every Python version; and `pip install -e .` stays a pure-Python install that works
without a compiler. The price is a one-off compile (a few seconds) on first use, cached
under a key that changes with the source, the flags, the compiler and the CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from ..cuda._library import kernel_source_dir
from ..cuda._sources import kernel_sources
from ..errors import DeaMoEError, MissingDependencyError
from ..native import cache_dir, find_cxx

SOURCE = Path(__file__).with_name("deamoe_cpu.cpp")
# Sources SOURCE includes from its own folder (the whole model's decode step).
LOCAL_HEADERS = (Path(__file__).with_name("deamoe_cpu_model.h"),)
# The routing is the CUDA kernels' (native/cuda/deamoeRouting.cuh, or the wheel's copy).
ROUTING_HEADER = "deamoeRouting.cuh"
FLAGS = ("-O3", "-march=native", "-std=c++20", "-shared", "-fPIC", "-pthread", "-DNDEBUG")
ABI_VERSION = 12
LIBRARY_NAME = "libdeamoe_cpu.so"

_lib: ctypes.CDLL | None = None


def compiler() -> str:
    """The C++ compiler (deamoe_trt.native.find_cxx), or MissingDependencyError saying how to get one."""
    cxx = find_cxx()
    if cxx is not None:
        return cxx
    raise MissingDependencyError(
        "the fast CPU path builds its kernel at first use and needs a C++ compiler: none found "
        "(install g++, e.g. `apt-get install g++`, or set CXX)"
    )


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def include_dir() -> Path:
    """The folder holding deamoeRouting.cuh and the headers it includes: native/cuda/ of a
    checkout, or the copy a wheel carries (deamoe_trt.cuda._library.kernel_source_dir)."""
    header = kernel_source_dir() / ROUTING_HEADER
    if not header.is_file():
        raise MissingDependencyError(
            f"the CPU kernel includes the routing of the CUDA kernels and cannot find it at {header}"
        )
    return header.parent


def _headers() -> list[Path]:
    """The kernel headers the build may include (all of them: a change to any rebuilds)."""
    return [file for file in kernel_sources(kernel_source_dir()) if file.suffix in (".h", ".cuh")]


def compile_command(cxx: str, output: str | os.PathLike, flags: tuple[str, ...] | list[str] = FLAGS) -> list[str]:
    """The command that compiles the kernel into `output` (tests pass other flags)."""
    return [cxx, *flags, f"-I{include_dir()}", str(SOURCE), "-o", str(output)]


def library_path(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        *(header.read_bytes() for header in LOCAL_HEADERS),
        *(header.read_bytes() for header in _headers()),
        " ".join(FLAGS).encode(),
        cxx.encode(),
        version.encode(),
        _cpu_signature().encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / "cpu" / key.hexdigest()[:20] / LIBRARY_NAME


def build(force: bool = False) -> Path:
    """Compile the kernel unless a build for this source, flags, compiler and CPU exists."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise MissingDependencyError(
            "the fast CPU path needs Linux on x86-64 (AVX2 or AVX-512); "
            f"this is {platform.system()} {platform.machine()}"
        )
    cxx = compiler()
    target = library_path(cxx)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent first uses never load a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(compile_command(cxx, tmp), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
            first = errors[0].strip() if errors else f"exit code {result.returncode}"
            raise DeaMoEError(f"building the CPU kernel with {cxx} failed: {first}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load() -> ctypes.CDLL:
    """The kernel library, built if needed; loaded once per process."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(build()))
        _declare(lib)
        if lib.dm_abi_version() != ABI_VERSION:
            raise DeaMoEError(f"CPU kernel ABI {lib.dm_abi_version()} does not match this deamoe-trt ({ABI_VERSION})")
        _lib = lib
    return _lib


def _declare(lib: ctypes.CDLL) -> None:
    i32, i64, ptr, f64 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
    signatures = {
        "dm_abi_version": (i32, []),
        "dm_simd": (ctypes.c_char_p, []),
        "dm_row_pad": (i64, []),
        "dm_neurons_per_group": (i64, []),
        "dm_pool_create": (ptr, [i32, i32, i32]),
        "dm_pool_destroy": (None, [ptr]),
        "dm_pool_size": (i32, [ptr]),
        "dm_pool_wake": (None, [ptr]),
        "dm_step_slices": (i32, [ptr]),
        "dm_alloc": (ptr, [i64]),
        "dm_free": (None, [ptr, i64]),
        "dm_pack": (i32, [ptr, ptr, i64, i64, i64, i64, i32, ptr]),
        "dm_pad_rows": (i32, [ptr, i64, i64, i64, i32, ptr]),
        "dm_pack_q": (i32, [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i32, i32, ptr]),
        "dm_pack_q_bytes": (i64, [i64, i64, i64, i64, i32, i32]),
        "dm_router": (i32, [ptr, i32, ptr, i64, i64, ptr, i64, ptr]),
        "dm_route": (i32, [ptr, ptr, i64, ptr, ptr, ptr, ptr]),
        "dm_moe_forward": (i32, [ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr]),
        "dm_layer_forward": (i32, [ptr, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr]),
        "dm_stream_read": (f64, [ptr, ptr, i64]),
        "dm_busy_wait": (None, [ptr, i64]),
        "dm_int4_mode": (i32, [i32]),
        "dm_amx_mode": (i32, [i32]),
        "dm_amx_available": (i32, []),
        "dm_lm_create": (ptr, [ptr, ptr]),
        "dm_lm_destroy": (None, [ptr]),
        "dm_lm_position": (i64, [ptr]),
        "dm_lm_reset": (None, [ptr]),
        "dm_lm_forward": (i32, [ptr, ptr, i64, ptr]),
        "dm_lm_forward_batch": (i32, [ptr, ptr, i64, ptr]),
        "dm_pack_linear_elems": (i64, [i64, i64]),
        "dm_pack_linear": (i32, [ptr, i64, i64, i64, i32, ptr]),
        "dm_pack_linear_q_bytes": (i64, [i64, i64, i64, i32, i32]),
        "dm_pack_linear_q": (i32, [ptr, ptr, i32, i64, i64, i64, i32, ptr]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
