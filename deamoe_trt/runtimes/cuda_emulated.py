"""The CUDA runtime with its kernels under the SIMT emulator, on the CPU: the same decoder and
kernel source as "cuda", slow (seconds a step), for checks of the whole flow without a GPU."""

from __future__ import annotations

from .cuda import CudaRuntime

RUNTIME = CudaRuntime.emulated()
