"""Healing: distil the source back into the converted weights, deterministically, on a CPU.

Layer-wise: the converted layer's shared and private parts (not its router) learn the source
layer's outputs on calibration hidden states; loss = ||y - y_source||^2 / ||y_source||^2
over a batch. End to end (language models): every FFN's parts and routers learn the
source's next-token distribution on calibration windows; loss = KL(source || converted),
in distill.py (checkpoints, resume, several processes).
Adam, cosine-decayed learning rate, batches from a seeded generator, fixed thread count.
"""

from __future__ import annotations

import torch

from ..console import Progress
from ..layer import DeaMoELayer
from .distill import DistillSettings, cosine_lr, distill_lm

LAYER_BATCH = 512


def _ffn_parameters(layer: DeaMoELayer) -> list[torch.nn.Parameter]:
    if hasattr(layer, "ffn_parameters"):  # a baseline of another structure names its own
        return layer.ffn_parameters()
    return [p for part in (layer.departments, layer.experts) if part is not None for p in part.parameters()]


def _step(optimizer, loss: torch.Tensor, progress: Progress | None, label: str) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if progress is not None:
        progress.update(f"{label} {loss.item():.4f}")
    return loss.item()


def heal_layer(
    layer: DeaMoELayer,
    source: DeaMoELayer,
    hidden: torch.Tensor,
    steps: int,
    *,
    lr: float = 1e-3,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[float]:
    """Train layer (in place, in float32, cast back) towards source on hidden [T, d]; the loss per step."""
    if steps <= 0:
        return []
    dtype = layer.dtype
    layer.float()
    x = hidden.reshape(-1, layer.config.hidden_size).float()
    with torch.no_grad():
        target = source(x.to(source.dtype)).float()
    params = _ffn_parameters(layer)
    optimizer = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        cosine_lr(optimizer, lr, step, steps)
        batch = torch.randperm(x.shape[0], generator=gen)[:LAYER_BATCH]
        y = layer.forward_routed(x[batch], layer.route(x[batch]))
        loss = (y - target[batch]).pow(2).sum() / target[batch].pow(2).sum().clamp_min(1e-12)
        losses.append(_step(optimizer, loss, progress, "layer loss"))
    layer.to(dtype)
    return losses


def heal_lm(
    model,
    source,
    windows: torch.Tensor,
    steps: int,
    *,
    lr: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    progress: Progress | None = None,
    blocks: list[int] | None = None,
    checkpoint: str | None = None,
    checkpoint_every: int = 0,
    device: str = "cpu",
    fsdp: bool = False,
) -> list[float]:
    """End-to-end logit distillation of model (a DeaMoELM, in place) to source on token
    windows [W, L]; the FFNs' parts and routers train (those of `blocks`, default its DeaMoE
    blocks), everything else stays. Checkpointed, resumable, data-parallel or sharded: distill.py."""
    settings = DistillSettings(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every,
        device=device,
        fsdp=fsdp,
    )
    return distill_lm(model, source, windows, settings, blocks=blocks, progress=progress)
