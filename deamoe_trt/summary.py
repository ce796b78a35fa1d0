"""What `info` and `demo` print: a layer's sizes, its routing, and its bytes per step."""

from __future__ import annotations

import torch

from .config import DeaMoEConfig
from .inputs import input_generator
from .layer import DeaMoELayer, DeaMoEStack
from .report import format_bytes, format_table
from .routing import Routing, router_logits
from .traffic import BYTES_PER_WEIGHT, compare_traffic


def config_table(config: DeaMoEConfig) -> str:
    rows = [(name, value) for name, value in config.to_dict().items()]
    rows.append(("num_experts (N)", config.num_experts))
    return format_table(("field", "value"), rows, title="Config")


def parameter_table(stack: DeaMoEStack) -> str:
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for layer in stack.layers:
        for name, tensor in layer.state_dict().items():
            part = name.split(".")[0]
            counts[part] = counts.get(part, 0) + tensor.numel()
            sizes[part] = sizes.get(part, 0) + tensor.numel() * BYTES_PER_WEIGHT[tensor.dtype]
    rows = [(part, f"{n:,}", format_bytes(sizes[part])) for part, n in counts.items()]
    rows.append(("total", f"{sum(counts.values()):,}", format_bytes(sum(sizes.values()))))
    return format_table(
        ("part", "parameters", "size"), rows, title=f"Parameters ({len(stack.layers)} layer(s), {stack.dtype})"
    )


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
    router_bytes = BYTES_PER_WEIGHT[stack.layers[0].router_dtype]
    rows = []
    for count in tokens:
        sums = {"deamoe": 0.0, "expanded": 0.0, "vanilla": 0.0}
        used_d = used_e = 0.0
        for _ in range(samples):
            for layer in stack.layers:
                x = torch.randn(count, config.hidden_size, generator=gen)
                bias = layer.router.bias.detach() if layer.router.bias is not None else None
                traffic = compare_traffic(
                    config, router_logits(x, layer.router.weight.detach()), bias, bytes_per, router_bytes
                )
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
        title=f"Weights loaded per decoding step (mean of {samples} random batches, {stack.dtype})",
    )
