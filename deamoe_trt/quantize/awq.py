"""Activation-aware weight quantization (AWQ, Lin et al. 2023) of a DeaMoE layer's FFN weights.

The output is an ordinary quantized checkpoint (deamoe_trt.quant: symmetric codes, implicit
zero point, one scale per (row, group)); AWQ only chooses the weights that are rounded and
the scales they are rounded with, from calibration tokens (the layer's inputs):

- Down projections: their input h = silu(x Wg^T) * (x Wu^T) is linear in the up rows, so a
  per-channel scale s on down's input columns folds exactly into the matching up rows:
  down' = down * s, up' = up / s computes the same function. s = mean|h|^alpha over the
  tokens each group (department, expert) receives, normalised and rounded to a power of
  two so that the fold is exact in any float dtype; one alpha per part (departments,
  experts, shared experts), chosen on a grid by the summed output error of the quantized
  down' weights. Each department's shared part and each expert's private part has its own
  h (its own channels, its own up rows), so both fold; so do the shared experts. An up
  bias is part of the up pre-activation, so it folds with its row (b_u' = b_u / s); the
  down bias is added after the scaled product and is untouched. With the clamped SwiGLU
  (gpt-oss) h is not linear in u (u is clamped, then offset by 1), so no channel scale
  folds exactly: such layers search clipping only (alpha = 0).
- Every weight (gate_up, and down' after scaling): per (row, group) clipping search, the
  scale covers clip * max|w| for the clip in CLIP_RATIOS that minimises that group's output
  error on the calibration activations. gate_up's input is the layer input x, shared by the
  router (never quantized) and every part, with nothing before it in a layer checkpoint to
  fold a scale into: clipping is all AWQ can do for it there. In a language model x is
  the pre-FFN RMSNorm's output, which can absorb 1/s: search_input_scales chooses one s
  per channel for the layer and fold_input_scales multiplies every reader of x by it
  (deamoe_trt.quantize.lm.quantize_lm_awq folds the norm); gate/up biases are added after
  x Wg^T and are untouched by it. Biases are never quantized.

Calibration tokens reach each part as the router sends them: an expert sees the tokens that
kept it, a department the tokens with a kept expert in it, the shared experts all tokens,
and each token's error counts with the weight the layer gives that part's output (w_e,
W_j, the shared-expert gate), so the search minimises the part's share of the layer's
output error. A part no calibration token reaches keeps round to nearest (counted in
AwqPlan.uncalibrated). alpha = 0 and clip = 1 are on the grids: on the calibration tokens
each choice is at least as good as round to nearest for what it measures.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from ..activation import glu
from ..errors import UsageError
from ..quant import QuantConfig, group_scales, round_to_grid

# alpha = 0: no scaling (round to nearest's weights). AWQ's grid is 0, 0.05, ..., 0.95.
ALPHAS = tuple(i / 10 for i in range(11))
# clip = 1: round to nearest's scale. AWQ searches down to 0.5 of max|w|.
CLIP_RATIOS = tuple(1 - i / 20 for i in range(11))
# Channel scales stay within 2^-8..2^8: the fold stays exact in fp16 for ordinary weights,
# and a channel no calibration token excites cannot be scaled away.
MAX_EXPONENT = 8
PARTS = ("departments", "experts", "shared_experts")


@dataclass
class AwqPlan:
    """What the search chose for one layer.

    channel_scales: part name -> [groups, width] powers of two (the shared experts are one
        group), applied as down' = down * s, up' = up / s (fold);
    clip: weight name ("experts.down", ...) -> per-(row, group) clip ratios, shaped like the
        weight's scales (DeaMoELayer.quantized's clip);
    uncalibrated: part name -> how many of its groups received no calibration token;
    groups: part name -> how many groups it has.
    """

    channel_scales: dict[str, torch.Tensor] = field(default_factory=dict)
    clip: dict[str, torch.Tensor] = field(default_factory=dict)
    uncalibrated: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)


def receivers(layer, x: torch.Tensor) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per part, per group: (token indices, the weight of that part's output for each token)."""
    c = layer.config
    routing = layer.route(x)
    out = {}
    if layer.departments is not None:
        weights = routing.department_weights(c.num_departments)
        out["departments"] = [routing.department_tokens(j, weights) for j in range(c.num_departments)]
    if layer.experts is not None:
        out["experts"] = [routing.expert_tokens(e) for e in range(c.num_experts)]
    if layer.shared_experts is not None:
        gate = layer.shared_experts.gate_values(x.to(layer.dtype))
        weight = torch.ones(x.shape[0]) if gate is None else gate.squeeze(-1)
        out["shared_experts"] = [(torch.arange(x.shape[0]), weight)]
    return out


