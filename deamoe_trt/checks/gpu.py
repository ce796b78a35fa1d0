"""GPU check of the DeaMoE CUDA kernels: correctness against the PyTorch reference, then speed.

    deamoe-trt check-gpu --out DIR        (or: python -m deamoe_trt.checks.gpu --out DIR)

On any CUDA machine with PyTorch. It
1. builds the kernels for the local GPU only (CMake + nvcc, cached in ~/.cache/deamoe_trt);
2. measures the device copy bandwidth (a 1 GiB device-to-device copy; bytes read + written)
   and a read-only bandwidth;
3. checks, per preset and dtype, the kernels' routing (exact ids vs the reference; any
   difference must be a near-tie of the scores) and outputs (float32: allclose; fp16/bf16:
   relative error against float32 math on the same weights, from the kernels' routing);
   The int4/int8 rows (--bits) do the same for layer.quantized(QuantConfig(bits, G)) (the
   largest group size dividing every width) against the PyTorch reference running the
   dequantized weights;
4. times DeaMoE forward at 1/2/4/8/16 tokens: the kernels, the same kernels on
   layer.expanded() (f_s = 0, f_p = f_s + f_p; for int4/int8 the quantized twin, same codes)
   and the PyTorch reference, with CUDA events,
   warm-up, a fresh pre-generated input per iteration and the L2 flushed (read of a 1 GiB
   buffer) before each; eager launches and CUDA-graph replay; programmatic dependent launch
   off and on. Reports bytes loaded per step (deamoe_trt.traffic.weights_loaded on the
   kernels' routing of that input), achieved bandwidth, its fraction of the copy bandwidth
   and the speedups; per kernel (torch.profiler, 1 token), its time, its bytes
   (deamoe_trt.perf_model's per-kernel account of the same routing), its bandwidth and the
   model's predicted time for this GPU;
5. writes DIR/gpu_check.json (everything) and DIR/gpu_check.txt (the tables), prints them.
Exit status 0 when every correctness check passed (performance targets are reported, not
enforced), 1 otherwise. Designed to finish in under 5 minutes on an H200 (--budget-s).

--dry-run runs the same flow on the CPU through the SIMT-emulated kernel library
(deamoe_trt.checks.emulated; needs a source checkout) with shrunken presets: a check of
this script, not of the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import perf_model
from ..activation import glu
from ..bench.timing import percentile
from ..config import DeaMoEConfig
from ..layer import DeaMoELayer
from ..presets import PRESETS
from ..quant import GROUP_SIZES, QuantConfig, dense
from ..routing import Routing, route_logits
from ..traffic import weights_loaded
from .emulated import build_emulated_library

T0 = time.perf_counter()
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# Relative error bounds against float32 math on the same weights (see MODE note in main()).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
NEAR_TIE = 1e-5  # score units: routing differences closer than this are float rounding

# gpt-oss-20b's FFN in department form (d = 2880, 32 experts, top-4, every expert's width
# 2880 split into shared and private halves; FFN biases, the clamped SwiGLU, a router logit
# bias), with a shared expert gpt-oss does not have, so that every bias kind runs.
GPT_OSS_LAYER = DeaMoEConfig(
    hidden_size=2880,
    num_departments=4,
    experts_per_department=8,
    shared_intermediate_size=1440,
    private_intermediate_size=1440,
    top_k=4,
    top_departments=2,
    shared_expert_intermediate_size=512,
    ffn_bias=True,
    activation="swiglu_clamped",
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    router_logit_bias=True,
)
# What check-gpu can run: the presets and the extra layers above.
CASES = {**PRESETS, "gpt-oss-20b-style": GPT_OSS_LAYER}
TARGET_SPEEDUP = 1.9  # deepseek-v3-layer, bf16 (and bf16-int4), 1 token, vs the expanded twin
TARGET_KINDS = ("bf16", "bf16-int4")
TARGET_COPY_FRACTION = 0.75


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {message}", flush=True)


def elapsed() -> float:
    return time.perf_counter() - T0


# ---------------------------------------------------------------------------------------
# Backends: the GPU (deamoe_trt.cuda, CUDA events) or the emulated library on the CPU.


class GpuBackend:
    name = "cuda"
    device = torch.device("cuda")

    def __init__(self, library: str | None):
        from deamoe_trt import cuda

        self.cuda = cuda
        started = time.perf_counter()
        self.lib = cuda.load_library(library)
        self.build_seconds = time.perf_counter() - started
        self.library_path = self.lib._name

    def forward(self, layer, x):
        return self.cuda.forward(layer, x)

    def route(self, layer, x):
        return self.cuda.route(layer, x)

    def router_logits(self, layer, x):
        return self.cuda.router_logits(layer, x)

    def set_programmatic_launch(self, enabled: bool) -> bool:
        return self.cuda.set_programmatic_launch(enabled)

    def sync(self) -> None:
        torch.cuda.synchronize()

    def time_each(self, run, count: int, before=None) -> list[float]:
        """Microseconds of run(i) for i < count, each between two CUDA events."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            if before is not None:
                before(i)
            starts[i].record()
            run(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [1e3 * s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    def graph(self, fn, static_input):
        """A replayable capture of fn(static_input), or None when capture fails."""
        fn(static_input)  # warm: library loaded, allocator primed
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(static_input)
        return graph


class EmulatedBackend:
    """The SIMT-emulated kernel library (tests/plugins/deamoe) on CPU tensors."""

    name = "emulated"
    device = torch.device("cpu")

    def __init__(self, library: str | None):
        from deamoe_trt.cuda import _abi, _ops

        self._ops = _ops
        started = time.perf_counter()
        path = Path(library) if library else self._build()
        self.lib = _abi.bind(ctypes.CDLL(str(path)))
        self.build_seconds = time.perf_counter() - started
        self.library_path = str(path)

    @staticmethod
    def _build() -> Path:
        return build_emulated_library(Path("/tmp") / "deamoe_gpu_check_dry_run" / "libdeamoe_emulated.so")

    def forward(self, layer, x):
        return self._ops.forward_with(self.lib, layer, x)

    def route(self, layer, x):
        return self._ops.route_with(self.lib, layer, x)

    def router_logits(self, layer, x):
        return self._ops.router_logits_with(self.lib, layer, x)

    def set_programmatic_launch(self, enabled: bool) -> bool:
        previous = bool(self.lib.deamoe_programmatic_launch())
        self.lib.deamoe_set_programmatic_launch(int(enabled))
        return previous

    def sync(self) -> None:
        pass

    def time_each(self, run, count: int, before=None) -> list[float]:
        times = []
        for i in range(count):
            if before is not None:
                before(i)
            started = time.perf_counter()
            run(i)
            times.append(1e6 * (time.perf_counter() - started))
        return times

    def graph(self, fn, static_input):
        return None


# ---------------------------------------------------------------------------------------
# Layers


def layer_bytes(config: DeaMoEConfig, bytes_per_weight: int) -> int:
    c = config
    d = c.hidden_size
    params = c.num_experts * d + (c.num_experts if c.router_bias else 0)
    params += c.num_departments * 3 * c.shared_intermediate_size * d
    params += c.num_experts * 3 * c.private_intermediate_size * d
    params += 3 * c.shared_expert_intermediate_size * d + (d if c.shared_expert_gate else 0)
    params += c.num_experts if c.router_logit_bias else 0
    if c.ffn_bias:
        params += 2 * (c.num_departments * c.shared_intermediate_size + c.num_experts * c.private_intermediate_size)
        params += c.num_experts * d + (2 * c.shared_expert_intermediate_size + d if c.has_shared_experts else 0)
    return params * bytes_per_weight


@torch.no_grad()
def random_layer(config: DeaMoEConfig, dtype: torch.dtype, device: torch.device, seed: int) -> DeaMoELayer:
    """DeaMoELayer.random's distribution; big layers are drawn in place on the GPU (the 6.3 GB
    deepseek preset would take minutes through random()'s CPU float32 path)."""
    if device.type == "cpu" or layer_bytes(config, 4) < 2 * 2**30:
        return DeaMoELayer.random(config, seed=seed, dtype=dtype).to(device)
    return DeaMoELayer.random(config, seed=seed, dtype=dtype, device=device, low_memory=True)


def kind(layer: DeaMoELayer) -> str:
    """The layer's dtype and, when quantized, its weight format: "bf16", "bf16-int4"."""
    name = DTYPE_NAMES[layer.dtype]
    return f"{name}-int{layer.quant.bits}" if layer.quant is not None else name


def group_size_for(config: DeaMoEConfig) -> int:
    """The largest group size dividing every quantized width (tiny: 16, the big presets: 128)."""
    widths = [config.hidden_size, config.shared_intermediate_size, config.private_intermediate_size,
              config.shared_expert_intermediate_size]  # fmt: skip
    return max(g for g in GROUP_SIZES if all(w % g == 0 for w in widths))


@torch.no_grad()
def quantized_layer(config: DeaMoEConfig, dtype: torch.dtype, device: torch.device, seed: int, bits: int):
    """random_layer's layer with its FFN weights quantized (round to nearest, on the device);
    the float layer is freed before returning."""
    layer = random_layer(config, dtype, device, seed)
    quantized = layer.quantized(QuantConfig(bits, group_size_for(config)))
    del layer
    free()
    return quantized


def free(*objects) -> None:
    for obj in objects:
        del obj
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
# Correctness


def swiglu32(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    config: DeaMoEConfig,
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The layer's activation (deamoe_trt.activation.glu) on float32 math, biases included."""
    gate_up_out = x @ gate_up.float().t()
    if gate_up_bias is not None:
        gate_up_out = gate_up_out + gate_up_bias.float()
    gate, up = gate_up_out.chunk(2, dim=-1)
    out = glu(gate, up, config) @ down.float().t()
    return out if down_bias is None else out + down_bias.float()


def _row(bias: torch.Tensor | None, index: int) -> torch.Tensor | None:
    return None if bias is None else bias[index]


@torch.no_grad()
def reference_fp32(layer: DeaMoELayer, x: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The spec's output in float32 from the layer's weights (a quantized layer's dequantized
    ones), for the given routing; casts only the parts the routing uses (memory-light for
    the big presets)."""
    c = layer.config
    xf = x.reshape(-1, c.hidden_size).float()
    out = torch.zeros_like(xf)
    if layer.departments is not None:
        weights = routing.department_weights(c.num_departments)
        for j in routing.used_departments().tolist():
            tokens = (routing.department_ids == j).any(dim=-1).nonzero().squeeze(-1)
            part = layer.departments
            y = swiglu32(xf[tokens], part.gate_up[j], part.down[j], c, _row(part.gate_up_bias, j))
            out.index_add_(0, tokens, y * weights[tokens, j, None])
    if layer.experts is not None:
        for e in routing.used_experts().tolist():
            tokens, slots = (routing.expert_ids == e).nonzero(as_tuple=True)
            part = layer.experts
            y = swiglu32(
                xf[tokens], part.gate_up[e], part.down[e], c, _row(part.gate_up_bias, e), _row(part.down_bias, e)
            )
            out.index_add_(0, tokens, y * routing.weights[tokens, slots, None])
    if layer.shared_experts is not None:
        shared = layer.shared_experts
        y = swiglu32(xf, dense(shared.gate_up), dense(shared.down), c, shared.gate_up_bias, shared.down_bias)
        if layer.shared_experts.gate is not None:
            y = y * torch.sigmoid(xf @ layer.shared_experts.gate.float().t())
        out += y
    return out


def decision_margin(config: DeaMoEConfig, logits: torch.Tensor, bias: torch.Tensor | None) -> float:
    """Smallest score gap that decides one token's routing (stage-1 order up to g+1, stage-2
    order up to k+1): a routing difference at a gap below NEAR_TIE is float rounding."""
    c = config
    z = logits.float().cpu()
    s = torch.softmax(z, -1) if c.score_func == "softmax" else torch.sigmoid(z)
    sel = s + (bias.float().cpu() if bias is not None else 0.0)
    per = sel.view(c.num_departments, c.experts_per_department)
    if c.department_score == "max":
        dept = per.amax(-1)
    elif c.department_score == "sum_top2":
        dept = per.topk(2, -1).values.sum(-1)
    else:
        dept = per.sum(-1)
    gaps = []
    ranked = dept.sort(descending=True).values[: c.top_departments + 1]
    gaps += (ranked[:-1] - ranked[1:]).tolist()
    kept = dept.sort(descending=True, stable=True).indices[: c.top_departments]
    candidates = per[kept].flatten().sort(descending=True).values[: c.top_k + 1]
    gaps += (candidates[:-1] - candidates[1:]).tolist()
    return min(gaps) if gaps else math.inf


@torch.no_grad()
def check_correctness(backend, layer: DeaMoELayer, preset: str, tokens: int, seed: int) -> dict:
    c, dtype = layer.config, layer.dtype
    gen = torch.Generator(device=backend.device).manual_seed(seed)
    x = torch.randn(tokens, c.hidden_size, generator=gen, device=backend.device).to(dtype)
    result: dict = {"preset": preset, "dtype": kind(layer), "tokens": tokens}
    try:
        got = backend.route(layer, x)
        ref = layer.route(x)
        logits = backend.router_logits(layer, x)
        torch_logits = x.float() @ layer.router.weight.float().t()
        if layer.router.logit_bias is not None:
            torch_logits = torch_logits + layer.router.logit_bias
        # The decision logic alone: the reference's routing of the kernels' own logits.
        own = route_logits(logits, layer.router.bias, c)
        logic_exact = torch.equal(got.expert_ids, own.expert_ids) and torch.equal(
            got.kept_departments, own.kept_departments
        )
        rows = (got.expert_ids != ref.expert_ids).any(-1) | (got.kept_departments != ref.kept_departments).any(-1)
        mismatched = rows.nonzero().flatten().tolist()
        margins = [decision_margin(c, torch_logits[t], layer.router.bias) for t in mismatched]
        unexplained = [t for t, m in zip(mismatched, margins, strict=True) if m >= NEAR_TIE]
        weight_err = float((got.weights - own.weights).abs().max()) if tokens else 0.0
        result["routing"] = {
            "logic_exact": logic_exact,
            "tokens_differing_from_reference": len(mismatched),
            "differences_not_near_ties": len(unexplained),
            "max_logit_abs_error_vs_torch": float((logits - torch_logits).abs().max()),
            "max_weight_abs_error": weight_err,
        }
        y = backend.forward(layer, x)
        y2 = backend.forward(layer, x)
        want = reference_fp32(layer, x, got)
        err = float((y.float() - want).norm() / want.norm().clamp_min(1e-30))
        same_rows = ~rows
        native = layer(x).float()
        native_err = float(
            (y.float()[same_rows] - native[same_rows]).norm() / native[same_rows].norm().clamp_min(1e-30)
        )
        result["output"] = {
            "relative_error_vs_fp32_math": err,
            "tolerance": TOLERANCE[dtype],
            "relative_error_vs_native_reference": native_err,
            "finite": bool(torch.isfinite(y).all()),
            "deterministic": bool(torch.equal(y, y2)),
            "shape_dtype_ok": y.shape == x.shape and y.dtype == dtype,
        }
        ok = (
            logic_exact
            and not unexplained
            and err < TOLERANCE[dtype]
            and result["output"]["finite"]
            and result["output"]["deterministic"]
            and result["output"]["shape_dtype_ok"]
        )
        result["pass"] = bool(ok)
    except Exception as exc:  # recorded, and the run goes on
        result["pass"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    status = "PASS" if result["pass"] else "FAIL"
    detail = result.get("error") or (
        f"rel.err {result['output']['relative_error_vs_fp32_math']:.2e} (tol {TOLERANCE[dtype]:.0e}), "
        f"routing diffs {result['routing']['tokens_differing_from_reference']} "
        f"(not near-ties: {result['routing']['differences_not_near_ties']}), "
        f"logic exact {result['routing']['logic_exact']}"
    )
    log(f"  {status} {preset} {kind(layer)} T={tokens}: {detail}")
    return result


# ---------------------------------------------------------------------------------------
# Bandwidth and benchmarks


def measure_bandwidth(backend, size_bytes: int, repeats: int) -> dict:
    n = size_bytes // 4
    src = torch.rand(n, device=backend.device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
        src.amax()
    copy_us = statistics.median(backend.time_each(lambda i: dst.copy_(src), repeats))
    read_us = statistics.median(backend.time_each(lambda i: src.amax(), repeats))
    free(src, dst)
    return {
        "buffer_bytes": n * 4,
        "copy_GBps": 2 * n * 4 / copy_us / 1e3,  # bytes read + written
        "read_GBps": n * 4 / read_us / 1e3,
        "copy_us": copy_us,
        "read_us": read_us,
    }


def step_bytes(config: DeaMoEConfig, routing: Routing, bytes_per_weight: int, quant: QuantConfig | None) -> int:
    return int(weights_loaded(config, routing, bytes_per_weight, quant).total)


@dataclass
class Timing:
    variant: str  # deamoe | expanded | torch
    mode: str  # eager | graph
    pdl: bool
    times_us: list[float]
    bytes_per_step: list[int] = field(default_factory=list)

    def summary(self, copy_GBps: float) -> dict:
        t = sorted(self.times_us)
        out = {
            "variant": self.variant,
            "mode": self.mode,
            "pdl": self.pdl,
            "iterations": len(t),
            "median_us": statistics.median(t),
            "p10_us": percentile(t, 10),
            "p90_us": percentile(t, 90),
        }
        if self.bytes_per_step:
            per_iter = [b / us / 1e3 for b, us in zip(self.bytes_per_step, self.times_us, strict=True)]
            out["bytes_per_step_mean"] = statistics.mean(self.bytes_per_step)
            out["bandwidth_GBps"] = statistics.median(per_iter)
            out["copy_fraction"] = out["bandwidth_GBps"] / copy_GBps if copy_GBps else None
        return out


class Bench:
    def __init__(self, backend, iters: int, torch_iters: int, flush_bytes: int):
        self.backend = backend
        self.iters = iters
        self.torch_iters = torch_iters
        self.flush = torch.empty(max(flush_bytes // 4, 1), device=backend.device)
        self.flush.uniform_()

    def before(self, i: int) -> None:
        # A read-only sweep: evicts the weights from L2 without dirtying it, and keeps the GPU
        # busy long enough (~0.25 ms for 1 GiB) for the host to enqueue the whole timed call,
        # so eager timings measure the GPU, not Python's launch overhead.
        self.flush.amax()

    def kernels(self, variant: str, layer, xs, routing_bytes, pdl: bool) -> list[Timing]:
        b = self.backend
        previous = b.set_programmatic_launch(pdl)
        try:
            with torch.no_grad():
                for i in range(min(3, len(xs))):
                    b.forward(layer, xs[i])
                b.sync()
                eager = Timing(
                    variant, "eager", pdl, b.time_each(lambda i: b.forward(layer, xs[i]), len(xs), self.before)
                )
                eager.bytes_per_step = routing_bytes
                timings = [eager]
                static = xs[0].clone()
                graph = None
                with contextlib.suppress(Exception):
                    graph = b.graph(lambda x: b.forward(layer, x), static)
                if graph is not None:

                    def before(i: int) -> None:
                        static.copy_(xs[i])
                        self.before(i)

                    replay = Timing(variant, "graph", pdl, b.time_each(lambda i: graph.replay(), len(xs), before))
                    replay.bytes_per_step = routing_bytes
                    timings.append(replay)
                    del graph
            return timings
        finally:
            b.set_programmatic_launch(previous)

    def reference(self, layer, xs) -> Timing:
        count = min(self.torch_iters, len(xs))
        with torch.no_grad():
            layer(xs[0])
            self.backend.sync()
            times = self.backend.time_each(lambda i: layer(xs[i]), count, self.before)
        return Timing("torch", "eager", False, times)


KERNEL_ORDER = ("routerSharedKernel", "routedKernel", "downKernel")  # K1, K2, K3


def model_device() -> perf_model.Device | None:
    """The performance model's entry for this GPU, if it has one."""
    name = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() else ""
    for key in ("h200", "h100", "a40", "orin"):
        if key in name:
            return perf_model.DEVICES[key]
    return None


def profile_kernels(backend, layer, xs, routings) -> list[dict]:
    """Per-kernel GPU time of the DeaMoE forward (torch.profiler / CUPTI), with each kernel's
    bytes (the performance model's per-kernel account of these inputs' routing), its
    bandwidth and the model's predicted time for this GPU (when it knows the GPU)."""
    if backend.name != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    c, tokens = layer.config, xs[0].shape[0]
    bytes_per_weight = torch.finfo(layer.dtype).bits // 8
    used = [(int(r.used_departments().numel()), int(r.used_experts().numel())) for r in routings]
    u_d = round(statistics.mean(u for u, _ in used))
    u_e = round(statistics.mean(u for _, u in used))
    device = model_device()
    model = perf_model.predict_step(
        c, device or perf_model.DEVICES["h200"], tokens, bytes_per_weight, u_d, u_e, quant=layer.quant
    )
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for x in xs:
            backend.forward(layer, x)
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if not (total and event.count):
            continue
        row = {"name": event.key[:120], "calls": event.count, "avg_us": total / event.count}
        for i, kernel in enumerate(KERNEL_ORDER):
            if kernel in event.key:
                row["kernel"] = f"K{i + 1}"
                row["bytes"] = model[i].weight_bytes
                row["bandwidth_GBps"] = model[i].weight_bytes / row["avg_us"] / 1e3
                if device is not None:
                    row["predicted_us"] = 1e6 * model[i].seconds
        rows.append(row)
    rows.sort(key=lambda r: -r["avg_us"] * r["calls"])
    return rows[:12]


def bench_preset(backend, bench: Bench, preset: str, layer: DeaMoELayer, tokens: list[int], copy_GBps: float,
                 results: dict, pdl_tokens: set[int], budget_s: float) -> None:  # fmt: skip
    c = layer.config
    B = torch.finfo(layer.dtype).bits // 8
    log(f"  building the expanded twin of {preset} {kind(layer)} (f_s=0, f_p={c.expert_intermediate_size})")
    twin = layer.expanded()
    backend.sync()
    twin_config = twin.config
    try:
        for T in tokens:
            if elapsed() > budget_s:
                log(f"  time budget reached: skipping {preset} T>={T}")
                results["skipped"].append(f"{preset} benchmarks from T={T}: time budget")
                break
            gen = torch.Generator(device=backend.device).manual_seed(1000 + T)
            xs = [
                torch.randn(T, c.hidden_size, generator=gen, device=backend.device).to(layer.dtype)
                for _ in range(bench.iters)
            ]
            routings = [backend.route(layer, x) for x in xs]
            deamoe_bytes = [step_bytes(c, r, B, layer.quant) for r in routings]
            twin_bytes = [step_bytes(twin_config, r, B, layer.quant) for r in routings]
            used_d = statistics.mean(int(r.used_departments().numel()) for r in routings)
            used_e = statistics.mean(int(r.used_experts().numel()) for r in routings)
            rows = []
            for pdl in [False, True] if T in pdl_tokens else [False]:
                rows += bench.kernels("deamoe", layer, xs, deamoe_bytes, pdl)
                rows += bench.kernels("expanded", twin, xs, twin_bytes, pdl)
            rows.append(bench.reference(layer, xs))
            summaries = [row.summary(copy_GBps) for row in rows]
            entry = {
                "preset": preset,
                "dtype": kind(layer),
                "tokens": T,
                "mean_used_departments": used_d,
                "mean_used_experts": used_e,
                "timings": summaries,
            }

            def find(variant, mode="eager", pdl=False, rows=summaries):
                return next(
                    (s for s in rows if s["variant"] == variant and s["mode"] == mode and s["pdl"] == pdl), None
                )

            speedups = {}
            for mode in ("eager", "graph"):
                for pdl in (False, True):
                    d, e = find("deamoe", mode, pdl), find("expanded", mode, pdl)
                    if d and e:
                        speedups[f"vs_expanded_{mode}{'_pdl' if pdl else ''}"] = e["median_us"] / d["median_us"]
            ref, d = find("torch"), find("deamoe")
            if ref and d:
                speedups["vs_torch_eager"] = ref["median_us"] / d["median_us"]
            entry["speedups"] = speedups
            results["benchmarks"].append(entry)
            d, e, g = find("deamoe"), find("expanded"), find("deamoe", "graph")
            log(
                f"  {preset} {kind(layer)} T={T:2d}: deamoe {d['median_us']:8.1f} us "
                f"({d.get('bandwidth_GBps', 0):6.0f} GB/s, {100 * (d.get('copy_fraction') or 0):5.1f}% of copy)"
                + (f", graph {g['median_us']:8.1f} us" if g else "")
                + f" | expanded {e['median_us']:8.1f} us | x{speedups.get('vs_expanded_eager', 0):.2f} vs expanded"
                f", x{speedups.get('vs_torch_eager', 0):.1f} vs torch | U_d {used_d:.1f} U_e {used_e:.1f}"
            )
            if T in pdl_tokens and backend.name == "cuda":
                try:
                    entry["profile"] = profile_kernels(backend, layer, xs[:5], routings[:5])
                except Exception as exc:  # the profiler is optional: record why, go on
                    results["skipped"].append(f"{preset} per-kernel profile: {type(exc).__name__}: {exc}")
            del xs, routings
    finally:
        free(twin)


# ---------------------------------------------------------------------------------------
# Report


def table(results: dict) -> str:
    lines = []
    bw = results.get("bandwidth") or {}
    lines.append(
        f"device copy bandwidth {bw.get('copy_GBps', 0):.0f} GB/s (read+write), read-only {bw.get('read_GBps', 0):.0f}"
        " GB/s"
    )
    lines.append("")
    lines.append("correctness")
    for r in results["correctness"]:
        out = r.get("output") or {}
        route = r.get("routing") or {}
        lines.append(
            f"  {'PASS' if r['pass'] else 'FAIL'} {r['preset']:22s} {r['dtype']:9s} T={r['tokens']:3d} "
            + (
                f"rel.err {out.get('relative_error_vs_fp32_math', float('nan')):.1e} "
                f"routing diffs {route.get('tokens_differing_from_reference', '?')} "
                f"(non-tie {route.get('differences_not_near_ties', '?')})"
                if not r.get("error")
                else r["error"][:100]
            )
        )
    lines.append("")
    header = (
        f"  {'preset':20s} {'dt':9s} {'T':>3s} {'deamoe us':>10s} {'graph us':>9s} {'GB/s':>6s} {'%copy':>6s} "
        f"{'expand us':>10s} {'x exp':>6s} {'x exp g':>7s} {'pdl us':>8s} {'x pdl':>6s} "
        f"{'torch us':>9s} {'x torch':>7s}"
    )
    lines.append("benchmarks (medians; x exp = expanded / deamoe, eager; g = CUDA graph; pdl = programmatic launch)")
    lines.append(header)
    for b in results["benchmarks"]:
        t = {(s["variant"], s["mode"], s["pdl"]): s for s in b["timings"]}
        d = t.get(("deamoe", "eager", False), {})
        g = t.get(("deamoe", "graph", False), {})
        e = t.get(("expanded", "eager", False), {})
        p = t.get(("deamoe", "eager", True), {})
        r = t.get(("torch", "eager", False), {})
        s = b["speedups"]

        def num(value, fmt):
            width = int(fmt.split(".")[0] or 0)
            return format(value, fmt) if isinstance(value, (int, float)) else "-".rjust(width)

        lines.append(
            f"  {b['preset']:20s} {b['dtype']:9s} {b['tokens']:3d} {num(d.get('median_us'), '10.1f')} "
            f"{num(g.get('median_us'), '9.1f')} {num(d.get('bandwidth_GBps'), '6.0f')} "
            f"{num(100 * d['copy_fraction'] if d.get('copy_fraction') else None, '6.1f')} "
            f"{num(e.get('median_us'), '10.1f')} {num(s.get('vs_expanded_eager'), '6.2f')} "
            f"{num(s.get('vs_expanded_graph'), '7.2f')} {num(p.get('median_us'), '8.1f')} "
            f"{num(s.get('vs_expanded_eager_pdl'), '6.2f')} {num(r.get('median_us'), '9.1f')} "
            f"{num(s.get('vs_torch_eager'), '7.1f')}"
        )
    profiles = [(b, k) for b in results["benchmarks"] for k in b.get("profile") or [] if "kernel" in k]
    if profiles:
        lines.append("")
        lines.append("per kernel (torch.profiler; bytes and prediction from deamoe_trt.perf_model)")
        for b, k in profiles:
            predicted = f"{k['predicted_us']:8.1f}" if "predicted_us" in k else "       -"
            lines.append(
                f"  {b['preset']:20s} {b['dtype']:9s} T={b['tokens']:2d} {k['kernel']} {k['avg_us']:8.1f} us "
                f"{k['bytes'] / 1e6:8.1f} MB {k['bandwidth_GBps']:6.0f} GB/s  predicted {predicted} us"
            )
    if results.get("targets"):
        lines.append("")
        lines.append("targets (deepseek-v3-layer, 1 token; int4 against its int4 twin)")
        for name, value in results["targets"].items():
            lines.append(f"  {name}: {value}")
    if results["errors"] or results["skipped"]:
        lines.append("")
        lines += [f"  error: {e}" for e in results["errors"]] + [f"  skipped: {s}" for s in results["skipped"]]
    return "\n".join(lines)


def targets(results: dict) -> dict:
    out = {}
    for b in results["benchmarks"]:
        if b["preset"] != "deepseek-v3-layer" or b["dtype"] not in TARGET_KINDS or b["tokens"] != 1:
            continue
        t = {(s["variant"], s["mode"], s["pdl"]): s for s in b["timings"]}
        for mode in ("eager", "graph"):
            for pdl in (False, True):
                d = t.get(("deamoe", mode, pdl))
                e = t.get(("expanded", mode, pdl))
                if not d or not e:
                    continue
                key = f"{b['dtype']} {mode}{' + pdl' if pdl else ''}"
                speedup = e["median_us"] / d["median_us"]
                fraction = d.get("copy_fraction") or 0.0
                out[key] = (
                    f"speedup vs expanded {speedup:.2f} (target >= {TARGET_SPEEDUP}: "
                    f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'}), "
                    f"{100 * fraction:.1f}% of copy bandwidth (target >= {100 * TARGET_COPY_FRACTION:.0f}%: "
                    f"{'met' if fraction >= TARGET_COPY_FRACTION else 'NOT met'})"
                )
    return out


# ---------------------------------------------------------------------------------------


def shrink(config: DeaMoEConfig, multiple: int = 8) -> DeaMoEConfig:
    """The preset's routing shape at a size the emulator runs in seconds (--dry-run); widths
    are multiples of `multiple` (32 for the int4/int8 rows: whole int4 vectors and groups)."""
    scale = 64 / config.hidden_size

    def width(value: int) -> int:
        return max(multiple, int(value * scale) // multiple * multiple) if value else 0

    return config.replace(
        hidden_size=64,
        shared_intermediate_size=width(config.shared_intermediate_size),
        private_intermediate_size=width(config.private_intermediate_size),
        shared_expert_intermediate_size=width(config.shared_expert_intermediate_size),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deamoe-trt check-gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_check.json and gpu_check.txt")
    parser.add_argument("--library", help="a built libdeamoe_kernels.so (default: build for this GPU, cached)")
    parser.add_argument("--tokens", default="1,2,4,8,16", help="token counts to benchmark")
    parser.add_argument("--iters", type=int, default=40, help="timed iterations per kernel measurement")
    parser.add_argument("--torch-iters", type=int, default=10, help="timed iterations of the PyTorch reference")
    parser.add_argument("--pdl-tokens", default="1,4,16", help="token counts also timed with programmatic launch")
    parser.add_argument("--skip-bench", action="store_true", help="correctness only")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting benchmarks after this many s")
    parser.add_argument("--dry-run", action="store_true", help="CPU + SIMT-emulated kernels, shrunken presets")
    parser.add_argument(
        "--presets", default="tiny,deepseek-v3-layer,qwen3-30b-a3b-layer,gpt-oss-20b-style", help="presets to run"
    )
    parser.add_argument("--bits", default="0,4,8", help="FFN weight formats: 0 float, 4 int4, 8 int8")
    args = parser.parse_args(argv)
    global T0
    T0 = time.perf_counter()  # --budget-s counts from here, not from the import
    selected = [p for p in args.presets.split(",") if p]
    if unknown := [p for p in selected if p not in CASES]:
        print(f"check-gpu: unknown preset(s) {', '.join(unknown)}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    weight_bits = {int(b) for b in args.bits.split(",") if b.strip().isdigit()}
    if not weight_bits or not weight_bits <= {0, 4, 8}:
        print(f"check-gpu: --bits takes 0, 4 and/or 8 (float, int4, int8), got {args.bits!r}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    pdl_tokens = {int(t) for t in args.pdl_tokens.split(",") if t}

    results: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "mode": "dry-run (CPU, emulated kernels)" if args.dry_run else "gpu",
        "correctness": [],
        "benchmarks": [],
        "errors": [],
        "skipped": [],
    }
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if not args.dry_run:
        if not torch.cuda.is_available():
            print(
                "check-gpu: torch.cuda.is_available() is False; this check needs a CUDA GPU (or --dry-run)",
                file=sys.stderr,
            )
            return 2
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_GiB=round(props.total_memory / 2**30, 1),
            l2_MiB=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        )
    results["environment"] = env
    log(f"environment: {env}")

    def write() -> None:
        results["elapsed_s"] = elapsed()
        results["targets"] = targets(results)
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
        (args.out / "gpu_check.txt").write_text(table(results) + "\n")

    try:
        log("loading the kernel library (builds for this GPU on first use)")
        backend = EmulatedBackend(args.library) if args.dry_run else GpuBackend(args.library)
        results["build"] = {"seconds": backend.build_seconds, "library": backend.library_path}
        log(f"kernel library ready in {backend.build_seconds:.1f}s: {backend.library_path}")
    except Exception as exc:
        results["errors"].append(f"kernel library: {type(exc).__name__}: {exc}")
        write()
        print(table(results))
        return 1

    dry = args.dry_run
    presets = {name: shrink(CASES[name]) if dry and name != "tiny" else CASES[name] for name in CASES}
    check_tokens = {
        "tiny": [1, 3, 16, 17, 40],
        "qwen3-30b-a3b-layer": [1, 5, 16, 33],
        "deepseek-v3-layer": [1, 4, 16, 20],
        "gpt-oss-20b-style": [1, 4, 16, 17],
    }
    if dry:
        # A check of the flow, not of the kernels (tests/plugins does that): one token
        # count, one iteration; the emulator runs each CUDA thread as a host thread.
        check_tokens = {name: [2] for name in check_tokens}
        tokens = tokens[:1]
        args.iters = 1
        args.torch_iters = 1

    try:
        log("measuring device bandwidth")
        results["bandwidth"] = measure_bandwidth(backend, (2**30) if not dry else (2**22), 20 if not dry else 2)
        bw = results["bandwidth"]
        log(f"  copy {bw['copy_GBps']:.0f} GB/s (read+write), read-only {bw['read_GBps']:.0f} GB/s")
    except Exception as exc:
        results["errors"].append(f"bandwidth: {type(exc).__name__}: {exc}")
        results["bandwidth"] = {"copy_GBps": 0.0}
    copy_GBps = results["bandwidth"].get("copy_GBps", 0.0)
    bench = None if args.skip_bench else Bench(backend, args.iters, args.torch_iters, 2**30 if not dry else 2**16)

    # Order: the tiny preset first (fast, catches gross errors), then the deepseek targets
    # (bf16, then int4 against its int4 twin), then qwen3, then the other int4/int8 rows
    # (bits > 0: the preset quantized; tiny int4 is not runnable, its f_p = 16 codes are
    # 8-byte rows). Each layer is freed before the next is made.
    plan = [
        ("tiny", [torch.float32, torch.float16, torch.bfloat16], None, 0),
        ("deepseek-v3-layer", [torch.bfloat16], torch.bfloat16, 0),
        ("deepseek-v3-layer", [torch.bfloat16], torch.bfloat16, 4),
        ("qwen3-30b-a3b-layer", [torch.float32, torch.bfloat16], torch.bfloat16, 0),
        ("tiny", [torch.float32, torch.bfloat16], None, 8),
        ("deepseek-v3-layer", [torch.bfloat16], torch.bfloat16, 8),
        ("qwen3-30b-a3b-layer", [torch.bfloat16], None, 4),
        # gpt-oss's biases, clamped SwiGLU and logit bias: correctness, float and int4.
        ("gpt-oss-20b-style", [torch.bfloat16, torch.float16], None, 0),
        ("gpt-oss-20b-style", [torch.bfloat16], None, 4),
    ]
    for preset, check_dtypes, bench_dtype, bits in [s for s in plan if s[0] in selected and s[3] in weight_bits]:
        config = shrink(CASES[preset], 32) if dry and bits and preset != "tiny" else presets[preset]
        for dtype in check_dtypes:
            layer = None
            name = f"{DTYPE_NAMES[dtype]}-int{bits}" if bits else DTYPE_NAMES[dtype]
            try:
                size_gb = layer_bytes(config, dtype.itemsize) / 1e9
                log(f"{preset} {name}: making the layer ({size_gb:.2f} GB before quantization)")
                if bits:
                    layer = quantized_layer(config, dtype, backend.device, 0, bits)
                else:
                    layer = random_layer(config, dtype, backend.device, seed=0)
                backend.sync()
                for i, T in enumerate(check_tokens[preset]):
                    results["correctness"].append(check_correctness(backend, layer, preset, T, seed=10 * i + T))
                write()
                if bench is not None and dtype == bench_dtype:
                    if elapsed() > args.budget_s:
                        results["skipped"].append(f"{preset} {name} benchmarks: time budget")
                        log(f"time budget reached: skipping the {preset} {name} benchmarks")
                    else:
                        log(f"{preset} {name}: benchmarks at T={tokens}")
                        bench_preset(
                            backend, bench, preset, layer, tokens, copy_GBps, results, pdl_tokens, args.budget_s
                        )
            except Exception as exc:
                results["errors"].append(f"{preset} {name}: {type(exc).__name__}: {exc}")
                results.setdefault("tracebacks", []).append(traceback.format_exc())
                log(f"ERROR {preset} {name}: {type(exc).__name__}: {exc}")
            finally:
                free(layer)
                write()

    write()
    report = table(results)
    print("\n" + report, flush=True)
    log(f"wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.txt'}")
    passed = all(r["pass"] for r in results["correctness"]) and results["correctness"] and not results["errors"]
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
