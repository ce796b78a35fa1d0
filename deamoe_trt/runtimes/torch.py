"""The PyTorch reference (deamoe_trt.layer) as a runtime: the expectation every other runtime meets."""

from __future__ import annotations

import torch

from .base import Prepared, RuntimeBase, state_bytes


class TorchRuntime(RuntimeBase):
    name = "torch"
    label = "PyTorch reference"

    def prepare(self, module, *, dtype=None, device=None, threads=None, **options) -> Prepared:
        module = self.cast(module, dtype)
        if device is not None:
            module = module.to(device)

        def run(x, module=module):
            with torch.inference_mode():
                return module(x)

        # The reference runs the module's own tensors; memory_bytes says how much they are.
        return Prepared(self.name, run, memory_bytes=state_bytes(module), info={"threads": torch.get_num_threads()})

    def decoder(self, model, *, threads=None):
        from ..lm.generate import TorchDecoder

        return TorchDecoder(model)


RUNTIME = TorchRuntime()
