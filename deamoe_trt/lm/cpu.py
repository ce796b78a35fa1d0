"""Decoding with every DeaMoE FFN on deamoe-trt's CPU kernel (deamoe_trt.cpu.CpuDeaMoE).

Attention, norms, dense layers, embeddings and head stay PyTorch (single call each per
block); each DeaMoE block's FFN is one kernel call per step that routes and streams every
used weight once. The kernel runs float32 and float16 weights; a bfloat16 model's FFNs are
converted to float16 for it (a different rounding: tokens may differ from the bf16 model).
"""

from __future__ import annotations

import numpy as np
import torch

from ..cpu import CpuDeaMoE
from .model import DeaMoELM, KVCache


class CpuDecoder:
    """The Decoder protocol of deamoe_trt.lm.generate on the CPU kernel."""

    name = "cpu"

    def __init__(self, model: DeaMoELM, *, threads: int | None = None, ffns: dict | None = None):
        """ffns: {block: CpuDeaMoE} already packed (e.g. a twin's FFNs on this model's attention);
        default: model's own DeaMoE FFNs, packed here."""
        self.model = model.eval()
        self.max_context = model.config.max_position_embeddings
        self.ffns = ffns if ffns is not None else {}
        for i in [] if ffns is not None else model.moe_layers():
            layer = model.layers[i].mlp
            if layer.dtype == torch.bfloat16:
                layer = layer.to(torch.float16)
            self.ffns[i] = CpuDeaMoE(layer, threads=threads)
        self.cache: KVCache | None = None

    @torch.inference_mode()
    def _run(self, ids: list[int]) -> np.ndarray:
        out = self.model(torch.tensor([ids], dtype=torch.long), self.cache, ffns=self.ffns)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.cache = None
        return self._run(list(ids))

    def step(self, token: int) -> np.ndarray:
        return self._run([token])
