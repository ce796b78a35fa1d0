"""The decoder-only language model's configuration: attention sizes plus one DeaMoEConfig for every block."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, DeaMoEConfig, check_fields


@dataclass(frozen=True)
class LMConfig:
    """Sizes of a decoder-only DeaMoE language model (Llama/Qwen3-MoE layout).

    Every block is RMSNorm -> causal self-attention (rotary embeddings, grouped-query heads,
    KV cache) -> residual -> RMSNorm -> DeaMoE FFN -> residual; then a final RMSNorm and an
    untied LM head. `moe.hidden_size` must equal `hidden_size`.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    moe: DeaMoEConfig
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):
            object.__setattr__(self, "moe", DeaMoEConfig.from_dict(self.moe))
        _validate(self)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rms_norm_eps", float(self.rms_norm_eps))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    # Twins, as DeaMoEConfig.expanded()/vanilla() for the FFN of every block -----------------

    def expanded(self) -> LMConfig:
        return self.replace(moe=self.moe.expanded())

    def vanilla(self) -> LMConfig:
        return self.replace(moe=self.moe.vanilla())

    def replace(self, **changes: Any) -> LMConfig:
        return dataclasses.replace(self, **changes)

    # JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["moe"] = self.moe.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMConfig:
        check_fields(cls, data, "LM config")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> LMConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None


def _validate(cfg: LMConfig) -> None:
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_key_value_heads",
        "max_position_embeddings",
    ):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(cfg.moe, DeaMoEConfig):
        raise ConfigError(f"moe must be a DeaMoEConfig or its JSON object, got {type(cfg.moe).__name__}")
    if cfg.moe.hidden_size != cfg.hidden_size:
        raise ConfigError(f"moe.hidden_size ({cfg.moe.hidden_size}) must equal hidden_size ({cfg.hidden_size})")
    if cfg.hidden_size % cfg.num_heads:
        raise ConfigError(f"hidden_size ({cfg.hidden_size}) must be a multiple of num_heads ({cfg.num_heads})")
    if cfg.head_dim % 2:
        raise ConfigError(f"head_dim (hidden_size / num_heads = {cfg.head_dim}) must be even for rotary embeddings")
    if cfg.num_heads % cfg.num_key_value_heads:
        raise ConfigError(
            f"num_heads ({cfg.num_heads}) must be a multiple of num_key_value_heads ({cfg.num_key_value_heads})"
        )
    for name in ("rope_theta", "rms_norm_eps"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