def group_count(layer) -> int:
    """How many (part, group) searches `search` runs on layer, each in two passes (channel
    scales, then clipping): its progress total is twice this."""
    c = layer.config
    return (
        (c.num_departments if layer.departments is not None else 0)
        + (c.num_experts if layer.experts is not None else 0)
        + (1 if layer.shared_experts is not None else 0)
    )


def _stacked(weight: torch.Tensor) -> torch.Tensor:
    """A part's weight as [groups, rows, cols] (the shared experts' are one group)."""
    return weight.detach() if weight.dim() == 3 else weight.detach().unsqueeze(0)


@torch.no_grad()
def search(layer, quant: QuantConfig, x: torch.Tensor, progress=None, *, alphas=ALPHAS) -> AwqPlan:
    """Channel scales and clip ratios for a float layer from its calibration inputs x [T, d].

    alphas: the grid of the channel-scale search; (0.0,) searches clipping only."""
    from ..layer import check_quantizable

    if layer.quant is not None:
        raise UsageError("the layer is already quantized; AWQ starts from the floating-point checkpoint")
    check_quantizable(layer.config, quant)
    if layer.config.activation != "swiglu":
        alphas = (0.0,)  # no channel scale folds exactly through the clamp (module docstring)
    x = x.reshape(-1, layer.config.hidden_size)
    xf = x.to(layer.dtype).float()  # what the FFN parts see
    plan = AwqPlan()
    for name, groups in receivers(layer, x).items():
        part = getattr(layer, name)
        gate_up, down = _stacked(part.gate_up), _stacked(part.down)
        bias = part.gate_up_bias
        if bias is not None:
            bias = bias.detach() if part.gate_up.dim() == 3 else bias.detach().unsqueeze(0)
        inputs = [
            (xf[tokens], weight.float()[:, None], None if bias is None else bias[g].float(), layer.config)
            for g, (tokens, weight) in enumerate(groups)
        ]
        plan.uncalibrated[name], plan.groups[name] = sum(t.numel() == 0 for t, _ in groups), len(groups)
        scales = _search_part_scales(gate_up, down, inputs, quant, layer.dtype, alphas, progress, name)
        clip_gate_up, clip_down = [], []
        for g, ((xg, weight, group_bias, config), s) in enumerate(zip(inputs, scales, strict=True)):
            width = down.shape[-1]
            folded = gate_up[g].float().clone()
            folded[width:] /= s[:, None]
            h = _down_input(gate_up[g].float(), xg, weight, group_bias, config)
            clip_gate_up.append(search_clip(folded, xg * weight, quant, layer.dtype))
            clip_down.append(search_clip(down[g].float() * s, h / s, quant, layer.dtype))
            if progress is not None:
                progress.update(f"{name} {g}: clipping")
        plan.channel_scales[name] = torch.stack(scales)
        shape = (lambda t: t) if part.gate_up.dim() == 3 else (lambda t: t[0])
        plan.clip[f"{name}.gate_up"] = shape(torch.stack(clip_gate_up))
        plan.clip[f"{name}.down"] = shape(torch.stack(clip_down))
    return plan


def _down_input(gate_up: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias=None, config=None) -> torch.Tensor:
    """h = a(x Wg^T + b_g, x Wu^T + b_u) (the layer's activation; silu(g) * u without a
    config), each token's row times the weight of its output."""
    gate, up = F.linear(x, gate_up, bias).chunk(2, dim=-1)
    return (F.silu(gate) * up if config is None else glu(gate, up, config)) * weight


