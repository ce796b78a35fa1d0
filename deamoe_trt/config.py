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


class ConfigError(UsageError, ValueError):
    """An impossible configuration; the message names the field and what it allows."""


@dataclass(frozen=True)
class DeaMoEConfig:
    """Sizes and routing of one DeaMoE layer (see ../shared/deamoe-spec.md, "The layer").

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

    def __post_init__(self) -> None:
        _validate(self)
        # JSON may carry 2 for 2.0; keep one type so equality and hashing behave.
        object.__setattr__(self, "routed_scaling_factor", float(self.routed_scaling_factor))

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
        a, b = self.to_dict(), other.to_dict()
        return [f"{name} {a[name]!r} vs {b[name]!r}" for name in a if a[name] != b[name]]

    # JSON -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
    for name in ("norm_topk_prob", "router_bias", "shared_expert_gate"):
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
