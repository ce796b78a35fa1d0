"""The contenders the benchmark times, and the memory plan that decides which of them fit.

A contender is one model kind on one runtime:
  model:   deamoe (the layer), expanded (its twin without sharing: same routing, shared
           neurons copied into every expert), vanilla (one-stage top-k over the twin's
           experts: what users run today);
  runtime: cpu (deamoe_trt.cpu's kernel), ort (ONNX Runtime CPU, the export's `ort` form;
           for vanilla, com.microsoft.MoE's own routing), torch (the PyTorch reference).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import DeaMoEConfig
from ..traffic import layer_bytes

MODELS = ("deamoe", "expanded", "vanilla")
RUNTIMES = ("cpu", "ort", "torch")
# Build (and keep) order: the most informative first, so a tight memory budget keeps them.
PRIORITY = ("deamoe/cpu", "expanded/cpu", "vanilla/ort", "deamoe/ort", "expanded/ort", "deamoe/torch", "expanded/torch")
# Resident memory of an ONNX Runtime CPU session over its weights, measured with the qwen3
# layer's twins (2.42 GB of weights: +4.85 GB; the same with pre-packing disabled).
ORT_RESIDENT_FACTOR = 2
RUNTIME_LABELS = {"cpu": "deamoe-trt CPU kernel", "ort": "ONNX Runtime CPU", "torch": "PyTorch reference"}


@dataclass
class Contender:
    name: str
    model: str
    runtime: str
    run: Callable[[Any], Any] | None = None  # one step on a prepared input
    prepare: Callable[[torch.Tensor], Any] | None = None  # torch input -> runtime input (not timed)
    to_torch: Callable[[Any], torch.Tensor] | None = None  # runtime output -> torch (for checks)
    memory_bytes: int = 0
    cooldown_s: float = 0.0  # pause after each call, so its spinning threads are asleep before the next
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "model": self.model,
            "runtime": self.runtime,
            "runtime_label": RUNTIME_LABELS[self.runtime],
            "status": self.status,
            "memory_bytes": self.memory_bytes,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.status == "ok":
            out["cooldown_s"] = self.cooldown_s
        out.update(self.info)
        return out


@dataclass
class MemoryPlan:
    """Which contenders to build within a memory budget, and why the others are skipped.

    Peak estimate: the DeaMoE layer in torch, the expanded twin in torch (needed to build any
    expanded or vanilla contender; vanilla shares its tensors), one transient copy of the
    largest model being converted (expanded() and ONNX export both copy), and every kept
    contender's own weights (torch contenders reuse the source layers: no extra; an ONNX
    Runtime session holds ORT_RESIDENT_FACTOR times its weights)."""

    budget: int
    deamoe_bytes: int
    expanded_bytes: int
    kept: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    peak: int = 0

    @classmethod
    def make(cls, config: DeaMoEConfig, dtype: torch.dtype, budget: int, wanted: list[str]) -> MemoryPlan:
        plan = cls(budget, layer_bytes(config, dtype), layer_bytes(config.expanded(), dtype))
        base = plan.deamoe_bytes
        plan.peak = base
        extra = 0
        for name in [n for n in PRIORITY if n in wanted]:
            model, runtime = name.split("/")
            weights = plan.deamoe_bytes if model == "deamoe" else plan.expanded_bytes
            own = {"torch": 0, "cpu": weights, "ort": ORT_RESIDENT_FACTOR * weights}[runtime]
            needs_twin = model != "deamoe" and not any(k.split("/")[0] != "deamoe" for k in plan.kept)
            transient = weights if runtime == "ort" else 0  # the ONNX model while the session loads it
            if model != "deamoe" and needs_twin:
                transient = max(transient, plan.expanded_bytes)
            cost = own + (plan.expanded_bytes if needs_twin else 0)
            peak = base + extra + cost + transient
            if peak > budget:
                plan.skipped[name] = (
                    f"needs about {_gb(peak)} in all with the contenders before it; {_gb(budget)} may be used here"
                )
                continue
            extra += cost
            plan.kept.append(name)
            plan.peak = max(plan.peak, peak)
        return plan


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start
