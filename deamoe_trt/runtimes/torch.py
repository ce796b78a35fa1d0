"""The PyTorch reference (deamoe_trt.layer, deamoe_trt.lm.model) as a runtime: the expectation
every other runtime meets."""

from __future__ import annotations

import numpy as np
import torch

from ..lm.model import DeaMoELM, KVCache
from .base import Capabilities, DecoderPool, Prepared, RuntimeBase, state_bytes


class TorchRuntime(RuntimeBase):
    name = "torch"
    label = "PyTorch reference"
    capabilities = Capabilities(decoding=True, reference=True)

    def prepare(self, module, *, dtype=None, device=None, threads=None, **options) -> Prepared:
        module = self.cast(module, dtype)
        if device is not None:
            module = module.to(device)

        def run(x, module=module):
            with torch.inference_mode():
                return module(x)

        # The reference runs the module's own tensors; memory_bytes says how much they are.
        return Prepared(self.name, run, memory_bytes=state_bytes(module), info={"threads": torch.get_num_threads()})

    def decoder(self, model, *, threads=None, twin="deamoe", **options) -> TorchDecoder:
        return TorchDecoder(model.twin(twin))

    def decoder_pool(self, model, *, threads=None, size=1, twin="deamoe", **options) -> DecoderPool:
        source = model.twin(twin)
        return DecoderPool(lambda: TorchDecoder(source))


class TorchDecoder:
    """The PyTorch reference with its list-of-tensors KV cache."""

    name = "torch"

    def __init__(self, model: DeaMoELM):
        self.model = model.eval()
        self.max_context = model.config.max_position_embeddings
        self.cache: KVCache | None = None

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> np.ndarray:
        out = self.model(torch.tensor([ids], dtype=torch.long, device=self.model.device))
        self.cache = out.past_key_values
        return out.logits[0, -1].float().cpu().numpy()

    @torch.no_grad()
    def step(self, token: int) -> np.ndarray:
        out = self.model(torch.tensor([[token]], dtype=torch.long, device=self.model.device), self.cache)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().cpu().numpy()


RUNTIME = TorchRuntime()
