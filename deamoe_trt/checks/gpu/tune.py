"""check-gpu --tune: every kernel variant (deamoeKernels.h, forwardVariant) timed on each layer
the check makes, at each token count, and the per-GPU variant table (deamoe_trt.cuda.tuning)
written from the medians. Each variant's output is checked first, against float32 math on the
layer's weights: one outside the dtype's tolerance is an error of the check and never chosen.
With --sm-limit N the same variants are timed again with the
kernels confined to N SMs (a CUDA green context), reported beside the full-GPU figures: N = 16
gives an H100/H200 about the bytes per SM a Jetson AGX Orin has (204.8 GB/s over 16 SMs)."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch

from ...cuda import _ops, tuning
from ...cuda._abi import variant_names
from ...dtypes import BY_TORCH
from ...layer import DeaMoELayer
from ...runtimes.cuda import CudaRuntime
from ...runtimes.expected import TOLERANCE, float32_output, relative_error
from .report import Clock
from .timing import Bench, step_bytes


@contextlib.contextmanager
def sm_limited(backend: CudaRuntime, sms: int | None) -> Iterator[None]:
    """Launches inside run on a stream of a green context of `sms` SMs (None: as they are)."""
    if sms is None:
        yield
        return
    if backend.is_emulated:
        raise RuntimeError("the emulated kernels have no SMs to limit")
    from torch.cuda.green_contexts import GreenContext

    # torch annotates create's result as object; it is a GreenContext.
    context = cast(GreenContext, GreenContext.create(num_sms=sms, device_id=backend.device.index or 0))
    context.set_context()
    try:
        with torch.cuda.stream(context.Stream()):
            yield
            torch.cuda.current_stream().synchronize()
    finally:
        context.pop_context()


def _stream(backend: CudaRuntime) -> int | None:
    return None if backend.is_emulated else torch.cuda.current_stream().cuda_stream


def time_variants(bench: Bench, layer: DeaMoELayer, xs: list[torch.Tensor], names: Sequence[str]) -> dict[str, float]:
    """Median eager microseconds of each variant over xs (L2 flushed before each call), the
    variants interleaved call by call so that clock and thermal drift fall on all alike."""
    backend = bench.backend
    lib = backend.lib
    with torch.no_grad():
        for name in names:
            _ops.forward_with(lib, layer, xs[0], _stream(backend), variant=name)  # warm-up
        backend.sync()
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(len(xs)):
            for name in names:
                run = lambda _, x=xs[i], name=name: _ops.forward_with(lib, layer, x, _stream(backend), variant=name)  # noqa: E731
                times[name] += backend.time_each(run, 1, bench.before)
    return {name: statistics.median(t) for name, t in times.items()}


def variant_errors(backend: CudaRuntime, layer: DeaMoELayer, x: torch.Tensor, names: Sequence[str]) -> dict[str, float]:
    """Each variant's relative error against float32 math on the layer's weights, for the kernels'
    routing of x: what only a GPU shows (blocks that really run at once) checked before timing."""
    with torch.no_grad():
        want = float32_output(layer, x, backend.route(layer, x))
        return {
            name: relative_error(_ops.forward_with(backend.lib, layer, x, _stream(backend), variant=name), want)
            for name in names
        }


def fastest_right(times: dict[str, float], wrong: list[str]) -> str:
    """The fastest of times' variants leaving out the wrong ones (the default stands whatever its error)."""
    return tuning.fastest({n: us for n, us in times.items() if n not in wrong or n == tuning.DEFAULT_VARIANT})


