"""check-gpu's timings: the device's copy and read bandwidth, the kernels against their
expanded twin and the PyTorch reference (CUDA events, warm-up, a fresh input per iteration,
the L2 flushed before each; eager and CUDA-graph replay; programmatic launch off and on),
bytes per step from deamoe_trt.traffic, and a per-kernel profile against deamoe_trt.perf_model."""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field

import torch

from ... import perf_model
from ...bench.timing import percentile
from ...config import DeaMoEConfig
from ...dtypes import BY_TORCH
from ...layer import DeaMoELayer
from ...quant import QuantConfig
from ...routing import Routing
from ...runtimes.cuda import CudaRuntime
from ...traffic import weights_loaded
from .cases import free, kind
from .report import Clock


def measure_bandwidth(backend: CudaRuntime, size_bytes: int, repeats: int) -> dict:
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
    def __init__(self, backend: CudaRuntime, iters: int, torch_iters: int, flush_bytes: int):
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


def profile_kernels(backend: CudaRuntime, layer, xs, routings) -> list[dict]:
    """Per-kernel GPU time of the DeaMoE forward (torch.profiler / CUPTI), with each kernel's
    bytes (the performance model's per-kernel account of these inputs' routing), its
    bandwidth and the model's predicted time for this GPU (when it knows the GPU)."""
    if backend.is_emulated:
        return []
    from torch.profiler import ProfilerActivity, profile

    c, tokens = layer.config, xs[0].shape[0]
    bytes_per_weight = BY_TORCH[layer.dtype].bytes
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


def bench_preset(bench: Bench, preset: str, layer: DeaMoELayer, tokens: list[int], copy_GBps: float,
                 results: dict, pdl_tokens: set[int], budget_s: float, clock: Clock) -> None:  # fmt: skip
    """Times the layer, its expanded twin and the PyTorch reference at each token count into
    results["benchmarks"] (each kernel row with its bytes per step, bandwidth and copy fraction)."""
    backend = bench.backend
    c = layer.config
    B = BY_TORCH[layer.dtype].bytes
    clock.log(f"  building the expanded twin of {preset} {kind(layer)} (f_s=0, f_p={c.expert_intermediate_size})")
    twin = layer.expanded()
    backend.sync()
    twin_config = twin.config
    try:
        for T in tokens:
            if clock.elapsed() > budget_s:
                clock.log(f"  time budget reached: skipping {preset} T>={T}")
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
            clock.log(
                f"  {preset} {kind(layer)} T={T:2d}: deamoe {d['median_us']:8.1f} us "
                f"({d.get('bandwidth_GBps', 0):6.0f} GB/s, {100 * (d.get('copy_fraction') or 0):5.1f}% of copy)"
                + (f", graph {g['median_us']:8.1f} us" if g else "")
                + f" | expanded {e['median_us']:8.1f} us | x{speedups.get('vs_expanded_eager', 0):.2f} vs expanded"
                f", x{speedups.get('vs_torch_eager', 0):.1f} vs torch | U_d {used_d:.1f} U_e {used_e:.1f}"
            )
            if T in pdl_tokens and not backend.is_emulated:
                try:
                    entry["profile"] = profile_kernels(backend, layer, xs[:5], routings[:5])
                except Exception as exc:  # the profiler is optional: record why, go on
                    results["skipped"].append(f"{preset} per-kernel profile: {type(exc).__name__}: {exc}")
            del xs, routings
    finally:
        free(twin)
