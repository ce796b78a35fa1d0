"""GPU check of the DeaMoE CUDA kernels: correctness against the PyTorch reference, then speed.

    deamoe-trt check-gpu --out DIR

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
5. with --tune, times every kernel variant on each layer it makes at each token tile and
   writes the variant table of this GPU, DIR/<GPU name>.json (deamoe_trt.cuda.tuning: commit
   it to deamoe_trt/cuda/tuned/ and the library uses it on this GPU model); --sm-limit N
   times the variants again on N SMs (a green context), beside the full-GPU figures;
6. writes DIR/gpu_check.json (everything) and DIR/gpu_check.txt (the tables), prints them.
Exit status 0 when every correctness check passed (performance targets are reported, not
enforced), 1 otherwise. Designed to finish in under 5 minutes on an H200 (--budget-s).

--dry-run runs the same flow on the CPU through the SIMT-emulated kernel library
(deamoe_trt.checks.emulated, built from the sources shipped in the package) with shrunken
presets: a check of this script, not of the GPU.

Modules: run (the run's order, from the command's values), cases (the layers checked), correctness,
timing (bandwidth, benchmarks, per-kernel profile) and report (the tables and targets).
The kernels are reached through deamoe_trt.runtimes.cuda.

The run (the command, deamoe_trt.cli.check_gpu_cmd, parses and checks the arguments):
environment, kernel library, bandwidth, then per planned layer its correctness rows and
benchmarks, gpu_check.json and gpu_check.txt rewritten after each.
"""

from __future__ import annotations

import json
import platform
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...cuda import tuning
from ...cuda.tuning import device_file_name
from ...dtypes import BY_TORCH
from ...errors import UsageError
from ...runtimes.cuda import CudaRuntime
from ...traffic import layer_bytes
from .cases import CHECK_TOKENS, PLAN, case_config, free, quantized_layer, random_layer
from .correctness import check_correctness
from .report import Clock, table, targets
from .timing import Bench, bench_preset, measure_bandwidth
from .tune import table_entries, tune_layer, tuning_text

DEFAULT_PRESETS = "tiny,deepseek-v3-layer,qwen3-30b-a3b-layer,gpt-oss-20b-style"
WEIGHT_BITS = (0, 4, 8)


@dataclass(frozen=True)
class GpuCheckOptions:
    """What to check, as the command's flags say (deamoe-trt check-gpu --help)."""

    out: Path
    library: str | None = None  # a built kernel library (default: build for this GPU, cached)
    tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    iters: int = 40
    torch_iters: int = 10
    pdl_tokens: list[int] = field(default_factory=lambda: [1, 4, 16])
    skip_bench: bool = False
    tune: bool = False
    sm_limit: int | None = None
    budget_s: float = 270.0
    dry_run: bool = False
    presets: list[str] = field(default_factory=lambda: DEFAULT_PRESETS.split(","))
    bits: set[int] = field(default_factory=lambda: set(WEIGHT_BITS))
    command: str = "deamoe-trt check-gpu"  # how the check was run, stamped into the variant table


def environment(dry_run: bool) -> dict:
    env: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if not dry_run:
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_GiB=round(props.total_memory / 2**30, 1),
            l2_MiB=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        )
    return env


def write_table(path: Path, results: dict, command: str) -> None:
    """This GPU's variant table (deamoe_trt.cuda.tuning) from the tuning rows so far, stamped."""
    env = results["environment"]
    measured = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": source_commit(),
        "command": command,
        "capability": env.get("capability"),
        "sms": env.get("sms"),
        "torch": env.get("torch"),
        "copy_GBps": round((results.get("bandwidth") or {}).get("copy_GBps", 0.0)),
    }
    tuning.write_table(path, env.get("gpu", "emulated"), table_entries(results), measured)


