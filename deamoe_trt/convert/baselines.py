"""The alternatives a user would try instead of converting, each sized to the converted
model's bytes per one-token decoding step (one function per alternative).

- pruned experts: every expert keeps its w most important neurons (importance as in department_fit.py),
  down projection refitted by least squares; the source's routing;
- pruned, then converted: the pruned experts (width w) converted with the conversion's
  settings, its f_s scaled by w / f (f_p the rest), in the converted model's departments (a smaller
  model than the rest: it is not sized to the converted model's bytes);
- lower top-k: the source's experts and router with k' < k, the kept weights renormalised;
- low-rank delta (D2-MoE's structure): per department a base expert (usage-weighted mean of
  its aligned experts) and per expert a rank-r delta of gate, up and down, from an
  activation-whitened SVD (the truncation that minimises the error on the expert's own
  calibration inputs); routed department-first like the converted model ("department
  bases"), or with one base per layer and the source's own routing ("1 base", D2-MoE as
  published).

How bytes count: pruned experts and lower top-k are DeaMoE layers, counted by
deamoe_trt.traffic as they are. A low-rank-delta step reads the router (and any always-on
shared experts) as traffic counts them, the base of every department it uses (3 d f
weights) and per expert used its factors (3 r (d + f) weights) and biases. Each size is the
largest whose bytes per step, summed over layers and measured on the held-out routing the
report uses, do not exceed the converted model's: within one neuron per kept expert
(pruned), one expert (top-k) or one rank per kept expert (delta) of it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ..activation import glu
from ..config import DeaMoEConfig
from ..layer import DeaMoELayer, Router
from ..routing import Routing, route
from ..traffic import BYTES_PER_WEIGHT, ffn_bytes, weights_loaded
from .align import align, neuron_vectors
from .core import ConvertSettings, convert_layer
from .department_fit import tokens_of
from .experts import ExpertWeights
from .metrics import layer_step_bytes, step_bytes, steps, subset

PRUNED, TOP_K, DELTA, DELTA_ONE = "pruned experts", "lower top-k", "low-rank delta", "low-rank delta, 1 base"
PRUNED_CONVERTED = "pruned, then converted"
BASELINES = (PRUNED, PRUNED_CONVERTED, TOP_K, DELTA, DELTA_ONE)
# Relative ridge added to a whitening covariance (keeps unused directions finite).
WHITEN_RIDGE = 1e-4


@dataclass
class Baseline:
    name: str
    layers: list[nn.Module]
    orders: list[torch.Tensor]
    detail: dict = field(default_factory=dict)


# Pruned experts ------------------------------------------------------------------------


@torch.no_grad()
def pruned_layer(source: DeaMoELayer, hidden: torch.Tensor, width: int, *, ridge: float = 1e-3) -> DeaMoELayer:
    """source with every expert narrowed to its `width` most important neurons and its down
    projection refitted on its routed calibration tokens; routing unchanged."""
    c = source.config
    settings = ConvertSettings(
        departments=c.num_departments,
        top_departments=c.top_departments,
        shared_size=0,
        private_size=width,
        grouping="keep",
        department_score=c.department_score,
        ridge=ridge,
    )
    return convert_layer(source, hidden, settings, order=torch.arange(c.num_experts)).layer


def composed_settings(settings: ConvertSettings, source_width: int, width: int) -> ConvertSettings:
    """settings for experts pruned from source_width to width neurons: f_s scaled by
    width / source_width (kept below width), f_p the rest of the width, or scaled too when
    settings ask for fewer private neurons than the rest."""
    shared, private = settings.sizes(source_width)
    shared = min(round(shared * width / source_width), width - 1)
    if settings.private_size is None:
        private = width - shared
    else:
        private = min(max(round(private * width / source_width), 0 if shared else 1), width - shared)
    return dataclasses.replace(settings, shared_size=shared, shared_fraction=None, private_size=private)


@torch.no_grad()
def pruned_converted_layer(
    pruned: DeaMoELayer, hidden: torch.Tensor, order: torch.Tensor, settings: ConvertSettings, source_width: int
) -> DeaMoELayer:
    """The pruned layer converted in the departments `order` forms (its experts keep the
    source's indices, so the converted model's grouping applies)."""
    composed = composed_settings(settings, source_width, pruned.config.expert_intermediate_size)
    return convert_layer(pruned, hidden, composed, order=order).layer


# Lower top-k ---------------------------------------------------------------------------


@torch.no_grad()
def lowered_topk_layer(source: DeaMoELayer, k: int) -> DeaMoELayer:
    """source's experts and router keeping each token's k best experts, their weights
    renormalised to sum to one (times the routed scaling factor)."""
    config = source.config.replace(top_k=k, norm_topk_prob=True)
    layer = DeaMoELayer(config, dtype=source.dtype, router_dtype=source.router_dtype)
    layer.load_state_dict(source.state_dict())
    return layer.eval()


# Low-rank delta ------------------------------------------------------------------------


class LowRankDeltaLayer(nn.Module):
    """Experts e = base[e // m] + rank-r deltas: gate_e = Gb + Ag_e Bg_e, up_e = Ub + Au_e Bu_e,
    down_e = Db + Ad_e Bd_e; routed by `config` (departments of m experts, department-first)."""

    def __init__(
        self,
        config: DeaMoEConfig,
        rank: int,
        *,
        dtype: torch.dtype = torch.float32,
        router_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        c = config
        d, f, n = c.hidden_size, c.expert_intermediate_size, c.num_experts
        self.config, self.rank = c, rank

        def empty(*shape):
            return nn.Parameter(torch.zeros(*shape, dtype=dtype))

        self.router = Router(c, dtype=router_dtype or dtype)
        self.base_gate_up, self.base_down = empty(c.num_departments, 2 * f, d), empty(c.num_departments, d, f)
        self.gate_a, self.gate_b = empty(n, f, rank), empty(n, rank, d)
        self.up_a, self.up_b = empty(n, f, rank), empty(n, rank, d)
        self.down_a, self.down_b = empty(n, d, rank), empty(n, rank, f)
        self.gate_up_bias = empty(n, 2 * f) if c.ffn_bias else None
        self.down_bias = empty(n, d) if c.ffn_bias else None
        self.shared_experts: nn.Module | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.base_down.dtype

    def ffn_parameters(self) -> list[nn.Parameter]:
        """What healing trains: bases, factors and biases (not the router or shared experts)."""
        skip = {id(p) for m in (self.router, self.shared_experts) if m is not None for p in m.parameters()}
        return [p for p in self.parameters() if id(p) not in skip]

    def route(self, hidden_states: torch.Tensor) -> Routing:
        r = self.router
        return route(hidden_states, r.weight, r.bias, self.config, logit_bias=r.logit_bias)

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's output on tokens x [T, d] (float32 math in the layer's dtype)."""
        c, f = self.config, self.config.expert_intermediate_size
        j = e // c.experts_per_department
        base_gate, base_up = self.base_gate_up[j][:f], self.base_gate_up[j][f:]
        gate = x @ base_gate.t() + (x @ self.gate_b[e].t()) @ self.gate_a[e].t()
        up = x @ base_up.t() + (x @ self.up_b[e].t()) @ self.up_a[e].t()
        if self.gate_up_bias is not None:
            gate, up = gate + self.gate_up_bias[e][:f], up + self.gate_up_bias[e][f:]
        h = glu(gate, up, c)
        y = h @ self.base_down[j].t() + (h @ self.down_b[e].t()) @ self.down_a[e].t()
        return y if self.down_bias is None else y + self.down_bias[e]

    def forward_routed(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        xw = x.to(self.dtype)
        out = torch.zeros(x.shape[0], self.config.hidden_size, dtype=torch.float32, device=x.device)
        for e in routing.used_experts().tolist():
            tokens, weights = routing.expert_tokens(e)
            out.index_add_(0, tokens, self.expert_forward(e, xw[tokens]).float() * weights[:, None])
        if self.shared_experts is not None:
            out += self.shared_experts(xw).float()
        return out

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, self.config.hidden_size)
        return self.forward_routed(x, self.route(x)).to(hidden_states.dtype).reshape(hidden_states.shape)

    def step_bytes(self, routing: Routing, bytes_per_weight: int, tokens: int = 1) -> float:
        """Mean bytes a step of `tokens` tokens reads over the steps metrics.steps forms."""
        c, b = self.config, bytes_per_weight
        d, f, r = c.hidden_size, c.expert_intermediate_size, self.rank
        base = ffn_bytes(3 * d * f, b)
        delta = ffn_bytes(3 * r * (d + f), b, biases=(2 * f + d) if c.ffn_bias else 0)
        groups = steps(routing.num_tokens, tokens)
        total = 0.0
        for group in groups:
            step = subset(routing, group)
            fixed = weights_loaded(c, step, b)  # the router and shared experts as traffic counts them
            total += fixed.router_bytes + fixed.shared_expert_bytes
            total += int(step.used_departments().numel()) * base + int(step.used_experts().numel()) * delta
        return total / max(len(groups), 1)


def _whitening(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor L of the routing-weighted input covariance (plus a small ridge):
    ||(W - M) L|| is the error of M in place of W on those inputs."""
    x = inputs.double()
    n = x.shape[1]
    if x.shape[0] == 0:
        return torch.eye(n, dtype=torch.float64)
    w = weight.double()[:, None]
    cov = x.t() @ (w * x) / w.sum().clamp_min(1e-12)
    ridge = WHITEN_RIDGE * float(cov.diagonal().mean()) + 1e-12
    return torch.linalg.cholesky(cov + ridge * torch.eye(n, dtype=torch.float64))


def low_rank(delta: torch.Tensor, rank: int, whiten: torch.Tensor | None = None):
    """(A [rows, rank], B [rank, cols]) with A B the best rank-`rank` approximation of delta
    (in the whitened norm ||(delta - A B) L|| when whiten = L is given)."""
    delta = delta.double()
    target = delta if whiten is None else delta @ whiten
    u, s, vh = torch.linalg.svd(target, full_matrices=False)
    a, b = u[:, :rank] * s[:rank], vh[:rank]
    if whiten is not None:
        b = torch.linalg.solve_triangular(whiten, b, upper=False, left=False)
    return a.float(), b.float()


@torch.no_grad()
def delta_layer(
    source: DeaMoELayer,
    hidden: torch.Tensor,
    order: torch.Tensor,
    config: DeaMoEConfig,
    rank: int,
    *,
    whiten: bool = True,
) -> LowRankDeltaLayer:
    """Experts source[order] in departments of config.experts_per_department, each a shared
    base plus its own rank-`rank` delta; routed by config (the router rows follow order)."""
    experts = ExpertWeights.of(source)
    x = hidden.reshape(-1, source.config.hidden_size).float()
    routing = source.route(x)
    layer = LowRankDeltaLayer(config, rank, dtype=source.dtype, router_dtype=source.router_dtype)
    f, m = experts.width, config.experts_per_department
    _copy_router(layer, source, order)
    layer.shared_experts = copy.deepcopy(source.shared_experts)
    for j in range(config.num_departments):
        members = order[j * m : (j + 1) * m].tolist()
        tokens = [tokens_of(e, x, routing.expert_ids, routing.weights) for e in members]
        usage = torch.tensor([float(t.weight.sum()) for t in tokens]) + 1e-6
        usage = usage / usage.sum()
        weights = [experts.expert(e) for e in members]
        perms = align([neuron_vectors(*w) for w in weights], usage) if m > 1 else [torch.arange(f)]
        aligned = [(g[p], u[p], dn[:, p]) for (g, u, dn), p in zip(weights, perms, strict=True)]
        base = [sum(w * a[i] for w, a in zip(usage.tolist(), aligned, strict=True)) for i in range(3)]
        layer.base_gate_up[j].copy_(torch.cat(base[:2]))
        layer.base_down[j].copy_(base[2])
        for slot, (e, t, p) in enumerate(zip(members, tokens, perms, strict=True)):
            i = j * m + slot
            gate, up, down = aligned[slot]
            gate_bias, up_bias = (b[p] for b in experts.neuron_biases(e))
            x_white = _whitening(t.x, t.weight) if whiten else None
            h = experts.activations(e, t.x)[:, p]
            h_white = _whitening(h, t.weight) if whiten else None
            for (a_name, b_name), delta, white in (
                (("gate_a", "gate_b"), gate - base[0], x_white),
                (("up_a", "up_b"), up - base[1], x_white),
                (("down_a", "down_b"), down - base[2], h_white),
            ):
                a, b = low_rank(delta, rank, white)
                getattr(layer, a_name)[i].copy_(a)
                getattr(layer, b_name)[i].copy_(b)
            if layer.gate_up_bias is not None:
                assert layer.down_bias is not None and experts.down_bias is not None  # ffn_bias: both
                layer.gate_up_bias[i].copy_(torch.cat((gate_bias, up_bias)))
                layer.down_bias[i].copy_(experts.down_bias[e])
    return layer.eval()


# Sizing to the converted model's bytes -------------------------------------------------


def _bytes(layers, heldout) -> float:
    total = 0.0
    for layer, x in zip(layers, heldout, strict=True):
        x = x.to(layer.dtype)
        total += layer_step_bytes(layer, layer.route(x))
    return total


def largest_within(target: float, cost, low: int, high: int) -> int:
    """The largest size in [low, high] whose cost(size) <= target (cost increasing); low if none."""
    best = low
    lo, hi = low, high
    while lo <= hi:
        mid = (lo + hi) // 2
        if cost(mid) <= target:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def pruned_width(sources: list[DeaMoELayer], heldout, target: float) -> int:
    """Neurons per expert of the pruned experts at target bytes per step (all layers)."""

    def cost(width: int) -> float:
        total = 0.0
        for src, x in zip(sources, heldout, strict=True):
            routing = src.route(x.to(src.dtype))
            config = src.config.replace(private_intermediate_size=width)
            total += step_bytes(config, routing, BYTES_PER_WEIGHT[src.dtype])
        return total

    return largest_within(target, cost, 1, sources[0].config.expert_intermediate_size)


def lowered_k(sources: list[DeaMoELayer], heldout, target: float) -> int:
    def cost(k: int) -> float:
        return _bytes([lowered_topk_layer(s, k) for s in sources], heldout)

    return largest_within(target, cost, 1, sources[0].config.top_k)


def delta_rank(layers: list[LowRankDeltaLayer], heldout, target: float) -> int:
    """The rank at target bytes per step, given delta layers (any rank) whose routing is final."""
    routings = [layer.route(x.to(layer.dtype)) for layer, x in zip(layers, heldout, strict=True)]

    def cost(rank: int) -> float:
        total = 0.0
        for layer, routing in zip(layers, routings, strict=True):
            saved, layer.rank = layer.rank, rank
            total += layer.step_bytes(routing, BYTES_PER_WEIGHT[layer.dtype])
            layer.rank = saved
        return total

    c = layers[0].config
    return largest_within(target, cost, 0, min(c.hidden_size, c.expert_intermediate_size))


# All of them ---------------------------------------------------------------------------


def build(
    sources: list[DeaMoELayer],
    calibration: list[torch.Tensor],
    heldout: list[torch.Tensor],
    converted: list[DeaMoELayer],
    orders: list[torch.Tensor],
    settings: ConvertSettings,
) -> list[Baseline]:
    """Every baseline, sized to the converted layers' bytes per step on the held-out inputs."""
    target = _bytes(converted, heldout)
    n = sources[0].config.num_experts
    identity = [torch.arange(n)] * len(sources)
    out = []

    width = pruned_width(sources, heldout, target)
    layers: list[nn.Module] = [
        pruned_layer(s, x, width, ridge=settings.ridge) for s, x in zip(sources, calibration, strict=True)
    ]
    out.append(Baseline(PRUNED, layers, identity, {"expert_width": width}))
    source_width = sources[0].config.expert_intermediate_size
    composed = [
        pruned_converted_layer(p, x, order, settings, source_width)
        for p, x, order in zip(layers, calibration, orders, strict=True)
    ]
    out.append(Baseline(PRUNED_CONVERTED, composed, orders, {"pruned_width": width}))

    k = lowered_k(sources, heldout, target)
    out.append(Baseline(TOP_K, [lowered_topk_layer(s, k) for s in sources], identity, {"top_k": k}))

    department_config = converted[0].config.replace(
        shared_intermediate_size=0, private_intermediate_size=sources[0].config.expert_intermediate_size
    )
    for name, config_of, layer_orders in (
        (DELTA, lambda s: department_config, orders),
        (DELTA_ONE, lambda s: s.config, identity),
    ):
        probes = [LowRankDeltaLayer(config_of(s), 0, dtype=s.dtype) for s in sources]
        for probe, s, order in zip(probes, sources, layer_orders, strict=True):
            _copy_router(probe, s, order)
        rank = delta_rank(probes, heldout, target)
        layers = [
            delta_layer(s, x, order, config_of(s), rank)
            for s, x, order in zip(sources, calibration, layer_orders, strict=True)
        ]
        out.append(Baseline(name, layers, layer_orders, {"rank": rank}))
    return out


@torch.no_grad()
def _copy_router(layer: LowRankDeltaLayer, source: DeaMoELayer, order: torch.Tensor) -> None:
    layer.router.weight.copy_(source.router.weight[order])
    for name in ("bias", "logit_bias"):
        if getattr(source.router, name) is not None:
            getattr(layer.router, name).copy_(getattr(source.router, name)[order])


# Which to heal ---------------------------------------------------------------------------

# Calibration windows (language models) or tokens (layers) the ranking looks at.
RANK_WINDOWS, RANK_TOKENS = 16, 1024


@torch.no_grad()
def strongest(variants: list, source, count: int) -> list:
    """The `count` variants (each with .layers and, for a language model, .lm) closest to the
    source on calibration data (KL(source || variant) of the next-token distributions for language models, else
    the mean relative output error): which baselines get healed. Held-out data plays no part
    in the choice."""
    from .metrics import relative_error

    if source.lm is not None:
        windows = source.calibration_windows[:RANK_WINDOWS, :-1]
        teacher = F.log_softmax(source.lm(windows).logits, dim=-1).flatten(0, 1)

        def loss(v) -> float:
            student = F.log_softmax(v.lm(windows).logits, dim=-1).flatten(0, 1)
            return float(F.kl_div(student, teacher, log_target=True, reduction="batchmean"))

    else:

        def loss(v) -> float:
            errors = []
            for layer, src, x in zip(v.layers, source.layers, source.calibration, strict=True):
                x = x[:RANK_TOKENS].to(src.dtype)
                errors.append(relative_error(layer(x), src(x)))
            return sum(errors) / len(errors)

    return sorted(variants, key=loss)[:count]
