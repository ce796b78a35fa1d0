"""One department's shared part and its experts' private parts, from aligned source experts.

Given the m source experts of a department, each already permuted so that neuron slot i
means the same thing in all of them (align.py):
- shared part: f_s slots, gate and up rows the usage-weighted mean over the experts. The
  slots chosen are those whose sharing costs least: sum over experts of usage x the
  neuron's importance x its distance from the mean neuron;
- private part of expert e: f_p of its other slots, its most important ones (all of them
  when f_p = f - f_s, the default), with its own gate and up rows;
- down projections: one least-squares fit, on calibration tokens routed to each expert
  (weighted by the source's routing weight), of Shared(x) + Private_e(x) to the source
  expert's output, ridge-regularised towards the starting point (mean down columns for the
  shared part, the expert's own columns for its private part). The private blocks couple
  only through the shared one, so the solve eliminates them (Schur complement) and costs
  O(f_s^3 + m f_p^3), not O((f_s + m f_p)^3).

Importance of a neuron: mean |activation| on its expert's routed calibration tokens times
the norm of its down column (its mean contribution to the output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .align import align, neuron_vectors
from .experts import ExpertWeights, neuron_activations


@dataclass(frozen=True)
class Method:
    """How a department is built; `aligned` is deamoe-trt's conversion, `naive` the baseline."""

    name: str
    align: bool  # permute neurons to match across experts before averaging
    select: str  # "importance": cheapest slots shared, most important kept; "index": first f_s shared
    weighted: bool  # average weighted by routing usage (else plain mean)
    fit: bool  # least-squares down projections (else averaged / copied columns)


ALIGNED = Method("aligned", align=True, select="importance", weighted=True, fit=True)
NAIVE = Method("naive", align=False, select="index", weighted=False, fit=False)


@dataclass
class DepartmentParts:
    """float32 weights and neuron biases: shared (gate [f_s, d], up [f_s, d], down [d, f_s],
    gate bias [f_s], up bias [f_s]) and per expert private (the same with f_p). A neuron's
    biases travel with its gate and up rows: averaged with them into a shared neuron, kept
    with them in a private one."""

    shared: tuple[torch.Tensor, ...] | None
    private: list[tuple[torch.Tensor, ...]]


@dataclass
class ExpertTokens:
    """Calibration tokens the source routed to one expert, with the routing weights."""

    x: torch.Tensor  # [T_e, d] float32
    weight: torch.Tensor  # [T_e] float32


