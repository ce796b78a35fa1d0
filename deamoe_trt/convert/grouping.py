"""Departments: which of a trained MoE's experts share a department.

`cluster` groups experts into D balanced groups of m by a similarity that mixes three
signals measured on the source layer:
- outputs: cosine between experts' outputs on the same calibration hidden states;
- weights: cosine between permutation-invariant weight summaries (down @ gate @ P and
  down @ up @ P, P a fixed random projection), since neurons have no order to compare;
- co-selection: how often tokens pick both experts (normalised), so that a token's experts
  tend to land in one department and department-first routing keeps the source's choices.
`coverage` starts from `cluster`'s groups and swaps experts between them while that raises
what department-first routing can keep of the source's choices: the mean over calibration
tokens of the source's routing weight inside the token's G heaviest departments.
`keep` takes the source's own order: consecutive blocks of m (DeepSeek-V3's groups when
D = n_group, the identity when D = 1).
"""

from __future__ import annotations

import torch

from ..routing import Routing
from .experts import ExpertWeights

# Hidden states used for output similarity (outputs of every expert on every one of them).
SIMILARITY_TOKENS = 128
PROJECTION = 64


def keep_groups(num_experts: int, num_departments: int) -> list[list[int]]:
    m = num_experts // num_departments
    return [list(range(j * m, (j + 1) * m)) for j in range(num_departments)]


@torch.no_grad()
def expert_similarity(experts: ExpertWeights, hidden: torch.Tensor, routing: Routing, *, seed: int = 0) -> torch.Tensor:
    """[N, N] similarity: (output cosine + weight cosine) / 2 + co-selection."""
    n, d = experts.num_experts, experts.hidden_size
    gen = torch.Generator().manual_seed(seed)
    projection = torch.randn(d, PROJECTION, generator=gen) / PROJECTION**0.5
    x = hidden[:SIMILARITY_TOKENS].float()
    outputs, summaries = [], []
    for e in range(n):
        gate, up, down = experts.expert(e)
        outputs.append((experts.forward(e, x) @ projection).flatten())
        summaries.append(torch.cat(((down @ (gate @ projection)).flatten(), (down @ (up @ projection)).flatten())))
    similarity = (_cosine(torch.stack(outputs)) + _cosine(torch.stack(summaries))) / 2
    return similarity + co_selection(routing, n)


def co_selection(routing: Routing, num_experts: int) -> torch.Tensor:
    """[N, N]: tokens picking both e1 and e2 / sqrt(tokens picking e1 * tokens picking e2)."""
    chosen = torch.zeros(routing.num_tokens, num_experts)
    chosen.scatter_(1, routing.expert_ids, 1.0)
    both = chosen.t() @ chosen
    counts = both.diagonal().clamp_min(1.0)
    return both / (counts[:, None] * counts[None, :]).sqrt()


def balanced_groups(similarity: torch.Tensor, num_departments: int, *, passes: int = 4) -> list[list[int]]:
    """D groups of m = N / D experts with a high total within-group similarity.

    Greedy seeding (the unassigned expert with the most similarity to the others, then its
    m - 1 most similar unassigned experts), then passes of pairwise swaps between groups
    that raise the total. Deterministic: ties go to the lower index."""
    n = similarity.shape[0]
    m = n // num_departments
    sim = similarity.double().clone()
    sim.fill_diagonal_(0.0)
    unassigned = list(range(n))
    groups: list[list[int]] = []
    while unassigned:
        pool = torch.tensor(unassigned)
        sub = sim[pool][:, pool]
        seed = unassigned[int(torch.argmax(sub.sum(1)))]
        group = [seed]
        unassigned.remove(seed)
        while len(group) < m:
            pool = torch.tensor(unassigned)
            gain = sim[pool][:, torch.tensor(group)].sum(1)
            best = unassigned[int(torch.argmax(gain))]
            group.append(best)
            unassigned.remove(best)
        groups.append(group)
    for _ in range(passes):
        if not _improve(groups, sim):
            break
    return sorted(sorted(g) for g in groups)


def kept_mass(routing: Routing, groups: list[list[int]], top_departments: int) -> float:
    """Mean over tokens of the source's routing weight on experts in the token's
    top_departments heaviest groups, as a share of its total weight."""
    department = torch.empty(sum(len(g) for g in groups), dtype=torch.long)
    for j, group in enumerate(groups):
        department[group] = j
    weights = routing.weights.detach().float()
    per_group = torch.zeros(routing.num_tokens, len(groups)).scatter_add_(1, department[routing.expert_ids], weights)
    kept = per_group.topk(top_departments, dim=1).values.sum(1)
    return float((kept / weights.sum(1).clamp_min(1e-12)).mean())


def coverage_groups(routing: Routing, groups: list[list[int]], top_departments: int) -> list[list[int]]:
    """groups after best-improving swaps of two experts between two groups, repeated while
    one raises kept_mass (deterministic: the first best swap in index order wins)."""
    groups = [list(g) for g in groups]
    best = kept_mass(routing, groups, top_departments)
    while True:
        found = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                for i in range(len(groups[a])):
                    for j in range(len(groups[b])):
                        groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
                        value = kept_mass(routing, groups, top_departments)
                        groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
                        if value > best + 1e-9:
                            best, found = value, (a, i, b, j)
        if found is None:
            return sorted(sorted(g) for g in groups)
        a, i, b, j = found
        groups[a][i], groups[b][j] = groups[b][j], groups[a][i]


def _improve(groups: list[list[int]], sim: torch.Tensor) -> bool:
    """One pass of best-improving swaps between every pair of groups; True if any swap happened."""
    changed = False
    for a in range(len(groups)):
        for b in range(a + 1, len(groups)):
            ga, gb = torch.tensor(groups[a]), torch.tensor(groups[b])
            # gain of swapping ga[i] with gb[j]: each joins the other's group minus the other.
            to_a = sim[gb][:, ga].sum(1)  # each of gb's similarity to group a
            to_b = sim[ga][:, gb].sum(1)
            own_a = sim[ga][:, ga].sum(1)
            own_b = sim[gb][:, gb].sum(1)
            gain = (to_b - own_a)[:, None] + (to_a - own_b)[None, :] - 2 * sim[ga][:, gb]
            best = torch.argmax(gain)
            i, j = divmod(int(best), len(groups[b]))
            if gain[i, j] > 1e-9:
                groups[a][i], groups[b][j] = groups[b][j], groups[a][i]
                changed = True
    return changed


def _cosine(rows: torch.Tensor) -> torch.Tensor:
    unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.t()
