"""Department-then-expert routing: the one implementation of the spec's routing math.

Everything else (the layer, the ONNX forms, the CUDA kernels' tests, the benchmarks'
byte counts) calls these functions or is tested against them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DeaMoEConfig

# Added to the sum of kept scores before normalising, as DeepSeek-V3 does (spec step 5).
NORM_EPS = 1e-20


@dataclass(frozen=True)
class Routing:
    """Per-token routing decisions for T tokens.

    expert_ids:     [T, k] int64, kept experts, best selection score first (ties: lower id).
    weights:        [T, k] float32, w_e of each kept expert (spec step 5).
    department_ids: [T, k] int64, department of each kept expert (expert_id // m).
    kept_departments: [T, g] int64, stage-1 departments, best first. A kept department
        that received no expert in stage 2 appears here but not in department_ids.
    scores:         [T, N] float32, s (softmax or sigmoid of the logits).
    """

    expert_ids: torch.Tensor
    weights: torch.Tensor
    department_ids: torch.Tensor
    kept_departments: torch.Tensor
    scores: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.expert_ids.shape[0]

    def department_weights(self, num_departments: int) -> torch.Tensor:
        """[T, D] float32: W_j, the sum of w_e over the token's kept experts in department j."""
        out = torch.zeros(self.num_tokens, num_departments, dtype=torch.float32, device=self.weights.device)
        return out.scatter_add_(1, self.department_ids, self.weights)

    def expert_tokens(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens that kept `expert` (ascending) and the weight w_e each gives it."""
        tokens, slots = (self.expert_ids == expert).nonzero(as_tuple=True)
        return tokens, self.weights[tokens, slots]

    def department_tokens(self, department: int, department_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens with a kept expert in `department` (ascending) and their W_j, given
        department_weights() (computed once per batch by the caller)."""
        tokens = (self.department_ids == department).any(dim=-1).nonzero().squeeze(-1)
        return tokens, department_weights[tokens, department]

    def used_experts(self) -> torch.Tensor:
        """Distinct experts kept by any token of the batch, ascending."""
        return torch.unique(self.expert_ids)

    def used_departments(self) -> torch.Tensor:
        """Distinct departments holding at least one kept expert over the batch, ascending."""
        return torch.unique(self.department_ids)


def router_logits(
    hidden: torch.Tensor, router_weight: torch.Tensor, logit_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """z = x Wr^T (+ b_z) in float32, whatever the dtype of x and Wr (spec step 1; b_z is the
    optional router.logit_bias of "Router logit bias")."""
    logits = hidden.reshape(-1, hidden.shape[-1]).float() @ router_weight.float().t()
    return logits if logit_bias is None else logits + logit_bias.float()


def route(
    hidden: torch.Tensor,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor | None,
    config: DeaMoEConfig,
    *,
    logit_bias: torch.Tensor | None = None,
) -> Routing:
    """Route every token of hidden ([..., d]) to its departments and experts."""
    return route_logits(router_logits(hidden, router_weight, logit_bias), router_bias, config)


def route_logits(logits: torch.Tensor, router_bias: torch.Tensor | None, config: DeaMoEConfig) -> Routing:
    """Spec steps 1-5 from router logits [T, N]."""
    num_tokens, num_experts = logits.shape
    if num_experts != config.num_experts:
        raise ValueError(f"router logits have {num_experts} experts, config has {config.num_experts}")
    scores, selection = selection_scores(logits, router_bias, config)
    # Non-finite tokens (spec extension "Non-finite tokens"): a token with any NaN or
    # infinite selection score (a NaN in its hidden state; a +inf logit under softmax)
    # chooses as if all its scores tied: the lowest-index g departments, then the
    # lowest-index k experts of those, i.e. experts 0..k-1. Its weights stay what the
    # math gives (NaN for softmax), so its output is NaN; other tokens are untouched.
    selection = selection.masked_fill(~torch.isfinite(selection).all(dim=-1, keepdim=True), 0.0)

    kept_departments = top_indices(department_scores(selection, config), config.top_departments)

    kept = torch.zeros(num_tokens, config.num_departments, dtype=torch.bool, device=logits.device)
    kept.scatter_(1, kept_departments, True)
    candidates = selection.masked_fill(~kept.repeat_interleave(config.experts_per_department, dim=1), -torch.inf)
    expert_ids = top_indices(candidates, config.top_k)

    weights = scores.gather(1, expert_ids)
    if config.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + NORM_EPS)
    weights = weights * config.routed_scaling_factor
    return Routing(
        expert_ids=expert_ids,
        weights=weights,
        department_ids=expert_ids // config.experts_per_department,
        kept_departments=kept_departments,
        scores=scores,
    )


def selection_scores(
    logits: torch.Tensor, router_bias: torch.Tensor | None, config: DeaMoEConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, selection scores) [T, N] in float32: softmax or sigmoid of the logits (spec
    step 2), plus the selection bias when there is one (it chooses, it does not weigh)."""
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if config.score_func == "softmax" else torch.sigmoid(logits)
    return scores, scores if router_bias is None else scores + router_bias.float()


def department_scores(selection: torch.Tensor, config: DeaMoEConfig) -> torch.Tensor:
    """[T, D] each department's score from its experts' selection scores [T, N] (spec step 3)."""
    per_department = selection.view(-1, config.num_departments, config.experts_per_department)
    if config.department_score == "max":
        return per_department.amax(dim=-1)
    if config.department_score == "sum_top2":
        return per_department.topk(2, dim=-1).values.sum(dim=-1)
    return per_department.sum(dim=-1)


def top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values along the last dim, best first, ties to the lower index.

    torch.topk does not promise which of equal values wins; a stable descending sort does.
    """
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


# The load-balancing term's weight in training loss (train-tiny, `train`, the transformers
# model's router_aux_loss_coef): small, so cross-entropy leads.
LOAD_BALANCE_COEF = 0.01


def load_balance_loss(routing: Routing, num_experts: int) -> torch.Tensor:
    """The Switch-Transformer load-balancing term of one layer's routing: num_experts *
    sum_e f_e * P_e, f_e the share of routing slots expert e got, P_e its mean score."""
    counts = torch.zeros(num_experts, device=routing.scores.device)
    counts.scatter_add_(0, routing.expert_ids.reshape(-1), torch.ones(routing.expert_ids.numel(), device=counts.device))
    share = counts / counts.sum()
    return num_experts * (share * routing.scores.mean(0)).sum()
