"""Weight-only int8/int4 for the language model's projections outside the DeaMoE FFNs.

`LMConfig.quantized_linears` names the parts whose nn.Linear weights are stored quantized,
in the FFNs' format (deamoe_trt.quant: groups of `group_size` input columns, one scale per
(row, group), unsigned codes with an implicit zero point, QMoE packing) and with the
config's `quantization` bits and group size:

- "attention": every projection of every block's attention (q/k/v/o; MLA's down and up
  projections);
- "dense": the gate/up/down projections of the dense MLP blocks;
- "head": the LM head (not with tie_word_embeddings, where the head is the embedding).

A quantized projection keeps its name: `<prefix>.weight.qweight` and `<prefix>.weight.scales`
in the state dict and the checkpoint, as a quantized FFN weight is stored. Biases, norms,
embeddings and routers are never quantized. `dequantize` (deamoe_trt.quant) is what the
weights mean; the PyTorch model runs them dequantized to the scales' dtype.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import UsageError
from ..quant import QuantConfig, QuantizedWeight

LINEAR_PARTS = ("attention", "dense", "head")


class QuantizedLinear(nn.Module):
    """y = x W^T (+ b) with W stored as a QuantizedWeight [out_features, in_features]."""

    def __init__(self, in_features: int, out_features: int, quant: QuantConfig, *, bias: bool, dtype, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = QuantizedWeight((out_features, in_features), quant, dtype=dtype, device=device)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.dense().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def check_parts(parts: tuple[str, ...], tied_head: bool) -> None:
    unknown = [p for p in parts if p not in LINEAR_PARTS]
    if unknown or len(set(parts)) != len(parts):
        raise UsageError(f"quantized_linears takes distinct parts of {', '.join(LINEAR_PARTS)}, got {list(parts)!r}")
    if "head" in parts and tied_head:
        raise UsageError("the head cannot be quantized with tie_word_embeddings (it is the embedding matrix)")


def linear_slots(model, parts: tuple[str, ...]) -> Iterator[tuple[str, nn.Module, str]]:
    """(state-dict prefix, parent module, attribute) of every projection of parts in model
    (a DeaMoELM), float or quantized."""
    for i, block in enumerate(model.layers):
        groups = []
        if "attention" in parts:
            groups.append(("self_attn", block.self_attn))
        if "dense" in parts and not block.is_moe:
            groups.append(("mlp", block.mlp))
        for name, parent in groups:
            for attr, child in parent.named_children():
                if isinstance(child, (nn.Linear, QuantizedLinear)):
                    yield f"layers.{i}.{name}.{attr}", parent, attr
    if "head" in parts:
        yield "lm_head", model, "lm_head"


def swap_in_quantized(model, parts: tuple[str, ...], quant: QuantConfig) -> None:
    """Replace the float projections of parts in model by empty QuantizedLinears of their
    shapes (model just constructed; load_state_dict fills them)."""
    for prefix, parent, attr in linear_slots(model, parts):
        linear = getattr(parent, attr)
        quant.check_width(f"the input width of {prefix}", linear.in_features)
        factory = {"dtype": linear.weight.dtype, "device": linear.weight.device}
        quantized = QuantizedLinear(
            linear.in_features, linear.out_features, quant, bias=linear.bias is not None, **factory
        )
        setattr(parent, attr, quantized)


@torch.no_grad()
def quantized_state(model, parts: tuple[str, ...], quant: QuantConfig) -> dict[str, torch.Tensor]:
    """The state-dict entries of parts' projections quantized (round to nearest) from float
    model: `<prefix>.weight.qweight` and `.scales` (biases as they are)."""
    from ..quant import quantize_rtn

    state = {}
    for prefix, parent, attr in linear_slots(model, parts):
        linear = getattr(parent, attr)
        if not isinstance(linear, nn.Linear):
            raise UsageError(f"{prefix} is already quantized")
        quant.check_width(f"the input width of {prefix}", linear.in_features)
        qweight, scales = quantize_rtn(linear.weight, quant)
        state[f"{prefix}.weight.qweight"], state[f"{prefix}.weight.scales"] = qweight, scales
        if linear.bias is not None:
            state[f"{prefix}.bias"] = linear.bias
    return state


def dequantized_state(state: dict[str, torch.Tensor], quant: QuantConfig) -> dict[str, torch.Tensor]:
    """state with every quantized projection `<p>.weight.qweight/.scales` replaced by the
    dense `<p>.weight` it stands for (in the scales' dtype, as the model runs it)."""
    from ..quant import dequantize

    out = {}
    for name, t in state.items():
        if name.endswith(".weight.scales"):
            continue
        if name.endswith(".weight.qweight"):
            prefix = name[: -len(".qweight")]
            out[prefix] = dequantize(t, state[prefix + ".scales"], quant.bits, quant.group_size)
        else:
            out[name] = t
    return out
