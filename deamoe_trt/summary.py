"""What `info` and `demo` print: a layer's sizes, its routing, and its bytes per step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from .config import DeaMoEConfig
from .console import format_bytes, format_table
from .inputs import input_generator
from .layer import DeaMoELayer, DeaMoEStack
from .quant import QuantConfig
from .routing import Routing, router_logits
from .traffic import BYTES_PER_WEIGHT, compare_traffic, weights_loaded


def config_table(config: DeaMoEConfig) -> str:
    rows = [(name, value) for name, value in config.to_dict().items()]
    rows.append(("num_experts (N)", config.num_experts))
    return format_table(("field", "value"), rows, title="Config")


def parameter_table(stack: DeaMoEStack) -> str:
    """Parameters and stored bytes per part (quantized parts: packed codes plus scales)."""
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    quant = stack.quant
    for layer in stack.layers:
        for name, tensor in layer.state_dict().items():
            part = name.split(".")[0]
            if name.endswith(".qweight"):
                params = tensor.numel() * 8 // quant.bits
            elif name.endswith(".scales"):
                params = 0
            else:
                params = tensor.numel()
            counts[part] = counts.get(part, 0) + params
            sizes[part] = sizes.get(part, 0) + tensor.numel() * tensor.element_size()
    rows = [(part, f"{n:,}", format_bytes(sizes[part])) for part, n in counts.items()]
    rows.append(("total", f"{sum(counts.values()):,}", format_bytes(sum(sizes.values()))))
    stored = _stored(stack) + ("" if quant is None else f", group size {quant.group_size}")
    return format_table(
        ("part", "parameters", "size"), rows, title=f"Parameters ({len(stack.layers)} layer(s), {stored})"
    )


@torch.no_grad()
def quantization_error(
    reference: DeaMoEStack | Sequence[DeaMoELayer],
    quantized: DeaMoEStack | Sequence[DeaMoELayer],
    *,
    tokens: int = 64,
    seed: int = 0,
    inputs: list[torch.Tensor] | None = None,
    labels: Sequence[str] | None = None,
) -> list[tuple[str, str, str, int]]:
    """Per layer: ||y_q - y|| / ||y||, max |y_q - y| and the tokens whose experts differ (0
    unless the router changed: it is never quantized), on `inputs` (each layer's tokens) or
    else on `tokens` random tokens per layer. reference and quantized: stacks, or lists of
    layers (a language model's DeaMoE FFNs) named by labels (default 0, 1, ...)."""
    pairs = list(zip(getattr(reference, "layers", reference), getattr(quantized, "layers", quantized), strict=True))
    labels = [str(i) for i in range(len(pairs))] if labels is None else list(labels)
    gen = input_generator(seed)
    rows = []
    for i, (label, (layer, qlayer)) in enumerate(zip(labels, pairs, strict=True)):
        x = inputs[i] if inputs is not None else torch.randn(tokens, layer.config.hidden_size, generator=gen)
        rel, max_abs, moved = layer_error(layer, qlayer, x.to(layer.dtype))
        rows.append((label, f"{rel:.2e}", f"{max_abs:.2e}", moved))
    return rows


@torch.no_grad()
def layer_error(layer: DeaMoELayer, qlayer: DeaMoELayer, x: torch.Tensor) -> tuple[float, float, int]:
    """(||y_q - y|| / ||y||, max |y_q - y|, tokens whose experts differ) on tokens x."""
    y, yq = layer(x).float(), qlayer(x).float()
    moved = int((layer.route(x).expert_ids != qlayer.route(x).expert_ids).any(dim=-1).sum())
    return float((yq - y).norm() / y.norm().clamp_min(1e-30)), float((yq - y).abs().max()), moved


def routing_table(layer: DeaMoELayer, routing: Routing) -> str:
    rows = []
    for t in range(routing.num_tokens):
        experts = ", ".join(
            f"{e}:{w:.3f}" for e, w in zip(routing.expert_ids[t].tolist(), routing.weights[t].tolist(), strict=True)
        )
        rows.append((t, " ".join(map(str, routing.kept_departments[t].tolist())), experts))
    return format_table(
        ("token", "departments (stage 1)", "experts:weight (stage 2)"), rows, title="Routing of random tokens"
    )


def traffic_table(stack: DeaMoEStack, tokens: list[int], *, samples: int = 16, seed: int = 0) -> str:
    """Mean bytes of weights one decoding step reads, over `samples` random batches per token count.

    Each layer routes its own random batch, as layers do in a decoder; the figures are
    for all layers together."""
    gen = input_generator(seed)
    config, bytes_per = stack.config, BYTES_PER_WEIGHT[stack.dtype]
    router_bytes = BYTES_PER_WEIGHT[cast(DeaMoELayer, stack.layers[0]).router_dtype]
    rows = []
    for count in tokens:
        sums = {"deamoe": 0.0, "expanded": 0.0, "vanilla": 0.0}
        used_d = used_e = 0.0
        for _ in range(samples):
            for layer in stack.layers:
                x = torch.randn(count, config.hidden_size, generator=gen)
                bias = layer.router.bias.detach() if layer.router.bias is not None else None
                logits = router_logits(x, layer.router.weight.detach(), layer.router.logit_bias)
                traffic = compare_traffic(config, logits, bias, bytes_per, stack.quant, router_bytes)
                for key in sums:
                    sums[key] += traffic[key].total
                used_d += traffic["deamoe"].departments_used
                used_e += traffic["deamoe"].experts_used
        n = samples
        rows.append(
            (
                count,
                f"{used_d / n / len(stack.layers):.1f}",
                f"{used_e / n / len(stack.layers):.1f}",
                format_bytes(sums["deamoe"] / n),
                format_bytes(sums["expanded"] / n),
                format_bytes(sums["vanilla"] / n),
                f"{sums['deamoe'] / sums['expanded']:.1%}",
                f"{sums['deamoe'] / sums['vanilla']:.1%}",
            )
        )
    return format_table(
        ("tokens", "U_d", "U_e", "DeaMoE", "expanded", "vanilla", "vs expanded", "vs vanilla"),
        rows,
        title=f"Weights loaded per decoding step (mean of {samples} random batches, {_stored(stack)})",
    )


def _stored(stack: DeaMoEStack) -> str:
    quant = stack.quant
    return str(stack.dtype) if quant is None else f"int{quant.bits} FFN weights + {stack.dtype} scales"


@torch.no_grad()
def bit_width_table(stack: DeaMoEStack, tokens: list[int], *, samples: int = 16, seed: int = 0) -> str:
    """The stack's size and mean DeaMoE bytes per decoding step with its FFN weights at
    fp32, fp16, int8 and int4 (group size: the checkpoint's, else 64; scales and router at
    fp16 for the quantized rows), over the same random batches for every row."""
    from .traffic import stored_bytes

    config = stack.config
    group = stack.quant.group_size if stack.quant is not None else 64
    settings = [
        ("fp32", 4, None),
        ("fp16", 2, None),
        (f"int8, group {group}", 2, QuantConfig(8, group)),
        (f"int4, group {group}", 2, QuantConfig(4, group)),
    ]
    gen = input_generator(seed)
    sums = {(label, count): 0.0 for label, _, _ in settings for count in tokens}
    for count in tokens:
        for _ in range(samples):
            for layer in stack.layers:
                routing = layer.route(torch.randn(count, config.hidden_size, generator=gen).to(layer.dtype))
                for label, b, quant in settings:
                    sums[(label, count)] += weights_loaded(config, routing, b, quant).total / samples
    rows = []
    for label, b, quant in settings:
        size = len(stack.layers) * stored_bytes(config, b, quant)
        rows.append((label, format_bytes(size), *(format_bytes(sums[(label, count)]) for count in tokens)))
    return format_table(
        ("FFN weights", "model size", *(f"bytes/step, {count} token(s)" for count in tokens)),
        rows,
        title=f"Size and DeaMoE weights loaded per step by bit width ({len(stack.layers)} layer(s), mean of {samples})",
    )
