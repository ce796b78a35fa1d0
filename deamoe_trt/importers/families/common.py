"""What the whole-model importers of every family share: reading config.json values, the
rotary settings, source recipes for expert stacks, and recipes that transform a source tensor."""

from __future__ import annotations

from typing import Any

import torch

from ...errors import UsageError
from ..derived import Derived, transformed


class HFConfig:
    """config.json values of a family, with one-line refusals naming the field."""

    def __init__(self, hf: dict[str, Any], where: str, family: str):
        self.hf, self.where, self.family = hf, where, family

    def get(self, name: str, default: Any = None) -> Any:
        value = self.hf.get(name)
        return default if value is None else value

    def need(self, name: str) -> Any:
        if self.hf.get(name) is None:
            raise UsageError(f"{self.where} lacks {name}, which a {self.family} config must set")
        return self.hf[name]

    def int(self, name: str, default: Any = None) -> int:
        return int(self.need(name) if default is None else self.get(name, default))

    def refuse(self, name: str, why: str) -> UsageError:
        return UsageError(f"{self.where}: {name} = {self.hf.get(name)!r} is not supported; {why}")

    def require(self, name: str, allowed: tuple[Any, ...], default: Any, why: str) -> Any:
        value = self.get(name, default)
        if value not in allowed:
            raise self.refuse(name, why)
        return value


def lm_fields(cfg: HFConfig, *, rms_norm_eps: float, tie_word_embeddings: bool = False) -> dict[str, Any]:
    """The LMConfig fields that every family with per-head attention reads alike from config.json;
    the defaults that differ between families are arguments."""
    heads = cfg.int("num_attention_heads")
    return {
        "vocab_size": cfg.int("vocab_size"),
        "hidden_size": cfg.int("hidden_size"),
        "num_layers": cfg.int("num_hidden_layers"),
        "num_heads": heads,
        "num_key_value_heads": cfg.int("num_key_value_heads", heads),
        "max_position_embeddings": cfg.int("max_position_embeddings"),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", rms_norm_eps)),
        "head_dim": cfg.int("head_dim", 0),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", tie_word_embeddings)),
    }


def rope_from_hf(hf: dict[str, Any], default_theta: float, where: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) of a config: transformers 5 writes rope_parameters,
    4.x rope_theta + rope_scaling. Partial rotary embeddings are refused."""
    rope = dict(hf.get("rope_parameters") or {})
    theta = float(rope.pop("rope_theta", hf.get("rope_theta") or default_theta))
    scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    if scaling is None and hf.get("rope_scaling"):
        scaling = dict(hf["rope_scaling"])
    if (hf.get("partial_rotary_factor") or 1.0) != 1.0 or (scaling or {}).get("partial_rotary_factor", 1.0) != 1.0:
        raise UsageError(f"{where}: partial rotary embeddings are not supported")
    return theta, scaling


def check_silu(cfg: HFConfig) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"{cfg.where}: hidden_act {act!r} is not supported; deamoe-trt's FFNs are SwiGLU (silu)")


def norms(src: str) -> dict[str, Any]:
    return {
        "input_layernorm.weight": src + "input_layernorm.weight",
        "post_attention_layernorm.weight": src + "post_attention_layernorm.weight",
    }


def dense_mlp(src: str) -> dict[str, Any]:
    return {f"mlp.{p}.weight": f"{src}mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}


def routed_experts(
    moe: str, index: dict, n: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
) -> dict[str, Any]:
    """mlp.experts.* from transformers 5's fused [E, 2I, d] / [E, d, I] tensors or per-expert MLPs
    whose gate, up and down projections are called names."""
    if moe + "experts.gate_up_proj" in index:
        return {
            "mlp.experts.gate_up": ("fused", moe + "experts.gate_up_proj"),
            "mlp.experts.down": ("fused", moe + "experts.down_proj"),
        }
    gate, up, down = ([f"{moe}experts.{e}.{p}.weight" for e in range(n)] for p in names)
    return {
        "mlp.experts.gate_up": ("experts", list(zip(gate, up, strict=True))),
        "mlp.experts.down": ("experts", [(d,) for d in down]),
    }


def shared_mlp(prefix: str) -> dict[str, Any]:
    """A shared expert kept as gate_proj/up_proj/down_proj (DeepSeek, ERNIE; Qwen2-MoE adds its gate)."""
    return {
        "mlp.shared_experts.gate_up": ("experts", [(prefix + "gate_proj.weight", prefix + "up_proj.weight")]),
        "mlp.shared_experts.down": prefix + "down_proj.weight",
    }


def halves_order(heads: int, head_width: int, start: int, rotary: int) -> torch.Tensor:
    """Row order that turns interleaved rotary pairs (x0, x1), (x2, x3), ... into halves
    (x0, x2, ...; x1, x3, ...), per head, for the rotary_width rows from offset start of
    each head of head_width rows (the rest keep their place).

    Queries and keys permuted alike give the same scores (q . k sums over the same pairs),
    and with halves deamoe-trt's rotary (apply_rope) rotates pair i by frequency i exactly
    as the interleaved form does, so the import stays exact."""
    order = torch.arange(heads * head_width).view(heads, head_width)
    part = order[:, start : start + rotary]
    order[:, start : start + rotary] = torch.cat((part[:, 0::2], part[:, 1::2]), dim=1)
    return order.reshape(-1)


def permuted_rows(source: str, shape: tuple[int, ...], order: torch.Tensor) -> Derived:
    return transformed(source, shape, lambda t: t[order])