def source_commit() -> str | None:
    """The commit of the source checkout this runs from (None outside one)."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent, check=False)  # fmt: skip
    except OSError:
        return None
    return done.stdout.strip() or None


def run_check(args: GpuCheckOptions) -> int:
    """Run the check; 0 when every correctness check passed, 1 otherwise, 2 without a GPU."""
    clock = Clock()  # --budget-s counts from here, not from the import
    dry = args.dry_run
    backend = CudaRuntime.emulated(args.library) if dry else CudaRuntime(library=args.library)
    if reason := backend.available():
        raise UsageError(f"this check {reason}; --dry-run runs it on the CPU")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokens, iters, torch_iters = list(args.tokens), args.iters, args.torch_iters
    check_tokens = CHECK_TOKENS
    if dry:
        # A check of the flow, not of the kernels (tests/native/cuda does that): one token
        # count, one iteration; the emulator runs each CUDA thread as a host thread.
        check_tokens = {name: [2] for name in CHECK_TOKENS}
        tokens, iters, torch_iters = tokens[:1], 1, 1

    results: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "mode": "dry-run (CPU, emulated kernels)" if dry else "gpu",
        "correctness": [],
        "benchmarks": [],
        "errors": [],
        "skipped": [],
        "environment": environment(dry),
    }
    clock.log(f"environment: {results['environment']}")

    def write() -> None:
        results["elapsed_s"] = clock.elapsed()
        results["targets"] = targets(results)
        for name, text in (
            ("gpu_check.json", json.dumps(results, indent=2, default=str)),
            ("gpu_check.txt", table(results) + tuning_text(results, args.sm_limit) + "\n"),
        ):
            tmp = out / f".{name}.tmp"
            tmp.write_text(text)
            tmp.replace(out / name)

    try:
        clock.log("loading the kernel library (builds for this GPU on first use)")
        backend.load_library()
        results["build"] = {"seconds": backend.build_seconds, "library": backend.library_path}
        clock.log(f"kernel library ready in {backend.build_seconds:.1f}s: {backend.library_path}")
    except Exception as exc:
        results["errors"].append(f"kernel library: {type(exc).__name__}: {exc}")
        write()
        print(table(results))
        return 1

    try:
        clock.log("measuring device bandwidth")
        results["bandwidth"] = measure_bandwidth(backend, (2**30) if not dry else (2**22), 20 if not dry else 2)
        bw = results["bandwidth"]
        clock.log(f"  copy {bw['copy_GBps']:.0f} GB/s (read+write), read-only {bw['read_GBps']:.0f} GB/s")
    except Exception as exc:
        results["errors"].append(f"bandwidth: {type(exc).__name__}: {exc}")
        results["bandwidth"] = {"copy_GBps": 0.0}
    copy_GBps = results["bandwidth"].get("copy_GBps", 0.0)
    bench = None if args.skip_bench else Bench(backend, iters, torch_iters, 2**30 if not dry else 2**16)
    tune = args.tune or args.sm_limit is not None
    tuner = Bench(backend, iters, torch_iters, 2**30 if not dry else 2**16) if tune else None
    table_path = out / device_file_name(results["environment"].get("gpu", "emulated"))

    for preset, check_dtypes, bench_dtype, bits in [s for s in PLAN if s[0] in args.presets and s[3] in args.bits]:
        config = case_config(preset, bits, dry)
        for dtype in check_dtypes:
            layer = None
            name = f"{BY_TORCH[dtype].name}-int{bits}" if bits else BY_TORCH[dtype].name
            try:
                size_gb = layer_bytes(config, dtype) / 1e9
                clock.log(f"{preset} {name}: making the layer ({size_gb:.2f} GB before quantization)")
                if bits:
                    layer = quantized_layer(config, dtype, backend.device, 0, bits)
                else:
                    layer = random_layer(config, dtype, backend.device, seed=0)
                backend.sync()
                for i, T in enumerate(check_tokens[preset]):
                    results["correctness"].append(check_correctness(backend, layer, preset, T, 10 * i + T, clock))
                write()
                if tuner is not None and preset != "tiny":
                    tune_layer(tuner, preset, layer, tokens, copy_GBps, args.sm_limit, results, clock)
                    write_table(table_path, results, args.command)
                if bench is not None and dtype == bench_dtype:
                    if clock.elapsed() > args.budget_s:
                        results["skipped"].append(f"{preset} {name} benchmarks: time budget")
                        clock.log(f"time budget reached: skipping the {preset} {name} benchmarks")
                    else:
                        clock.log(f"{preset} {name}: benchmarks at T={tokens}")
                        bench_preset(
                            bench, preset, layer, tokens, copy_GBps, results, set(args.pdl_tokens), args.budget_s, clock
                        )
            except Exception as exc:
                results["errors"].append(f"{preset} {name}: {type(exc).__name__}: {exc}")
                results.setdefault("tracebacks", []).append(traceback.format_exc())
                clock.log(f"ERROR {preset} {name}: {type(exc).__name__}: {exc}")
            finally:
                free(layer)
                write()

    write()
    print("\n" + table(results) + tuning_text(results, args.sm_limit), flush=True)
    if results.get("tuning"):
        clock.log(f"wrote the variant table {table_path}: commit it to deamoe_trt/cuda/tuned/ to use it")
    clock.log(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.txt'}")
    passed = all(r["pass"] for r in results["correctness"]) and results["correctness"] and not results["errors"]
    return 0 if passed else 1
