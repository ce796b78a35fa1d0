"""The `bench` workflow: which benchmark a request runs, its defaults filled in, the tables
printed and the JSON and plot written.

`run_requested` is the one entry point (the command parses its flags into a `BenchRequest`
and calls it): a layer (bench.harness), a quantized layer (bench.quantized), or with lm a
whole language model, one sequence at a time or with sequences batched (bench.lm_bench).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_write_text
from ..errors import UsageError


@dataclass(frozen=True)
class BenchRequest:
    """What was asked, as given: None (or False) where not given, each benchmark filling in
    its own default. Which fields each form takes is the command's to check."""

    lm: bool = False
    layers: int | str | None = None  # a layer: a count or "auto"; lm: decoder blocks
    steps: int | None = None
    threads: int | None = None
    quantized: int | None = None
    group_size: int | None = None
    seed: int | None = None
    json: str | None = None
    plot: str | None = None
    # a layer
    preset: str | None = None
    tokens: list[int] | None = None
    dtype: str | None = None
    warmup: int | None = None
    quick: bool = False
    stack_dtype: str | None = None
    only: list[str] | None = None
    gap_ms: float | None = None
    ort_spinning: str | None = None  # "on" | "off"
    memory_fraction: float | None = None
    # a language model
    departments: int | None = None
    sequences: list[int] | None = None
    runtimes: str | None = None  # comma-separated
    max_memory_gb: float | None = None
    linears: str | None = None  # comma-separated
    attention: str | None = None
    llama_bench: Path | None = None
    llama_tokens: int | None = None
    gguf_dir: Path | None = None


def run_requested(request: BenchRequest) -> int:
    """Run the benchmark request asks for, printing its table; 0 when done."""
    if request.lm:
        return _run_lm(request)
    from . import BenchOptions, format_result, run_bench, write_json, write_plot
    from .plot import pyplot

    if request.plot:
        pyplot()  # before minutes of benchmarking, not after them
    if request.quantized is not None:
        return _run_quantized(request)
    if request.group_size is not None:
        raise UsageError("--group-size goes with --quantized")

    changes: dict[str, object] = {"threads": request.threads, "only": request.only}
    if request.ort_spinning is not None:
        changes["ort_spinning"] = request.ort_spinning == "on"
    for name in ("preset", "tokens", "steps", "warmup", "layers", "dtype", "seed", "stack_dtype"):
        if getattr(request, name) is not None:
            changes[name] = getattr(request, name)
    if request.gap_ms is not None:
        changes["gap_ms"] = request.gap_ms
    if request.memory_fraction is not None:
        changes["memory_fraction"] = request.memory_fraction
    options = BenchOptions.quick_run(**changes) if request.quick else BenchOptions(**changes)
    result = run_bench(options)
    print(format_result(result))
    if request.json:
        print(f"\nwrote {write_json(result, request.json)}")
    if request.plot:
        print(f"wrote {write_plot(result, request.plot)}")
    return 0


def _run_quantized(request: BenchRequest) -> int:
    from . import write_json
    from .quantized import QuantBenchOptions, format_quant_result, run_quant_bench

    changes: dict[str, object] = {"bits": request.quantized, "threads": request.threads}
    for name in ("preset", "tokens", "steps", "warmup", "group_size", "gap_ms", "seed"):
        if getattr(request, name) is not None:
            changes[name] = getattr(request, name)
    options = QuantBenchOptions.quick_run(**changes) if request.quick else QuantBenchOptions(**changes)
    result = run_quant_bench(options)
    print(format_quant_result(result))
    if request.json:
        print(f"\nwrote {write_json(result, request.json)}")
    return 0


def _run_lm(request: BenchRequest) -> int:
    """A language model's benchmark, with its defaults filled in."""
    from .lm_bench import RUNTIMES, lm_bench_table, run_lm_bench, write_plot

    if request.sequences is not None:
        return _run_batched(request)
    text = request.runtimes or "cpu,cpu-native,ort"
    runtimes = tuple(r.strip() for r in text.split(",") if r.strip())
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        raise UsageError(f"--runtimes takes a comma-separated list of {', '.join(RUNTIMES)}, got {text!r}")
    result = run_lm_bench(**_lm_shape(request), runtimes=runtimes, attention=request.attention or "gqa")
    print(lm_bench_table(result))
    _write_json(result, request.json)
    if request.plot:
        write_plot(result, Path(request.plot))
    return 0


def _lm_shape(request: BenchRequest) -> dict:
    """The keyword arguments the one-sequence and batched LM benchmarks share, defaults filled in."""
    from ..quant import QuantConfig

    quant = QuantConfig(request.quantized, request.group_size or 64) if request.quantized else None
    return {
        "layers": 2 if request.layers is None else request.layers,
        "departments": request.departments or 4,
        "steps": request.steps or 32,
        "threads": request.threads or 2,
        "max_memory": (8.0 if request.max_memory_gb is None else request.max_memory_gb) * 2**30,
        "quant": quant,
        "linears": tuple(p.strip() for p in (request.linears or "").split(",") if p.strip()),
        "llama_bench": request.llama_bench,
        "llama_tokens": request.llama_tokens or 64,
        "gguf_dir": request.gguf_dir,
        "seed": request.seed or 0,
    }


def _write_json(result, path) -> None:
    if path:
        atomic_write_text(path, json.dumps(result, indent=2) + "\n")


def _run_batched(request: BenchRequest) -> int:
    from .lm_bench import BATCH_RUNTIMES, lm_batch_table, run_lm_batch_bench

    runtime = (request.runtimes or "cpu-native").strip()
    if runtime not in BATCH_RUNTIMES:
        raise UsageError(
            "--sequences times the native step's batch decoder (cpu-native) or the CUDA decoder (cuda, "
            f"cuda-emulated): give one of them to --runtimes, got {request.runtimes!r}"
        )
    attention = request.attention or "gqa"
    if attention != "gqa" and runtime == "cpu-native":
        raise UsageError("--sequences runs the native step, which does not run MLA; drop --attention mla")
    if request.plot:
        raise UsageError("--plot draws the one-sequence table; drop it with --sequences")
    result = run_lm_batch_bench(
        sequences=tuple(request.sequences or ()), **_lm_shape(request), runtime=runtime, attention=attention
    )
    print(lm_batch_table(result))
    _write_json(result, request.json)
    return 0
