"""Neuron alignment across the experts of one department.

A SwiGLU expert computes sum_i down[:, i] * silu(gate_i . x) * (up_i . x): its neurons can
be listed in any order. Two experts that learned similar neurons list them differently, so
before averaging we permute each expert's neurons to match a template: maximum total
cosine similarity of the neurons' concatenated (gate row, up row, down column), a linear
assignment (Hungarian, scipy's linear_sum_assignment). The template starts as the
department's most used expert and is then the usage-weighted mean of the aligned experts,
matched again once (as in Git Re-Basin / ZipIt-style merging).
"""

from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment

# Above this hidden size, neurons are compared through a fixed random projection of each
# part to PROJECTED dims (Johnson-Lindenstrauss: cosines kept to about 1/sqrt(PROJECTED)),
# which makes matching a 2048-wide model's experts about 5x cheaper.
PROJECT_ABOVE = 512
PROJECTED = 256


def neuron_vectors(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """[f, 3d] (or [f, 3 * PROJECTED]): each neuron's gate row, up row and down column, each
    part unit-normalised so that no projection dominates the match."""
    parts = [gate, up, down.t()]
    d = gate.shape[1]
    if d > PROJECT_ABOVE:
        gen = torch.Generator().manual_seed(d)
        parts = [p @ torch.randn(d, PROJECTED, generator=gen) for p in parts]
    return torch.cat([p / p.norm(dim=1, keepdim=True).clamp_min(1e-12) for p in parts], dim=1)


def match(vectors: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """perm [f] with vectors[perm[i]] matched to template[i] (maximum total similarity)."""
    similarity = (template @ vectors.t()).double().numpy()
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return torch.as_tensor(cols[rows.argsort()], dtype=torch.long)


def align(vectors: list[torch.Tensor], usage: torch.Tensor, *, rounds: int = 2) -> list[torch.Tensor]:
    """One permutation per expert so that its neuron perm[i] is every other expert's neuron
    perm'[i]. vectors: each expert's neuron_vectors; usage [m]: each expert's share of the
    department's routing (weights the template)."""
    f = vectors[0].shape[0]
    perms: list[torch.Tensor] = []
    reference = int(torch.argmax(usage))
    template = vectors[reference]
    for _ in range(rounds):
        perms = [torch.arange(f) if v is template else match(v, template) for v in vectors]
        template = sum(w * v[p] for w, v, p in zip(usage.tolist(), vectors, perms, strict=True))
    return perms
