"""`deamoe-trt bench --quantized 4|8`: weight-only int4/int8 DeaMoE on the CPU kernel against
its quantized expanded twin, ONNX Runtime's QMoE vanilla layer at the same bits (the anchor
people use), and float DeaMoE (fp32, fp16), interleaved step by step in one process.

Every contender reads the same random inputs; bytes per step come from each step's routing
(deamoe_trt.traffic, packed codes plus scales for the quantized ones), and the roof is the
read bandwidth the kernel's threads get, probed between the contenders' calls (as in
deamoe_trt.bench.harness, whose timing loop and probe this reuses). See docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import gc
from dataclasses import dataclass, field

import torch

from .. import runtimes
from ..console import Progress, format_table
from ..errors import UsageError
from ..inputs import random_hidden
from ..layer import DeaMoELayer
from ..presets import get_preset
from ..quant import BITS, GROUP_SIZES, QuantConfig
from ..routing import route_logits, router_logits
from ..runtimes.base import state_bytes
from ..traffic import weights_loaded
from . import bandwidth as bw
from . import machine
from .contenders import Contender
from .options import step_seed
from .tables import TIMING_HEADERS, _x, timing_cells
from .timing import interleaved, summary

# The CPU targets for int4, qwen3-30b-a3b-layer, 1 token per step.
TARGETS = {"vs QMoE vanilla": 1.45, "of roof": 0.70, "vs fp32 DeaMoE": 3.0}
# Largest output difference a contender may show against its PyTorch reference, relative to
# the reference's scale (ORT's int8 QMoE quantizes activations: about 2%).
CHECK_TOLERANCE = {"cpu": 1e-3, "ort": 5e-2}


@dataclass
class QuantBenchOptions:
    preset: str = "qwen3-30b-a3b-layer"
    bits: int = 4
    group_size: int = 128
    tokens: list[int] = field(default_factory=lambda: [1])
    steps: int = 200
    warmup: int | None = None
    seed: int = 0
    threads: int | None = None
    gap_ms: float = 2.0
    probe_bytes: int = 128 << 20
    progress: bool = True

    @classmethod
    def quick_run(cls, **changes) -> QuantBenchOptions:
        base = {"preset": "tiny", "group_size": 16, "tokens": [1, 3], "steps": 6, "warmup": 1, "gap_ms": 0.0}
        base["probe_bytes"] = 8 << 20
        base.update(changes)
        return cls(**base)

    def validate(self) -> None:
        if self.bits not in BITS:
            raise UsageError(f"--quantized takes 4 or 8 bits, got {self.bits}")
        if self.group_size not in GROUP_SIZES:
            raise UsageError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, got {self.group_size}")
        get_preset(self.preset)

    @property
    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(3, self.steps // 10)


def run_quant_bench(options: QuantBenchOptions) -> dict:
    """Build every contender, check each against its reference, time them interleaved."""
    options.validate()
    threads = options.threads or machine.cores()
    torch.set_num_threads(threads)
    started = datetime.datetime.now(datetime.timezone.utc)
    config = get_preset(options.preset)
    quant = QuantConfig(options.bits, options.group_size)
    say = _say if options.progress else (lambda _: None)
    warmup, steps = options.warmup_steps, options.steps

    say(f"building {options.preset} (fp32), then its int{quant.bits} form, group size {quant.group_size}")
    layer = DeaMoELayer.random(config, seed=options.seed)
    quantized = layer.quantized(quant)  # from fp32 weights: fp32 scales
    inputs = {
        t: [random_hidden(t, config.hidden_size, seed=step_seed(options.seed, t, s)) for s in range(warmup + steps)]
        for t in options.tokens
    }
    traffic = _traffic(layer, quant, inputs, warmup)
    checks = {t: xs[0] for t, xs in inputs.items()}
    contenders: list[Contender] = []
    bits = f"int{quant.bits}"

    def add(name: str, runtime: str, kind: str, run, module, reference) -> None:
        contender = Contender(name, kind, runtime, run=run, cooldown_s=options.gap_ms / 1e3)
        with torch.inference_mode():
            worst = max(float((_as_torch(run(x)) - reference(x).float()).abs().max()) for x in checks.values())
            scale = max(float(reference(x).float().abs().max()) for x in checks.values())
        contender.info = {"max_abs_diff": worst, "reference_scale": scale, "stored_bytes": state_bytes(module)}
        if worst > CHECK_TOLERANCE[runtime] * max(scale, 1e-6):
            contender.info["warning"] = f"outputs differ from the PyTorch reference by {worst:.3g}"
        contenders.append(contender)

    cpu, ort = runtimes.get("cpu"), runtimes.get("ort")

    def on(runtime, module):
        """The module's step on a runtime, fed torch tensors (ONNX Runtime: as numpy, zero-copy)."""
        prepared = runtime.prepare(module, threads=threads)
        return lambda x: prepared.run(prepared.to_input(x))

    say(f"building DeaMoE {bits} on the CPU kernel")
    add(f"DeaMoE {bits}, CPU kernel", "cpu", "deamoe", on(cpu, quantized), quantized, quantized)
    say(f"building the expanded twin {bits} on the CPU kernel")
    twin = quantized.expanded()
    add(f"expanded twin {bits}, CPU kernel", "cpu", "expanded", on(cpu, twin), twin, twin)
    say(f"building the vanilla MoE {bits} on ONNX Runtime's QMoE")
    vanilla = quantized.vanilla()
    del twin
    gc.collect()
    add(f"vanilla MoE {bits}, ONNX Runtime QMoE (anchor)", "ort", "vanilla", on(ort, vanilla), vanilla, vanilla)
    del vanilla
    gc.collect()
    say(f"building DeaMoE {bits} on ONNX Runtime (ort form, QMoE)")
    add(f"DeaMoE {bits}, ONNX Runtime QMoE", "ort", "deamoe", on(ort, quantized), quantized, quantized)
    say("building DeaMoE fp32 and fp16 on the CPU kernel")
    add("DeaMoE fp32, CPU kernel", "cpu", "deamoe", on(cpu, layer), layer, layer)
    half = layer.to(torch.float16)
    del layer
    gc.collect()
    add("DeaMoE fp16, CPU kernel", "cpu", "deamoe", on(cpu, half), half, half)
    del half, quantized
    gc.collect()

    runner_cooldown = _Cooldown(options.gap_ms / 1e3, threads)
    probe = bw.RoofProbe(options.probe_bytes, threads)
    results, rates = {}, []
    for tokens, xs in inputs.items():
        prepared = {c.name: xs for c in contenders}
        progress = Progress(warmup + steps, f"quantized T={tokens}", enabled=options.progress)

        def advance(step: int, p: Progress = progress) -> None:
            p.update(step=1)

        times, probe_rates = interleaved(
            contenders,
            prepared,
            warmup,
            steps,
            cooldown=runner_cooldown,
            probe=probe,
            probe_cooldown_s=options.gap_ms / 1e3,
            on_step=advance,
        )
        rates += probe_rates
        results[tokens] = times
    roof = sorted(rates)[len(rates) // 2]
    rows = _rows(contenders, results, traffic, roof, bits)
    return {
        "schema": "deamoe-trt-bench-quantized/1",
        "created": started.isoformat(timespec="seconds"),
        "machine": machine.machine_info(threads),
        "settings": {
            "preset": options.preset,
            "bits": quant.bits,
            "group_size": quant.group_size,
            "scales": "fp32",
            "tokens": list(options.tokens),
            "steps": steps,
            "warmup": warmup,
            "seed": options.seed,
            "threads": threads,
            "gap_ms": options.gap_ms,
        },
        "roof": {"bytes_per_s": roof, "method": probe.method, "probes_bytes_per_s": rates},
        "contenders": [{"name": c.name, "runtime": c.runtime, "model": c.model, **c.info} for c in contenders],
        "results": rows,
        "elapsed_s": (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(),
    }


def _rows(contenders, results, traffic, roof, bits) -> list[dict]:
    rows = []
    for tokens, times in results.items():
        medians = {name: summary(t)["median_s"] for name, t in times.items()}
        main, twin, anchor = (
            f"DeaMoE {bits}, CPU kernel",
            f"expanded twin {bits}, CPU kernel",
            f"vanilla MoE {bits}, ONNX Runtime QMoE (anchor)",
        )
        for contender in contenders:
            name = contender.name
            step_bytes = traffic[tokens][name]
            mean_bytes = sum(step_bytes) / len(step_bytes)
            row = {"tokens": tokens, "contender": name, "bytes_per_step_mean": mean_bytes, **summary(times[name])}
            row["roof_s"] = mean_bytes / roof
            row["roof_fraction"] = row["roof_s"] / row["median_s"]
            if name == main:
                row["speedup_vs_expanded"] = medians[twin] / medians[main]
                row["speedup_vs_fp32"] = medians["DeaMoE fp32, CPU kernel"] / medians[main]
                row["speedup_vs_fp16"] = medians["DeaMoE fp16, CPU kernel"] / medians[main]
            if name != anchor:
                row["speedup_vs_anchor"] = medians[anchor] / row["median_s"]
            row["times_s"] = times[name]
            rows.append(row)
    return rows


def _traffic(layer: DeaMoELayer, quant: QuantConfig, inputs: dict, warmup: int) -> dict:
    """Bytes per timed step per contender, from that step's routing (deamoe_trt.traffic)."""
    config = layer.config
    bias = layer.router.bias.detach() if layer.router.bias is not None else None
    bits = f"int{quant.bits}"
    vanilla = config.vanilla()
    out = {}
    with torch.inference_mode():
        for tokens, xs in inputs.items():
            per: dict[str, list[int]] = {}
            for x in xs[warmup:]:
                logits = router_logits(x, layer.router.weight, layer.router.logit_bias)
                routing = route_logits(logits, bias, config)
                one_stage = route_logits(logits, bias, vanilla)
                steps = {
                    f"DeaMoE {bits}, CPU kernel": weights_loaded(config, routing, 4, quant),
                    f"expanded twin {bits}, CPU kernel": weights_loaded(config.expanded(), routing, 4, quant),
                    f"vanilla MoE {bits}, ONNX Runtime QMoE (anchor)": weights_loaded(vanilla, one_stage, 4, quant),
                    f"DeaMoE {bits}, ONNX Runtime QMoE": weights_loaded(config, routing, 4, quant),
                    "DeaMoE fp32, CPU kernel": weights_loaded(config, routing, 4),
                    "DeaMoE fp16, CPU kernel": weights_loaded(config, routing, 2),
                }
                for name, step in steps.items():
                    per.setdefault(name, []).append(step.total)
            out[tokens] = per
    return out


def format_quant_result(result: dict) -> str:
    s = result["settings"]
    rows = [
        (
            *timing_cells(r),
            f"{r['roof_fraction']:.0%}",
            _x(r.get("speedup_vs_expanded")),
            _x(r.get("speedup_vs_anchor")),
            _x(r.get("speedup_vs_fp32")),
            _x(r.get("speedup_vs_fp16")),
        )
        for r in result["results"]
    ]
    title = (
        f"{s['preset']}, int{s['bits']} group size {s['group_size']} ({s['scales']} scales, from the fp32 layer), "
        f"{s['steps']} interleaved steps, {s['threads']} thread(s); roof {result['roof']['bytes_per_s'] / 1e9:.1f} GB/s"
    )
    table = format_table(
        (*TIMING_HEADERS, "of roof", "vs expanded", "vs QMoE vanilla", "vs fp32", "vs fp16"),
        rows,
        title=title,
    )
    checks = [
        f"  {c['name']}: max|diff| vs its PyTorch reference {c['max_abs_diff']:.1e}"
        + (f"  WARNING: {c['warning']}" if c.get("warning") else "")
        for c in result["contenders"]
    ]
    return "\n".join([table, "", "Checks:", *checks, "", _targets(result)])


def _targets(result: dict) -> str:
    s = result["settings"]
    main = f"DeaMoE int{s['bits']}, CPU kernel"
    one = next((r for r in result["results"] if r["contender"] == main and r["tokens"] == 1), None)
    if one is None or s["bits"] != 4:
        return "Targets apply to int4 at 1 token."
    got = {
        "vs QMoE vanilla": one["speedup_vs_anchor"],
        "of roof": one["roof_fraction"],
        "vs fp32 DeaMoE": one["speedup_vs_fp32"],
    }
    parts = [
        f"{name} {got[name]:.2f} (target >= {target:g}: {'met' if got[name] >= target else 'NOT met'})"
        for name, target in TARGETS.items()
    ]
    return "Targets, int4 DeaMoE at 1 token: " + "; ".join(parts)


class _Cooldown:
    """A busy pause before each timed call, as the main benchmark's (loop.Runner.cooldown)."""

    def __init__(self, seconds: float, threads: int):
        from ..cpu import Pool

        self.seconds = seconds
        self.warmer = Pool(threads, spin_us=0, wake_spin_us=0) if seconds > 0 else None

    def __call__(self, seconds: float) -> None:
        if self.warmer is not None:
            self.warmer.busy_wait(min(seconds, self.seconds))


def _as_torch(y) -> torch.Tensor:
    return (y if isinstance(y, torch.Tensor) else torch.from_numpy(y)).float()


def _say(message: str) -> None:
    import sys

    print(f"bench --quantized: {message}", file=sys.stderr, flush=True)
