"""Which GPU this machine has: name, compute capability, memory, driver.

Asked of the CUDA driver (libcuda) through ctypes first: it is present wherever a GPU is
usable (x86 drivers and JetPack alike) and needs no Python package. torch.cuda is the
fallback. Builds and `doctor` use device 0, the device TensorRT builds on by default;
select another with CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from ..errors import MissingDependencyError
from .targets import GpuInfo

# CUdevice_attribute values from cuda.h.
_ATTR_INTEGRATED = 18
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_CUDA_ERROR_NO_DEVICE = 100
DRIVER_HINT = "install the NVIDIA driver, or JetPack on Jetson"


class _DriverError(Exception):
    pass


def _libcuda() -> ctypes.CDLL:
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]
    found = ctypes.util.find_library("cuda")
    if found:
        names.append(found)
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise _DriverError(f"the CUDA driver library (libcuda) is not loadable: {errors[0] if errors else 'not found'}")


def _query_driver(index: int) -> GpuInfo:
    cuda = _libcuda()

    def call(fn: str, *args) -> None:
        rc = getattr(cuda, fn)(*args)
        if rc != 0:
            if rc == _CUDA_ERROR_NO_DEVICE:
                raise _DriverError("the CUDA driver reports no GPU (CUDA_ERROR_NO_DEVICE)")
            raise _DriverError(f"{fn} failed with CUDA driver error {rc}")

    call("cuInit", 0)
    count = ctypes.c_int(0)
    call("cuDeviceGetCount", ctypes.byref(count))
    if count.value <= index:
        raise _DriverError(f"the CUDA driver sees {count.value} GPU(s); device {index} does not exist")
    device = ctypes.c_int(0)
    call("cuDeviceGet", ctypes.byref(device), index)
    name = ctypes.create_string_buffer(256)
    call("cuDeviceGetName", name, 256, device)
    major, minor, integrated = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    call("cuDeviceGetAttribute", ctypes.byref(major), _ATTR_CC_MAJOR, device)
    call("cuDeviceGetAttribute", ctypes.byref(minor), _ATTR_CC_MINOR, device)
    call("cuDeviceGetAttribute", ctypes.byref(integrated), _ATTR_INTEGRATED, device)
    memory = ctypes.c_size_t(0)
    call("cuDeviceTotalMem_v2", ctypes.byref(memory), device)
    version = ctypes.c_int(0)
    call("cuDriverGetVersion", ctypes.byref(version))
    return GpuInfo(
        name=name.value.decode(errors="replace"),
        compute_capability=(major.value, minor.value),
        total_memory=memory.value,
        driver_version=version.value,
        integrated=bool(integrated.value),
        source="CUDA driver",
    )


def _query_torch(index: int) -> GpuInfo:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise _DriverError(f"torch is not importable: {exc}") from None
    if not torch.cuda.is_available():
        raise _DriverError(f"torch {torch.__version__} sees no CUDA GPU")
    props = torch.cuda.get_device_properties(index)
    return GpuInfo(
        name=props.name,
        compute_capability=(props.major, props.minor),
        total_memory=int(props.total_memory),
        integrated=bool(getattr(props, "is_integrated", False)),
        source="torch.cuda",
    )


def query_gpu(index: int = 0) -> GpuInfo:
    """The GPU at index, or MissingDependencyError naming why none was found."""
    reasons = []
    for query in (_query_driver, _query_torch):
        try:
            return query(index)
        except _DriverError as exc:
            reasons.append(str(exc))
    raise MissingDependencyError("no CUDA GPU found: " + "; ".join(reasons) + f" ({DRIVER_HINT})")


def format_driver_version(version: int | None) -> str:
    if not version:
        return "unknown"
    return f"{version // 1000}.{(version % 1000) // 10}"
