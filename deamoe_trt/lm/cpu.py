"""Decoding with every DeaMoE FFN on deamoe-trt's CPU kernel (deamoe_trt.cpu.CpuDeaMoE).

Attention, norms, dense layers, embeddings and head stay PyTorch; each DeaMoE block's FFN
is one kernel call per step that routes and streams every used weight once. The kernel runs
float32 and float16 weights; a bfloat16 model's FFNs are converted to float16 for it (a
different rounding: tokens may differ from the bf16 model).

The PyTorch part of a half-precision model runs in float32 (its weights copied once):
PyTorch's fp16 and bf16 matrix-vector products on CPUs without native half arithmetic are
several times slower than fp32 ones although they read half the bytes (measured here on a
[4096, 2048] projection, 1 token: fp16 24.8 ms, bf16 28.3 ms, fp32 8.2 ms), and they set
the time of a decode step outside the FFNs.
"""

from __future__ import annotations

import numpy as np
import torch

from ..cpu.layer import CpuDeaMoE, _single_threaded_torch
from .model import DeaMoELM, KVCache


class CpuDecoder:
    """The Decoder protocol of deamoe_trt.lm.generate on the CPU kernel."""

    name = "cpu"

    def __init__(self, model: DeaMoELM, *, threads: int | None = None, ffns: dict | None = None):
        """ffns: {block: CpuDeaMoE} already packed (e.g. a twin's FFNs on this model's attention);
        default: model's own DeaMoE FFNs, packed here."""
        self.model = _float32_outside_moe(model).eval()
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
        # PyTorch on one thread: the kernel's workers spin between its calls, and PyTorch's
        # intra-op threads competing with them for the cores cost milliseconds per small op
        # (measured on this shared VM, one bench-lm block: a 1-token step went from 178 ms to 82 ms).
        with _single_threaded_torch():
            out = self.model(torch.tensor([ids], dtype=torch.long), self.cache, ffns=self.ffns)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.cache = None
        return self._run(list(ids))

    def step(self, token: int) -> np.ndarray:
        return self._run([token])


def _float32_outside_moe(model: DeaMoELM) -> DeaMoELM:
    """model with every tensor outside its DeaMoE FFNs in float32 (the FFN tensors are shared,
    not copied: the kernel has its own packed copy)."""
    c = model.config
    if model.dtype == torch.float32 and not c.quantized_linears:
        return model
    moe = tuple(f"layers.{i}.mlp." for i in model.moe_layers())
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(moe)}
    if c.quantized_linears:  # quantized projections run dequantized, as the reference runs them
        from .qlinear import dequantized_state

        assert c.quantization is not None
        state = dequantized_state(state, c.quantization)
    state = {k: v.float() for k, v in state.items()}
    state.update({k: v for k, v in model.state_dict().items() if k.startswith(moe)})
    twin = DeaMoELM(c.replace(quantized_linears=()), dtype=torch.float32, device="meta")
    twin.load_state_dict(state, assign=True)
    twin.tie_weights()
    return twin.materialize_rope()
