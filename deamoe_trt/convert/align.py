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

Neurons = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # gate [f, d], up [f, d], down [d, f]


def neuron_vectors(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """[f, 3d]: each neuron's gate row, up row and down column, each part unit-normalised
    so that no projection dominates the match."""
    parts = [gate, up, down.t()]
    return torch.cat([p / p.norm(dim=1, keepdim=True).clamp_min(1e-12) for p in parts], dim=1)


def match(vectors: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """perm [f] with vectors[perm[i]] matched to template[i] (maximum total similarity)."""
    similarity = (template @ vectors.t()).double().numpy()
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return torch.as_tensor(cols[rows.argsort()], dtype=torch.long)


def align(experts: list[Neurons], usage: torch.Tensor, *, rounds: int = 2) -> list[torch.Tensor]:
    """One permutation per expert so that its neuron perm[i] is every other expert's neuron
    perm'[i]. usage [m]: each expert's share of the department's routing (weights the template)."""
    f = experts[0][0].shape[0]
    vectors = [neuron_vectors(*e) for e in experts]
    reference = int(torch.argmax(usage))
    perms = [torch.arange(f) for _ in experts]
    template = vectors[reference]
    for _ in range(rounds):
        perms = [torch.arange(f) if v is template else match(v, template) for v in vectors]
        template = sum(w * v[p] for w, v, p in zip(usage.tolist(), vectors, perms, strict=True))
    return perms
