"""Convert one trained vanilla MoE layer into a DeaMoE layer (spec, "Converted layers").

The router rows of the source experts stay (permuted with the experts into their
departments); each expert of width f becomes f_s shared + f_p private neurons, f_p = f - f_s
unless asked otherwise. With D = 1 and f_s = 0 the conversion is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import DEPARTMENT_SCORES, DeaMoEConfig
from ..console import Progress
from ..errors import UsageError
from ..layer import DeaMoELayer
from ..routing import Routing, route
from . import grouping
from .department_fit import ALIGNED, NAIVE, DepartmentParts, build_department, merge_department, tokens_of
from .experts import ExpertWeights

GROUPINGS = ("cluster", "coverage", "keep")
METHODS = ("aligned", "naive", "merged")
# Fewer calibration tokens per expert than this and the fits are mostly the ridge's prior.
MIN_TOKENS_PER_EXPERT = 8


@dataclass(frozen=True)
class ConvertSettings:
    """What `deamoe-trt convert` asks for. shared_size wins over shared_fraction."""

    departments: int
    top_departments: int
    shared_size: int | None = None
    shared_fraction: float | None = None
    private_size: int | None = None
    grouping: str = "cluster"
    department_score: str | None = None  # None: the one that best keeps the source's expert choices
    heal_steps: int = 0
    heal_lr: float = 1e-3
    heal_batch: int = 8  # windows per end-to-end step, over all processes
    heal_checkpoint: str | None = None  # a folder for end-to-end healing checkpoints
    heal_checkpoint_every: int = 0
    heal_device: str = "cpu"
    heal_fsdp: bool = False  # shard the healed blocks over the processes (convert/sharding.py)
    ridge: float = 1e-3
    seed: int = 0

    def sizes(self, width: int) -> tuple[int, int]:
        """(f_s, f_p) for source experts of width f; a one-line UsageError if impossible."""
        if self.shared_size is not None:
            shared = self.shared_size
        elif self.shared_fraction is not None:
            if not 0 <= self.shared_fraction < 1:
                raise UsageError(f"--shared-fraction must be in [0, 1), got {self.shared_fraction}")
            shared = round(self.shared_fraction * width)
        else:
            raise UsageError("give --shared-size F_S or --shared-fraction")
        if not 0 <= shared < width:
            raise UsageError(f"shared size {shared} must be >= 0 and below the expert width {width}")
        private = width - shared if self.private_size is None else self.private_size
        if not 0 <= private <= width - shared:
            raise UsageError(f"private size {private} must be in [0, {width - shared}] (expert width {width} - f_s)")
        if shared == 0 and private == 0:
            raise UsageError("shared and private sizes are both 0")
        return shared, private

    def check(self, source: DeaMoEConfig) -> None:
        if self.grouping not in GROUPINGS:
            raise UsageError(f"grouping must be one of {', '.join(GROUPINGS)}, got {self.grouping!r}")
        if source.shared_intermediate_size:
            raise UsageError(
                f"the source already has department shared parts (f_s = {source.shared_intermediate_size}); "
                "convert takes a vanilla MoE (f_s = 0), e.g. an imported Hugging Face model"
            )
        n = source.num_experts
        if self.departments < 1 or n % self.departments:
            raise UsageError(f"--departments {self.departments} must divide the source's {n} experts")
        if self.department_score is not None and self.department_score not in DEPARTMENT_SCORES:
            raise UsageError(f"department score must be one of {', '.join(DEPARTMENT_SCORES)}")
        if self.grouping == "keep" and source.num_departments not in (1, self.departments):
            raise UsageError(
                f"--grouping keep needs --departments {source.num_departments} (the source's own groups) "
                f"or a one-department source, got {self.departments}"
            )
        self.sizes(source.expert_intermediate_size)
        self.target_config(source, source.expert_intermediate_size, self.department_score or "max")

    def target_config(self, source: DeaMoEConfig, width: int, score: str) -> DeaMoEConfig:
        shared, private = self.sizes(width)
        return source.replace(
            num_departments=self.departments,
            experts_per_department=source.num_experts // self.departments,
            shared_intermediate_size=shared,
            private_intermediate_size=private,
            top_departments=self.top_departments,
            department_score=score,
        )


@dataclass
class LayerConversion:
    """A converted layer and how it was made. order[i] = the source expert that became expert i."""

    layer: DeaMoELayer
    order: torch.Tensor
    method: str
    agreement_by_score: dict[str, float] = field(default_factory=dict)

    @property
    def department_score(self) -> str:
        return self.layer.config.department_score


@torch.no_grad()
def convert_layer(
    source: DeaMoELayer,
    hidden: torch.Tensor,
    settings: ConvertSettings,
    *,
    method: str = "aligned",
    order: torch.Tensor | None = None,
    merged_width: int | None = None,
    progress: Progress | None = None,
) -> LayerConversion:
    """Convert source on calibration hidden states [T, d].

    method: "aligned" (deamoe-trt's conversion), "naive" (source order, no alignment, plain
    mean of the first f_s neurons, no fit) or "merged" (each department one merged expert of
    `merged_width` neurons, f_p = 0). order: reuse a grouping (e.g. the aligned one's)."""
    settings.check(source.config)
    if method not in METHODS:
        raise UsageError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    experts = ExpertWeights.of(source)
    c = source.config
    m = c.num_experts // settings.departments
    check_calibration(hidden, c)
    x = hidden.reshape(-1, c.hidden_size).float()
    routing = source.route(x)

    if order is None:
        order = plan_order(source, x, settings, routing=routing, naive=method == "naive")
    width = experts.width
    config = settings.target_config(c, width, "max")
    if method == "merged":
        if merged_width is None:
            raise UsageError("the merged alternative needs merged_width")
        config = config.replace(shared_intermediate_size=merged_width, private_intermediate_size=0)
    router_weight = source.router.weight.detach()[order]
    router_bias = source.router.bias.detach()[order] if source.router.bias is not None else None
    logit_bias = source.router.logit_bias.detach()[order] if source.router.logit_bias is not None else None
    if method == "naive":
        score = settings.department_score or c.department_score
        if score == "sum_top2" and m < 2:
            score = "max"
        agreement = {
            score: expert_agreement(
                routing,
                route(x, router_weight, router_bias, config.replace(department_score=score), logit_bias=logit_bias),
                order,
            )
        }
    else:
        agreement = score_agreement(routing, x, router_weight, router_bias, config, order, logit_bias=logit_bias)
        score = settings.department_score or max(agreement, key=lambda s: (agreement[s], -DEPARTMENT_SCORES.index(s)))
    config = config.replace(department_score=score)

    layer = DeaMoELayer(config, dtype=source.dtype, device=source.router.weight.device)
    layer.router.weight.copy_(router_weight)
    if router_bias is not None:
        layer.router.bias.copy_(router_bias)
    if logit_bias is not None:
        layer.router.logit_bias.copy_(logit_bias)
    if source.experts.down_bias is not None:  # each expert keeps its own down bias
        layer.experts.down_bias.copy_(source.experts.down_bias.detach()[order])
    if source.shared_experts is not None:
        layer.shared_experts.load_state_dict(source.shared_experts.state_dict())
    build = {"aligned": ALIGNED, "naive": NAIVE}.get(method)
    for j in range(settings.departments):
        members = order[j * m : (j + 1) * m].tolist()
        tokens = [tokens_of(e, x, routing.expert_ids, routing.weights) for e in members]
        if method == "merged":
            parts = merge_department(experts, members, tokens, merged_width, ridge=settings.ridge)
        else:
            parts = build_department(
                experts,
                members,
                tokens,
                config.shared_intermediate_size,
                config.private_intermediate_size,
                build,
                ridge=settings.ridge,
            )
        _place(layer, j, m, parts)
        if progress is not None:
            progress.update(f"{method}: department {j + 1}/{settings.departments}")
    return LayerConversion(layer=layer, order=order, method=method, agreement_by_score=agreement)


def plan_order(
    source: DeaMoELayer,
    hidden: torch.Tensor,
    settings: ConvertSettings,
    *,
    routing: Routing | None = None,
    naive: bool = False,
) -> torch.Tensor:
    """order[i] = the source expert that becomes expert i (department i // m)."""
    n = source.config.num_experts
    if naive or settings.grouping == "keep" or settings.departments == 1:
        groups = grouping.keep_groups(n, settings.departments)
    else:
        x = hidden.reshape(-1, source.config.hidden_size).float()
        routing = routing if routing is not None else source.route(x)
        similarity = grouping.expert_similarity(ExpertWeights.of(source), x, routing, seed=settings.seed)
        groups = grouping.balanced_groups(similarity, settings.departments)
        if settings.grouping == "coverage":
            groups = grouping.coverage_groups(routing, groups, settings.top_departments)
    return torch.tensor([e for g in groups for e in g])


def check_calibration(hidden: torch.Tensor, config: DeaMoEConfig) -> None:
    if hidden.shape[-1] != config.hidden_size:
        raise UsageError(f"calibration hidden states have size {hidden.shape[-1]}, the layer {config.hidden_size}")
    tokens = hidden.numel() // config.hidden_size
    need = MIN_TOKENS_PER_EXPERT * config.num_experts // config.top_k
    if tokens < need:
        raise UsageError(
            f"calibration is too short: {tokens} tokens, need at least {need} "
            f"({MIN_TOKENS_PER_EXPERT} per expert on average for {config.num_experts} experts, top-{config.top_k})"
        )
    if not bool(torch.isfinite(hidden).all()):
        raise UsageError("calibration hidden states contain NaN or Inf")


def _place(layer: DeaMoELayer, department: int, m: int, parts: DepartmentParts) -> None:
    placed = [(layer.departments, department, parts.shared)] if parts.shared is not None else []
    placed += [(layer.experts, department * m + i, part) for i, part in enumerate(parts.private)]
    for group, index, (gate, up, down, gate_bias, up_bias) in placed:
        group.gate_up[index].copy_(torch.cat((gate, up)))
        group.down[index].copy_(down)
        if group.gate_up_bias is not None:
            group.gate_up_bias[index].copy_(torch.cat((gate_bias, up_bias)))


def score_agreement(
    source_routing: Routing,
    x: torch.Tensor,
    router_weight: torch.Tensor,
    router_bias: torch.Tensor | None,
    config: DeaMoEConfig,
    order: torch.Tensor,
    *,
    logit_bias: torch.Tensor | None = None,
) -> dict[str, float]:
    """Expert-set agreement with the source for each department score the config allows."""
    scores = [s for s in DEPARTMENT_SCORES if not (s == "sum_top2" and config.experts_per_department < 2)]
    return {
        s: expert_agreement(
            source_routing,
            route(x, router_weight, router_bias, config.replace(department_score=s), logit_bias=logit_bias),
            order,
        )
        for s in scores
    }


def expert_agreement(source: Routing, converted: Routing, order: torch.Tensor) -> float:
    """Mean over tokens of |source experts & converted experts| / k, converted ids mapped
    back to source ids through order."""
    n = order.numel()
    mapped = order.to(converted.expert_ids.device)[converted.expert_ids]
    a = torch.zeros(source.num_tokens, n).scatter_(1, source.expert_ids, 1.0)
    b = torch.zeros(converted.num_tokens, n).scatter_(1, mapped, 1.0)
    return float((a * b).sum(1).mean() / source.expert_ids.shape[1])


def weight_kept(source: Routing, converted: Routing, order: torch.Tensor) -> float:
    """Mean over tokens of the share of the source's routing weight on experts the converted
    routing also keeps (converted ids mapped back to source ids through order): what
    department-first routing keeps of the source's choices, each weighed as the source does."""
    n = order.numel()
    mapped = order.to(converted.expert_ids.device)[converted.expert_ids]
    weights = torch.zeros(source.num_tokens, n).scatter_(1, source.expert_ids, source.weights.detach().float())
    kept = torch.zeros(converted.num_tokens, n).scatter_(1, mapped, 1.0)
    return float(((weights * kept).sum(1) / weights.sum(1).clamp_min(1e-12)).mean())