def _search_part_scales(
    gate_up, down, inputs, quant: QuantConfig, dtype, alphas, progress=None, name=""
) -> list[torch.Tensor]:
    """Each group's channel scales s [f] = mean|h|^alpha (powers of two), for the one alpha of
    the grid that minimises the part's summed output error ||h (Q(down * s) / s - down)^T||^2.

    One alpha per part, as AWQ has one per layer: an expert sees a few hundred tokens, and an
    alpha per expert fitted to them did worse than none on held-out text (docs/quantization.md)."""
    candidates, errors = [], torch.zeros(len(alphas), dtype=torch.float64)
    for g, (x, weight, bias, config) in enumerate(inputs):
        scales, group_errors = _scale_candidates(
            gate_up[g].float(), down[g].float(), x, weight, quant, dtype, alphas, bias, config
        )
        candidates.append(scales)
        errors += group_errors
        if progress is not None:
            progress.update(f"{name} {g}: channel scales")
    best = int(torch.argmin(errors))  # ties: the first, alpha = 0 (no scaling)
    return [scales[best] for scales in candidates]


def _scale_candidates(gate_up, down, x, weight, quant: QuantConfig, dtype, alphas, bias=None, config=None):
    """One group's channel scales for each alpha and the output error of its quantized down
    with each: ([s [f]] per alpha, errors [alphas] float64). No tokens: no scaling, no error."""
    errors = torch.zeros(len(alphas), dtype=torch.float64)
    if x.shape[0] == 0:  # no calibration token: round to nearest
        return [torch.ones(down.shape[-1])] * len(alphas), errors
    h = _down_input(gate_up, x, weight, bias, config)
    factor = _gram_factor(h)
    mean = _mean_magnitude(h)
    candidates = []
    for i, alpha in enumerate(alphas):
        s = _power_of_two_scales(mean, alpha)
        delta = _fake_quantize(down * s, quant, dtype) / s - down
        errors[i] = float((factor @ delta.t()).square().sum())
        candidates.append(s)
    return candidates, errors


def _mean_magnitude(acts: torch.Tensor) -> torch.Tensor:
    """mean|acts| per channel over the tokens of acts [T, n], floored at 1e-4 of its max (all
    1 when acts is all zero) so that every channel's power stays finite."""
    mean = acts.abs().mean(dim=0)
    return mean.clamp_min(float(mean.max()) * 1e-4 if float(mean.max()) > 0 else 1.0)