def tune_layer(bench: Bench, preset: str, layer: DeaMoELayer, tokens: list[int], copy_GBps: float,
               sm_limit: int | None, results: dict, clock: Clock) -> None:  # fmt: skip
    """Times every variant at each token count into results["tuning"] (and, with sm_limit, again
    on that many SMs); the full-GPU medians pick each case's variant (tuning.fastest)."""
    backend = bench.backend
    c = layer.config
    bits = layer.quant.bits if layer.quant is not None else 0
    names = tuning.distinct_variants(variant_names(backend.lib), bits)
    dtype = BY_TORCH[layer.dtype].name
    for T in sorted({tuning.tile_tokens(t) for t in tokens}):
        gen = torch.Generator(device=backend.device).manual_seed(2000 + T)
        xs = [
            torch.randn(T, c.hidden_size, generator=gen, device=backend.device).to(layer.dtype)
            for _ in range(bench.iters)
        ]
        mean_bytes = statistics.mean(step_bytes(c, backend.route(layer, x), BY_TORCH[layer.dtype].bytes, layer.quant)
                                     for x in xs)  # fmt: skip
        errors = variant_errors(backend, layer, xs[0], names)
        wrong = [n for n, e in errors.items() if not e < TOLERANCE[layer.dtype]]  # NaN is wrong too
        for n in wrong:
            results["errors"].append(
                f"{preset} {dtype} int{bits} T={T}: variant {n} relative error {errors[n]:.1e}"
                f" over {TOLERANCE[layer.dtype]:.0e}: never chosen"
            )
        full = time_variants(bench, layer, xs, names)
        entry: dict[str, Any] = {
            "shape": tuning.shape_key(c),
            "preset": preset,
            "dtype": dtype,
            "bits": bits,
            "tokens": T,
            "variant": fastest_right(full, wrong),
            "median_us": full,
            "relative_error": errors,
            "bytes_per_step_mean": mean_bytes,
            "copy_fraction": {n: mean_bytes / us / 1e3 / copy_GBps for n, us in full.items()} if copy_GBps else {},
        }
        if sm_limit is not None:
            try:
                with sm_limited(backend, sm_limit):
                    limited = time_variants(bench, layer, xs, names)
                entry[f"median_us_{sm_limit}_sms"] = limited
                entry[f"variant_{sm_limit}_sms"] = fastest_right(limited, wrong)
            except Exception as exc:  # green contexts need CUDA 12.4+ and PyTorch built with them
                entry[f"median_us_{sm_limit}_sms"] = None
                results["skipped"].append(f"{preset} {dtype} int{bits} T={T} on {sm_limit} SMs: {exc}")
        results.setdefault("tuning", []).append(entry)
        limited_text = ""
        if entry.get(f"median_us_{sm_limit}_sms"):
            limited_text = f" | {sm_limit} SMs: " + ", ".join(
                f"{n} {us:.1f}" for n, us in entry[f"median_us_{sm_limit}_sms"].items()
            )
        clock.log(
            f"  tune {preset} {dtype} int{bits} T={T:2d}: "
            + ", ".join(f"{n} {us:.1f} us" for n, us in full.items())
            + f" -> {entry['variant']}"
            + limited_text
        )
        del xs


def table_entries(results: dict) -> list[dict]:
    """The variant table's entries from results["tuning"]: one per (shape, dtype, bits, tokens),
    the last measurement of a case winning."""
    keep = ("shape", "preset", "dtype", "bits", "tokens", "variant", "median_us")
    by_case = {(e["shape"], e["dtype"], e["bits"], e["tokens"]): {k: e[k] for k in keep} for e in results["tuning"]}
    return list(by_case.values())


def tuning_text(results: dict, sm_limit: int | None) -> str:
    """gpu_check.txt's variant table: each case's medians per variant, the copy fraction of the
    chosen one, and with sm_limit the medians on that many SMs."""
    rows = results.get("tuning") or []
    if not rows:
        return ""
    lines = ["", "kernel variants (eager medians, L2 flushed; chosen: fastest by > 2%, else default)"]
    for e in rows:
        chosen = e["variant"]
        fraction = (e.get("copy_fraction") or {}).get(chosen)
        text = ", ".join(f"{n} {us:.1f}" for n, us in e["median_us"].items())
        line = f"  {e['preset']:20s} {e['dtype']:5s} int{e['bits']} T={e['tokens']:2d}: {text} us -> {chosen}"
        if fraction:
            line += f" ({100 * fraction:.1f}% of copy)"
        limited = e.get(f"median_us_{sm_limit}_sms") if sm_limit else None
        if limited:
            line += f" | {sm_limit} SMs: " + ", ".join(f"{n} {us:.1f}" for n, us in limited.items()) + " us"
        lines.append(line)
    return "\n".join(lines)
