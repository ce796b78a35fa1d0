"""The contenders the benchmark times, and the memory plan that decides which of them fit.

A contender is one model kind on one runtime:
  model:   deamoe (the layer), expanded (its twin without sharing: same routing, shared
           neurons copied into every expert), vanilla (one-stage top-k over the twin's
           experts: what users run today);
  runtime: cpu (deamoe_trt.cpu's kernel), ort (ONNX Runtime CPU, the export's `ort` form;
           for vanilla, com.microsoft.MoE's own routing), torch (the PyTorch reference),
           each through its deamoe_trt.runtimes implementation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import runtimes
from ..config import DeaMoEConfig
from ..errors import MissingDependencyError, one_line
from ..runtimes.base import Prepared, identity
from ..traffic import layer_bytes
from .options import PRIORITY, BenchOptions

MODELS = ("deamoe", "expanded", "vanilla")
# Resident memory of an ONNX Runtime CPU session over its weights, measured with the qwen3
# layer's twins (2.42 GB of weights: +4.85 GB; the same with pre-packing disabled).
ORT_RESIDENT_FACTOR = 2


def not_prepared(x: Any) -> Any:
    raise RuntimeError("this contender was not prepared: it has nothing to run")


@dataclass
class Contender:
    name: str
    model: str
    runtime: str
    run: Callable[[Any], Any] = not_prepared  # one step on a prepared input
    prepare: Callable[[torch.Tensor], Any] = identity  # torch input -> runtime input (not timed)
    to_torch: Callable[[Any], torch.Tensor] = identity  # runtime output -> torch (for checks)
    memory_bytes: int = 0
    cooldown_s: float = 0.0  # pause after each call, so its spinning threads are asleep before the next
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    info: dict = field(default_factory=dict)
    keep_alive: Any = None  # what run needs alive (an ONNX Runtime session's weight arrays)

    def take(self, prepared: Prepared) -> Contender:
        """Runs what a runtime prepared (deamoe_trt.runtimes)."""
        self.run, self.prepare, self.to_torch = prepared.run, prepared.to_input, prepared.to_torch
        self.memory_bytes, self.info, self.keep_alive = prepared.memory_bytes, prepared.info, prepared.keep_alive
        return self

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "model": self.model,
            "runtime": self.runtime,
            "runtime_label": runtimes.get(self.runtime).label,
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


# ---------------------------------------------------------------------------------------------
# The contender factory: a module on a runtime, checked against the reference on the check inputs.
# ---------------------------------------------------------------------------------------------

# Largest |output - reference| accepted, relative to max |reference|, before a contender is
# flagged (not dropped): fp32 runtimes agree to ~1e-6, fp16 ones to ~1e-3.
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float16: 3e-2}


# Pauses after a runtime whose threads keep spinning once a call returns, measured on the
# development machine: PyTorch's OpenMP workers spin ~10 ms, ONNX Runtime's ~40 ms when its
# intra-op spinning is on (its default). Whoever ran next would otherwise share its cores
# with them. ONNX Runtime runs with spinning off here: measured interleaved, spinning made
# its own steps no faster (4.1-4.3 ms against 4.0 ms on a 64-expert layer) and, unless it
# was followed by a 60 ms pause, slowed the next contender by up to 1.8x. --ort-spinning on
# restores it, with that pause.
TORCH_COOLDOWN_S = 0.02
ORT_SPINNING_COOLDOWN_S = 0.06


def build_contender(name: str, module, threads: int, options: BenchOptions, ref: dict, checks: dict) -> Contender:
    model, runtime = name.split("/")
    contender = Contender(name, model, runtime, cooldown_s=options.gap_ms / 1e3)
    if options.gap_ms > 0 and runtime == "torch":
        contender.cooldown_s = max(contender.cooldown_s, TORCH_COOLDOWN_S)
    if options.gap_ms > 0 and runtime == "ort" and options.ort_spinning:
        contender.cooldown_s = max(contender.cooldown_s, ORT_SPINNING_COOLDOWN_S)
    try:
        extra = {"spinning": options.ort_spinning} if runtime == "ort" else {}
        contender.take(runtimes.get(runtime).prepare(module, threads=threads, **extra))
        # A runtime that cannot run this model (ORT or PyTorch without fp16 CPU kernels...)
        # fails here, on the check inputs, rather than in the middle of the timed loop.
        contender.info["max_abs_diff"] = _check(contender, ref, checks)
    except MissingDependencyError as exc:
        contender.status, contender.reason = "skipped", one_line(exc, limit=300)
        return contender
    except Exception as exc:  # one contender failing must not end the benchmark
        contender.status, contender.reason = "failed", f"{type(exc).__name__}: {one_line(exc, limit=300)}"
        contender.run = not_prepared
        return contender
    dtype = next(iter(checks.values())).dtype
    scale = max(float(r.abs().max()) for r in ref.values())
    if contender.info["max_abs_diff"] > CHECK_TOLERANCE[dtype] * max(scale, 1e-6):
        contender.info["warning"] = f"outputs differ from the PyTorch reference by {contender.info['max_abs_diff']:.3g}"
    return contender


def _check(contender: Contender, ref: dict, checks: dict) -> float:
    worst = 0.0
    for tokens, x in checks.items():
        y = contender.to_torch(contender.run(contender.prepare(x))).float()
        worst = max(worst, float((y - ref[tokens]).abs().max()))
    return worst


def reference_outputs(module, checks: dict) -> dict:
    with torch.inference_mode():
        return {t: module(x).float() for t, x in checks.items()}