def _power_of_two_scales(mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """AWQ's channel scales mean^alpha, centred on 1 in log scale (as AWQ does) and rounded to
    powers of two within 2^-MAX_EXPONENT..2^MAX_EXPONENT, so that folding them is exact."""
    s = mean.pow(alpha)
    s = s / (s.max() * s.min()).sqrt()
    return torch.exp2(torch.log2(s).round().clamp(-MAX_EXPONENT, MAX_EXPONENT))


def _fake_quantize(weight: torch.Tensor, quant: QuantConfig, dtype, clip=None) -> torch.Tensor:
    """What weight [rows, cols] (float32) dequantizes to after quantize_rtn, in float32."""
    rows, cols = weight.shape
    grouped = weight.view(rows, cols // quant.group_size, quant.group_size)
    scales = group_scales(grouped, quant.bits, dtype, clip)
    return (round_to_grid(grouped, scales, quant.bits) * scales.float().unsqueeze(-1)).view(rows, cols)


def _gram_factor(acts: torch.Tensor) -> torch.Tensor:
    """R with R^T R = acts^T acts for acts [..., T, n], with min(T, n) rows: ||R v|| = ||acts v||
    for every v, so output errors cost n (not T) per weight row when there are many tokens."""
    if acts.shape[-2] <= acts.shape[-1]:
        return acts
    return torch.linalg.qr(acts, mode="r").R


def search_clip(weight: torch.Tensor, acts: torch.Tensor, quant: QuantConfig, dtype) -> torch.Tensor:
    """Per (row, group) the ratio in CLIP_RATIOS whose scale minimises that group's output
    error ||acts_g (Q(w_g) - w_g)|| on the calibration activations acts [T, cols]."""
    rows, cols = weight.shape
    gs = quant.group_size
    grouped = weight.view(rows, cols // gs, gs)
    factor = _gram_factor(acts.reshape(-1, cols // gs, gs).transpose(0, 1))  # [groups, k, gs]
    best = torch.ones(rows, cols // gs)
    best_error = torch.full((rows, cols // gs), float("inf"))
    for ratio in CLIP_RATIOS:
        clip = torch.tensor(ratio, dtype=torch.float32)
        scales = group_scales(grouped, quant.bits, dtype, clip)
        delta = round_to_grid(grouped, scales, quant.bits) * scales.float().unsqueeze(-1) - grouped
        error = torch.einsum("gki,rgi->rgk", factor, delta).square().sum(-1)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best = torch.where(better, clip, best)
    return best


@torch.no_grad()
def fold(layer, plan: AwqPlan):
    """A copy of the float layer with the plan's channel scales folded in: down' = down * s,
    up' = up / s, b_u' = b_u / s. Powers of two: the copy computes exactly what layer
    computes (barring subnormals)."""
    folded = copy.deepcopy(layer)
    for name, s in plan.channel_scales.items():
        part = getattr(folded, name)
        s = s.to(folded.dtype)
        if part.down.dim() == 2:
            s = s[0]
        width = part.down.shape[-1]
        part.down.mul_(s.unsqueeze(-2))
        part.gate_up[..., width:, :].div_(s.unsqueeze(-1))
        if part.gate_up_bias is not None:
            part.gate_up_bias[..., width:].div_(s)
    return folded


@torch.no_grad()
def search_input_scales(layer, quant: QuantConfig, x: torch.Tensor, *, alphas=ALPHAS) -> torch.Tensor:
    """Per-input-channel scales s [d] (powers of two) for every gate_up of a float layer whose
    input x [T, d] comes from something that can absorb 1/s (a language model's pre-FFN RMSNorm:
    norm weight / s, fold_input_scales multiplies every consumer of x by s).

    x is shared by every part and the router, so one s for the layer: s = mean|x|^alpha over
    all tokens, for the alpha of the grid whose quantized gate_ups give the least layer output
    error ||y' - y||^2 on x, as AWQ scores a scale by its block's output. Each candidate's
    gate_ups are quantized as `search` will quantize them, with their clipping searched on
    x / s (clipping alone often does what the scales do; measured without it, scales that
    helped round to nearest made clipped weights worse); down stays float and the routing is
    unchanged (the router is not quantized). alpha = 0 (s = 1) is on the grid."""
    x = x.reshape(-1, layer.config.hidden_size).to(layer.dtype)
    xf = x.float()
    want = layer(x).float()
    mean = _mean_magnitude(xf)
    groups = receivers(layer, x)
    trial = copy.deepcopy(layer)
    errors, candidates = [], []
    for alpha in alphas:
        s = _power_of_two_scales(mean, alpha)
        for name, part_groups in groups.items():
            part = getattr(layer, name)
            gate_up = _stacked(part.gate_up)
            fakes = []
            for g, (tokens, weight) in enumerate(part_groups):
                scaled = gate_up[g].float() * s
                clip = search_clip(scaled, xf[tokens] / s * weight.float()[:, None], quant, layer.dtype)
                fakes.append(_fake_quantize(scaled, quant, layer.dtype, clip) / s)
            getattr(trial, name).gate_up.copy_(torch.stack(fakes).view_as(part.gate_up))
        errors.append(float((trial(x).float() - want).square().sum()))
        candidates.append(s)
    return candidates[min(range(len(alphas)), key=errors.__getitem__)]  # ties: the first, alpha = 0


@torch.no_grad()
def fold_input_scales(layer, s: torch.Tensor):
    """A copy of the float layer that computes layer(x) from x / s: every consumer of x (the
    router, every gate_up, the shared-expert gate) multiplied by s on its input columns.
    Powers of two: every product is the original's, bit for bit (barring subnormals), so the
    routing and the output are identical."""
    folded = copy.deepcopy(layer)
    folded.router.weight.mul_(s.to(folded.router.weight.dtype))
    for name in PARTS:
        part = getattr(folded, name)
        if part is not None:
            part.gate_up.mul_(s.to(part.gate_up.dtype))
    shared = folded.shared_experts
    if shared is not None and shared.gate is not None:
        shared.gate.mul_(s.to(shared.gate.dtype))
    return folded


def quantize_awq(layer, quant: QuantConfig, x: torch.Tensor, progress=None, *, alphas=ALPHAS):
    """(The layer quantized with AWQ from calibration inputs x [T, d], the plan it used)."""
    if quant.method != "awq":
        quant = QuantConfig(quant.bits, quant.group_size, "awq")
    plan = search(layer, quant, x, progress, alphas=alphas)
    return fold(layer, plan).quantized(quant, clip=plan.clip), plan


# Calibration files -------------------------------------------------------------------------

HIDDEN_STATES = "hidden_states"
MIN_SPLIT_TOKENS = 8


def read_calibration(source: str, stack, *, seed: int = 0, what: str = "--calibration") -> list[torch.Tensor]:
    """Each layer's inputs [T, d] (float32) from `source`:

    - a safetensors file with `hidden_states` [..., d]: the first layer's inputs; later
      layers' are what the float stack gives them (x + layer(x), as the checkpoint runs);
    - a safetensors file with `layers.{i}.hidden_states` [..., d] for every layer i: each
      layer's own inputs, captured from a model (e.g. a decoder's post-attention norm);
    - `random:N`: N Gaussian tokens as the first layer's inputs (a demo: no real
      activation statistics, so AWQ has little to find).
    One line (UsageError) naming the problem otherwise."""
    from pathlib import Path

    from ..checkpoint import read_tensors
    from ..inputs import random_hidden, stack_hidden

    d, layers = stack.config.hidden_size, len(stack.layers)
    if source.startswith("random:"):
        count = source.removeprefix("random:")
        if not count.isdigit() or int(count) < 1:
            raise UsageError(f"{what} random:N needs a token count N >= 1, got {source!r}")
        return stack_hidden(stack, random_hidden(int(count), d, seed=seed))
    if not Path(source).exists():
        raise UsageError(f"{what} {source}: no such file")
    if not Path(source).is_file():
        raise UsageError(f"{what} {source} is not a regular file; give a safetensors file of hidden states")
    try:
        tensors = read_tensors(Path(source))
    except UsageError as exc:  # one line: "... is not a readable safetensors file ..."
        raise UsageError(f"{what} {exc}") from None
    per_layer = [f"layers.{i}.{HIDDEN_STATES}" for i in range(layers)]
    if set(tensors) == {HIDDEN_STATES}:
        names = [HIDDEN_STATES]
    elif set(tensors) == set(per_layer):
        names = per_layer
    else:
        raise UsageError(
            f"{what} {source} holds {sorted(tensors) or 'no tensors'}; expected '{HIDDEN_STATES}' (the first "
            f"layer's inputs) or 'layers.{{i}}.{HIDDEN_STATES}' for each of the checkpoint's {layers} layer(s)"
        )
    inputs = []
    for name in names:
        tensor = tensors[name]
        if tensor.dim() < 2 or tensor.shape[-1] != d or tensor.numel() == 0:
            raise UsageError(f"{what} {source}: {name} must be [tokens, {d}], got {list(tensor.shape)}")
        if not tensor.is_floating_point():
            raise UsageError(f"{what} {source}: {name} must be floating point, got {tensor.dtype}")
        tensor = tensor.reshape(-1, d).float()
        if not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{what} {source}: {name} contains NaN or Inf")
        inputs.append(tensor)
    return inputs if len(inputs) == layers else stack_hidden(stack, inputs[0])


def split_held_out(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(calibration, held-out): the last quarter of each layer's tokens is held out."""
    calibration, held_out = [], []
    for x in inputs:
        if x.shape[0] < MIN_SPLIT_TOKENS:
            raise UsageError(
                f"--calibration has {x.shape[0]} tokens; at least {MIN_SPLIT_TOKENS} are needed to hold out "
                "a quarter for measuring the error (or pass a separate --eval FILE)"
            )
        cut = x.shape[0] - x.shape[0] // 4
        calibration.append(x[:cut])
        held_out.append(x[cut:])
    return calibration, held_out


def quantize_stack_awq(stack, quant: QuantConfig, inputs: list[torch.Tensor], *, progress: bool = True):
    """(The stack quantized with AWQ, each layer from its calibration inputs, the plans)."""
    from ..console import Progress
    from ..layer import DeaMoEStack

    bar = Progress(2 * sum(group_count(layer) for layer in stack.layers), "awq search", enabled=progress)
    pairs = [quantize_awq(layer, quant, x, bar) for layer, x in zip(stack.layers, inputs, strict=True)]
    return DeaMoEStack.from_layers([q for q, _ in pairs]), [plan for _, plan in pairs]
