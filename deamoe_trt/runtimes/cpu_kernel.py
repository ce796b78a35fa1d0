"""deamoe-trt's CPU kernel (deamoe_trt.cpu) as a runtime: built with the system C++ compiler at first use."""

from __future__ import annotations

import torch

from ..errors import DeaMoEError, one_line
from .base import Prepared, RuntimeBase


class CpuKernelRuntime(RuntimeBase):
    name = "cpu"
    label = "deamoe-trt CPU kernel"
    dtypes = (torch.float32, torch.float16)

    def available(self) -> str | None:
        from ..cpu import load

        try:
            load()  # builds the kernel once (cached), or says why it cannot
        except DeaMoEError as exc:
            return one_line(exc)
        return None

    def prepare(self, module, *, dtype=None, device=None, threads=None, routing: str = "native", **options) -> Prepared:
        from ..cpu import CpuDeaMoE, CpuDeaMoEStack, simd
        from ..layer import DeaMoEStack

        module = self.cast(module, dtype)
        kind = CpuDeaMoEStack if isinstance(module, DeaMoEStack) else CpuDeaMoE
        fast = kind(module, threads=threads, routing=routing)
        return Prepared(self.name, fast, memory_bytes=fast.nbytes, info={"simd": simd(), "threads": threads})

    def decoder(self, model, *, threads=None):
        from ..lm.cpu import CpuDecoder

        return CpuDecoder(model, threads=threads)


RUNTIME = CpuKernelRuntime()
