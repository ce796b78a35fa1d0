"""Hand-built MoE blocks in the transformers 4.x layout (4.57 and earlier).

transformers 4.x cannot be installed beside the venv's 5.x, so these stand in for it:
the class names, attribute names and forward math of 4.57's blocks, written from their
behaviour (per-expert MLP ModuleLists, an nn.Linear router `gate`, routing
hyperparameters on the block; DeepSeek-V3's router a module that masks non-kept groups
with 0.0). test_hf.py::test_real_transformers4_blocks_match checks the importer against
a real 4.x install when one is pointed at.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class SwiGLUMLP(nn.Module):
    """gate_proj / up_proj / down_proj, as Qwen2MoeMLP, Qwen3MoeMLP and DeepseekV3MLP."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MixtralBlockSparseTop2MLP(nn.Module):
    """Mixtral's expert: w1 = gate, w3 = up, w2 = down."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(hidden, width, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


def _dispatch(x: torch.Tensor, experts: nn.ModuleList, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tokens, slots = torch.where(ids == e)
        out.index_add_(0, tokens, experts[e](x[tokens]) * weights[tokens, slots, None].to(x.dtype))
    return out


class _SoftmaxTopKBlock(nn.Module):
    def __init__(self, hidden: int, width: int, num_experts: int, top_k: int, norm_topk_prob: bool, expert_cls):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(expert_cls(hidden, width) for _ in range(num_experts))

    def route(self, x):
        """(expert ids [T, k], weights [T, k]) as the 4.x forward computes them."""
        probs = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        ids, weights = self.route(x)
        return _dispatch(x, self.experts, ids, weights).reshape(shape), self.gate(x)


class MixtralSparseMoeBlock(_SoftmaxTopKBlock):
    def __init__(self, hidden: int, width: int, num_experts: int, top_k: int):
        super().__init__(hidden, width, num_experts, top_k, True, MixtralBlockSparseTop2MLP)
        del self.norm_topk_prob  # Mixtral 4.x has no such attribute: it always renormalises
        self.jitter_noise = 0.0

    def route(self, x):
        probs = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        return ids, weights / weights.sum(dim=-1, keepdim=True)


class Qwen3MoeSparseMoeBlock(_SoftmaxTopKBlock):
    def __init__(self, hidden: int, width: int, num_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__(hidden, width, num_experts, top_k, norm_topk_prob, SwiGLUMLP)


class Qwen2MoeSparseMoeBlock(_SoftmaxTopKBlock):
    def __init__(self, hidden: int, width: int, num_experts: int, top_k: int, norm_topk_prob: bool, shared: int):
        super().__init__(hidden, width, num_experts, top_k, norm_topk_prob, SwiGLUMLP)
        self.shared_expert = SwiGLUMLP(hidden, shared)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        out, logits = super().forward(x)
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape), logits


class DeepseekV3TopkRouter(nn.Module):
    """4.x DeepSeek-V3 router: attributes n_routed_experts / n_group; non-kept groups masked with 0.0."""

    def __init__(self, hidden, num_experts, top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
        super().__init__()
        self.top_k = top_k
        self.n_routed_experts = num_experts
        self.routed_scaling_factor = routed_scaling_factor
        self.n_group = n_group
        self.topk_group = topk_group
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))

    @torch.no_grad()
    def get_topk_indices(self, scores):
        choice = scores + self.e_score_correction_bias[None]
        per_group = choice.view(-1, self.n_group, self.n_routed_experts // self.n_group)
        group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)
        kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(self.topk_group, dim=-1)[1], 1.0)
        kept = kept.bool().repeat_interleave(self.n_routed_experts // self.n_group, dim=1)
        return torch.topk(choice.masked_fill(~kept, 0.0), self.top_k, dim=-1)[1]

    def forward(self, hidden_states):
        logits = F.linear(hidden_states.reshape(-1, self.weight.shape[1]).float(), self.weight.float())
        scores = logits.sigmoid()
        ids = self.get_topk_indices(scores)
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return ids, weights * self.routed_scaling_factor


class DeepseekV3MoE(nn.Module):
    def __init__(self, hidden, width, num_experts, top_k, n_group, topk_group, n_shared, norm=True, scale=2.5):
        super().__init__()
        self.experts = nn.ModuleList(SwiGLUMLP(hidden, width) for _ in range(num_experts))
        self.gate = DeepseekV3TopkRouter(hidden, num_experts, top_k, n_group, topk_group, norm, scale)
        self.shared_experts = SwiGLUMLP(hidden, width * n_shared)

    def forward(self, hidden_states):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        ids, weights = self.gate(x)
        return (_dispatch(x, self.experts, ids, weights) + self.shared_experts(x)).reshape(shape)