def tokens_of(expert: int, hidden: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> ExpertTokens:
    tokens, slots = (expert_ids == expert).nonzero(as_tuple=True)
    return ExpertTokens(x=hidden[tokens].float(), weight=weights[tokens, slots].float())


def build_department(
    experts: ExpertWeights,
    members: list[int],
    tokens: list[ExpertTokens],
    shared_size: int,
    private_size: int,
    method: Method,
    *,
    ridge: float,
) -> DepartmentParts:
    """The department of source experts `members` (tokens[i] routed to members[i])."""
    f = experts.width
    weights = [(*experts.expert(e), *experts.neuron_biases(e)) for e in members]
    activations = [experts.activations(e, t.x) for e, t in zip(members, tokens, strict=True)]
    importance = [_importance(h, t.weight, w[2]) for h, t, w in zip(activations, tokens, weights, strict=True)]
    usage = torch.tensor([float(t.weight.sum()) for t in tokens]) + 1e-6
    usage = usage / usage.sum() if method.weighted else torch.full((len(members),), 1.0 / len(members))

    vectors = [neuron_vectors(*w[:3]) for w in weights] if shared_size and method.select == "importance" else None
    if shared_size and method.align and len(members) > 1:
        perms = align(vectors, usage)
    else:
        perms = [torch.arange(f) for _ in members]
    vectors = [v[p] for v, p in zip(vectors, perms, strict=True)] if vectors else None
    aligned = [_neurons(w, p) for w, p in zip(weights, perms, strict=True)]
    importance = [imp[p] for imp, p in zip(importance, perms, strict=True)]
    activations = [h[:, p] for h, p in zip(activations, perms, strict=True)]

    mean = tuple(sum(w * part[i] for w, part in zip(usage.tolist(), aligned, strict=True)) for i in range(5))
    shared_slots, private_slots = _choose_slots(vectors, mean, importance, usage, shared_size, private_size, method)
    shared = _neurons(mean, shared_slots) if shared_size else None
    private = [_neurons(w, s) for w, s in zip(aligned, private_slots, strict=True)]

    exact = shared_size == 0 and private_size == f
    if method.fit and not exact:
        shared_features = [neuron_activations(t.x, shared, experts.config) for t in tokens] if shared else None
        private_features = [h[:, s] for h, s in zip(activations, private_slots, strict=True)]
        targets = [h @ w[2].t() for h, w in zip(activations, aligned, strict=True)]
        shared_down, private_downs = fit_downs(
            shared_features,
            private_features,
            targets,
            [t.weight for t in tokens],
            shared[2] if shared else None,
            [p[2] for p in private],
            ridge=ridge,
        )
        if shared:
            shared = _with_down(shared, shared_down)
        private = [_with_down(p, dn) for p, dn in zip(private, private_downs, strict=True)]
    return DepartmentParts(shared=shared, private=private)


def _neurons(part: tuple[torch.Tensor, ...], slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The neurons `slots` of part = (gate, up, down, gate bias, up bias)."""
    gate, up, down, gate_bias, up_bias = part
    return gate[slots], up[slots], down[:, slots], gate_bias[slots], up_bias[slots]


def _with_down(part: tuple[torch.Tensor, ...], down: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (part[0], part[1], down, *part[3:])


def _importance(activations: torch.Tensor, weight: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """[f]: routing-weighted mean |h_i| times ||down[:, i]||; zeros for an expert no token chose."""
    if activations.shape[0] == 0:
        return torch.zeros(down.shape[1])
    mean_abs = (activations.abs() * weight[:, None]).sum(0) / weight.sum().clamp_min(1e-12)
    return mean_abs * down.norm(dim=0)


def _choose_slots(vectors, mean, importance, usage, shared_size, private_size, method):
    f = mean[0].shape[0]
    if method.select == "index" or not shared_size:
        shared = torch.arange(shared_size)
        private = [torch.arange(shared_size, shared_size + private_size) for _ in importance]
        if method.select == "importance":  # no sharing: each expert keeps its most important neurons
            return shared, [
                torch.sort(torch.sort(imp, descending=True, stable=True).indices[:private_size]).values
                for imp in importance
            ]
        return shared, private
    template = neuron_vectors(*mean[:3])
    cost = torch.zeros(f)
    for w, v, imp in zip(usage.tolist(), vectors, importance, strict=True):
        # Importance of an unused expert is 0; give its neurons a floor so they still count.
        cost += w * (imp + 1e-6) * (v - template).norm(dim=1)
    shared = torch.sort(torch.sort(cost, stable=True).indices[:shared_size]).values
    rest = torch.ones(f, dtype=torch.bool)
    rest[shared] = False
    private = []
    for imp in importance:
        candidates = rest.nonzero().squeeze(1)
        order = torch.sort(imp[candidates], descending=True, stable=True).indices[:private_size]
        private.append(torch.sort(candidates[order]).values)
    return shared, private


def fit_downs(
    shared_features: list[torch.Tensor] | None,
    private_features: list[torch.Tensor],
    targets: list[torch.Tensor],
    weights: list[torch.Tensor],
    shared_start: torch.Tensor | None,
    private_starts: list[torch.Tensor],
    *,
    ridge: float,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Weighted ridge least squares for the down projections of one department.

    Minimises sum_e sum_t w_t ||Ds hs_t + Dp_e hp_t - y_t||^2 + lam (||Ds - Ds0||^2 + sum_e
    ||Dp_e - Dp_e0||^2), lam = ridge x the mean diagonal of the normal equations. Returns
    (Ds [d, f_s] or None, [Dp_e [d, f_p]])."""
    k_s = shared_start.shape[1] if shared_start is not None else 0
    blocks = []  # per expert: C_e, B_e, r_e in float64
    trace, size = 0.0, k_s
    a = torch.zeros(k_s, k_s, dtype=torch.float64)
    r_s = torch.zeros(k_s, targets[0].shape[1], dtype=torch.float64)
    for e, (hp, y, w) in enumerate(zip(private_features, targets, weights, strict=True)):
        hp, y, w = hp.double(), y.double(), w.double()[:, None]
        c = hp.t() @ (w * hp)
        r_e = hp.t() @ (w * y)
        b = None
        if k_s:
            assert shared_features is not None  # k_s > 0: the shared part has features
            hs = shared_features[e].double()
            a += hs.t() @ (w * hs)
            r_s += hs.t() @ (w * y)
            b = hs.t() @ (w * hp)
        blocks.append((c, b, r_e))
        trace += float(c.diagonal().sum())
        size += c.shape[0]
    trace += float(a.diagonal().sum())
    lam = ridge * trace / max(size, 1) + 1e-12

    solved: list[torch.Tensor | None] = []  # per expert: (C_e + lam)^-1 applied to [B_e^T | r_e']
    for (c, b, r_e), start in zip(blocks, private_starts, strict=True):
        if c.shape[0] == 0:
            solved.append(None)
            continue
        c_reg = c + lam * torch.eye(c.shape[0], dtype=torch.float64)
        rhs = r_e + lam * start.double().t()
        cols = [rhs] + ([b.t()] if b is not None else [])
        solved.append(torch.linalg.solve(c_reg, torch.cat(cols, dim=1)))

    shared_down = None
    if k_s:
        schur = a + lam * torch.eye(k_s, dtype=torch.float64)
        rhs_s = r_s + lam * shared_start.double().t()
        d = rhs_s.shape[1]
        for (_, b, _), sol in zip(blocks, solved, strict=True):
            if sol is None:
                continue
            schur -= b @ sol[:, d:]
            rhs_s -= b @ sol[:, :d]
        ds_t = torch.linalg.solve(schur, rhs_s)  # [f_s, d]
        shared_down = ds_t.t().float().contiguous()
    private_downs = []
    for sol, start in zip(solved, private_starts, strict=True):
        if sol is None:
            private_downs.append(start)
            continue
        d = targets[0].shape[1]
        dp_t = sol[:, :d] - (sol[:, d:] @ ds_t if k_s else 0)
        private_downs.append(dp_t.t().float().contiguous())
    return shared_down, private_downs


def merge_department(
    experts: ExpertWeights, members: list[int], tokens: list[ExpertTokens], width: int, *, ridge: float
) -> DepartmentParts:
    """The published-style alternative: the department's experts merged into one expert of
    `width` neurons (M-SMoE / Sub-MoE style merging of a cluster, widened to the converted
    layer's bytes per step). Its neurons are the most important of all members' neurons
    (importance x the expert's usage), its down projection fitted by least squares to each
    member's output on that member's tokens."""
    weights = [experts.expert(e) for e in members]
    usage = torch.tensor([float(t.weight.sum()) for t in tokens]) + 1e-6
    usage = usage / usage.sum()
    candidates = []  # (score, expert slot, neuron)
    for slot, (e, t) in enumerate(zip(members, tokens, strict=True)):
        imp = _importance(experts.activations(e, t.x), t.weight, weights[slot][2])
        candidates += [(-float(usage[slot] * (v + 1e-6)), slot, i) for i, v in enumerate(imp.tolist())]
    chosen = sorted(sorted(candidates)[:width], key=lambda c: (c[1], c[2]))
    gate = torch.stack([weights[s][0][i] for _, s, i in chosen])
    up = torch.stack([weights[s][1][i] for _, s, i in chosen])
    down = torch.stack([usage[s] * weights[s][2][:, i] for _, s, i in chosen], dim=1)
    # Start from the usage-weighted sum of the kept neurons (what the merge is without data).
    # A merged department has no private part, so its layer cannot be biased (ffn_bias needs
    # f_p >= 1): its neurons have no biases.
    merged = (gate, up, down, torch.zeros(width), torch.zeros(width))
    features = [neuron_activations(t.x, merged, experts.config) for t in tokens]
    targets = [experts.forward(e, t.x) for e, t in zip(members, tokens, strict=True)]
    empty = [torch.zeros(t.x.shape[0], 0) for t in tokens]
    starts = [torch.zeros(down.shape[0], 0) for _ in tokens]
    fitted, _ = fit_downs(features, empty, targets, [t.weight for t in tokens], down, starts, ridge=ridge)
    return DepartmentParts(shared=_with_down(merged, fitted), private=[])
