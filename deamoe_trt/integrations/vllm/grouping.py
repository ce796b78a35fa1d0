"""The spec's two-stage routing as two grouped-expert problems, the form vLLM's FusedMoE runs.

A DeaMoE FFN is y = sum_j W_j S_j(x) + sum_e w_e P_e(x): department shared parts S_j weighted
by W_j (the sum of the token's kept-expert weights in department j) and expert private parts
P_e weighted by w_e (deamoe_trt.routing). Each sum is a top-k grouped GEMM:

- experts: N groups, the token's k kept experts and their weights, as routed;
- departments: D groups, min(g, k) slots per token: the departments that hold one of its kept
  experts. A department kept in stage 1 that received no expert has W_j = 0 and gets no slot,
  so its shared part is neither loaded nor computed for that token. A token whose experts fall
  in fewer departments than it has slots fills the rest with its first department at weight 0
  (a grouped GEMM takes a fixed number of slots per token): no other department is touched.

Both are pure functions of a `Routing`, so they are tested against the layer's own
forward_routed here without vLLM (tests/integrations/vllm/test_grouping.py).
"""

from __future__ import annotations

import torch

from ...config import DeaMoEConfig
from ...routing import Routing


def department_slots_per_token(config: DeaMoEConfig) -> int:
    """The most departments a token's kept experts can fall in: min(g, k)."""
    return min(config.top_departments, config.top_k)


def expert_slots(routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int32) of the private parts' grouped GEMM."""
    return routing.weights.float(), routing.expert_ids.to(torch.int32)


def department_slots(routing: Routing, config: DeaMoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, s] float32, department ids [T, s] int32), s = min(g, k), of the shared
    parts' grouped GEMM; see the module docstring for the padding slots."""
    slots = department_slots_per_token(config)
    num_tokens = routing.num_tokens
    department_weights = routing.department_weights(config.num_departments)
    holds = torch.zeros(num_tokens, config.num_departments, dtype=torch.bool, device=routing.weights.device)
    holds.scatter_(1, routing.department_ids, True)
    # Departments holding an expert first (ascending id among them), then the others.
    order = torch.sort(holds.to(torch.int8), dim=-1, descending=True, stable=True).indices[:, :slots]
    used = holds.gather(1, order)
    ids = torch.where(used, order, order[:, :1])
    weights = torch.where(used, department_weights.gather(1, order), torch.zeros((), device=order.device))
    return weights.float(), ids.to(torch.int32)
