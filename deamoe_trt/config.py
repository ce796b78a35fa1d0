"""The DeaMoE layer's configuration: every size and routing choice of the spec, validated."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError

SCORE_FUNCS = ("softmax", "sigmoid")
DEPARTMENT_SCORES = ("max", "sum_top2", "sum")
ACTIVATIONS = ("swiglu", "swiglu_clamped")


class ConfigError(UsageError, ValueError):
    """An impossible configuration; the message names the field and what it allows."""


@dataclass(frozen=True)
class DeaMoEConfig:
    """Sizes and routing of one DeaMoE layer (see docs/spec.md, "Sizes" and "The layer").

    Spec symbols: d = hidden_size, D = num_departments, m = experts_per_department,
    f_s = shared_intermediate_size, f_p = private_intermediate_size, k = top_k,
    g = top_departments, f_sh = shared_expert_intermediate_size.
    """

    hidden_size: int
    num_departments: int
    experts_per_department: int
    shared_intermediate_size: int
    private_intermediate_size: int
    top_k: int
    top_departments: int
    score_func: str = "softmax"
    department_score: str = "max"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    router_bias: bool = False
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    # Third-wave extensions (spec, "Extensions (third wave)"); their defaults are the layer
    # without them, and to_dict leaves them out at their defaults so older configs and
    # checkpoints read and write unchanged.
    ffn_bias: bool = False
    activation: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    router_logit_bias: bool = False

    def __post_init__(self) -> None:
        _validate(self)
        # JSON may carry 2 for 2.0; keep one type so equality and hashing behave.
        for name in ("routed_scaling_factor", "swiglu_alpha", "swiglu_limit"):
            object.__setattr__(self, name, float(getattr(self, name)))

    # Derived sizes -------------------------------------------------------------------

    @property
    def num_experts(self) -> int:
        """N = D * m routed experts."""
        return self.num_departments * self.experts_per_department

    @property
    def expert_intermediate_size(self) -> int:
        """Width of one expert as a plain SwiGLU block: f_s + f_p."""
        return self.shared_intermediate_size + self.private_intermediate_size

    @property
    def has_shared_experts(self) -> bool:
        return self.shared_expert_intermediate_size > 0

    # Related layers ------------------------------------------------------------------

    def expanded(self) -> DeaMoEConfig:
        """Same routing, every department's shared neurons copied into its experts."""
        return self.replace(
            shared_intermediate_size=0,
            private_intermediate_size=self.expert_intermediate_size,
        )

    def vanilla(self) -> DeaMoEConfig:
        """The one-stage top-k MoE a user runs today: expanded experts, one department."""
        return self.expanded().replace(
            num_departments=1,
            experts_per_department=self.num_experts,
            top_departments=1,
        )

    def replace(self, **changes: Any) -> DeaMoEConfig:
        return dataclasses.replace(self, **changes)

    def differences(self, other: DeaMoEConfig) -> list[str]:
        """'field a vs b' for every field where other differs from this config, in field order."""
        a, b = dataclasses.asdict(self), dataclasses.asdict(other)
        return [f"{name} {a[name]!r} vs {b[name]!r}" for name in a if a[name] != b[name]]

    # JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        clamped = self.activation == "swiglu_clamped"
        for name in OPTIONAL_FIELDS:
            # A clamped activation always states its alpha and limit.
            keep = clamped if name in CLAMP_FIELDS else data[name] != _DEFAULTS[name]
            if not keep:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeaMoEConfig:
        check_fields(cls, data, "config")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> DeaMoEConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | Path) -> DeaMoEConfig:
        return cls.from_json(Path(path).read_text())


def top_k_moe(*, hidden_size: int, num_experts: int, intermediate_size: int, top_k: int, **fields: Any) -> DeaMoEConfig:
    """A vanilla top-k MoE layer as a DeaMoE layer: one department holding every expert (D = 1,
    g = 1) and no department-shared neurons (f_s = 0), the spec's special case that existing
    MoE models are. fields: any other DeaMoEConfig field (routing options, shared experts,
    activation)."""
    return DeaMoEConfig(
        hidden_size=hidden_size,
        num_departments=1,
        experts_per_department=num_experts,
        shared_intermediate_size=0,
        private_intermediate_size=intermediate_size,
        top_k=top_k,
        top_departments=1,
        **fields,
    )


# Fields written to JSON only when they differ from their defaults (see DeaMoEConfig).
OPTIONAL_FIELDS = ("ffn_bias", "activation", "swiglu_alpha", "swiglu_limit", "router_logit_bias")
CLAMP_FIELDS = ("swiglu_alpha", "swiglu_limit")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DeaMoEConfig)}


def check_fields(cls: type, data: Any, label: str) -> None:
    """data is a JSON object holding every required field of dataclass cls and no other."""
    if not isinstance(data, dict):
        raise ConfigError(f"{label} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown {label} field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise ConfigError(f"{label} is missing required field(s) {', '.join(missing)}")


def _validate(cfg: DeaMoEConfig) -> None:
    def fail(field: str, allowed: str, value: Any) -> None:
        raise ConfigError(f"{field} must be {allowed}, got {value!r}")

    for name in ("hidden_size", "num_departments", "experts_per_department", "top_k", "top_departments"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 1:
            fail(name, "an integer >= 1", value)
    for name in ("shared_intermediate_size", "private_intermediate_size", "shared_expert_intermediate_size"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 0:
            fail(name, "an integer >= 0", value)
    for name in ("norm_topk_prob", "router_bias", "shared_expert_gate", "ffn_bias", "router_logit_bias"):
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            fail(name, "true or false", value)
    if cfg.shared_intermediate_size == 0 and cfg.private_intermediate_size == 0:
        raise ConfigError(
            "shared_intermediate_size and private_intermediate_size are both 0; at least one must be >= 1"
        )
    if cfg.score_func not in SCORE_FUNCS:
        fail("score_func", " or ".join(repr(s) for s in SCORE_FUNCS), cfg.score_func)
    if cfg.department_score not in DEPARTMENT_SCORES:
        fail("department_score", ", ".join(repr(s) for s in DEPARTMENT_SCORES), cfg.department_score)
    if cfg.department_score == "sum_top2" and cfg.experts_per_department < 2:
        raise ConfigError(
            "department_score 'sum_top2' needs experts_per_department >= 2, "
            f"got {cfg.experts_per_department}; use 'max' or 'sum'"
        )
    if cfg.top_departments > cfg.num_departments:
        fail("top_departments", f"<= num_departments ({cfg.num_departments})", cfg.top_departments)
    room = cfg.top_departments * cfg.experts_per_department
    if cfg.top_k > room:
        fail("top_k", f"<= top_departments * experts_per_department ({room})", cfg.top_k)
    scale = cfg.routed_scaling_factor
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        fail("routed_scaling_factor", "a finite number > 0", scale)
    if cfg.shared_expert_gate and cfg.shared_expert_intermediate_size == 0:
        raise ConfigError("shared_expert_gate is true but shared_expert_intermediate_size is 0; set both or neither")
    if cfg.activation not in ACTIVATIONS:
        fail("activation", " or ".join(repr(a) for a in ACTIVATIONS), cfg.activation)
    for name in ("swiglu_alpha", "swiglu_limit"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            fail(name, "a finite number > 0", value)
    if cfg.ffn_bias and cfg.private_intermediate_size == 0:
        # experts.down_bias [N, d] belongs to the experts' private part (departments have no
        # down bias), so a biased layer keeps at least one private neuron per expert.
        raise ConfigError("ffn_bias needs private_intermediate_size >= 1 (each expert keeps its own down bias)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
