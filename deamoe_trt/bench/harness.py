"""`deamoe-trt bench`: DeaMoE against its expanded twin and the vanilla ONNX Runtime anchor.

One process, one interleaved loop per token count, fresh pre-generated inputs each step,
medians after warm-up; bytes per step from each step's actual routing (deamoe_trt.traffic);
the roof from the machine's read bandwidth measured here. See docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import gc
import statistics
from typing import Any

import torch

from . import bandwidth as bw
from . import machine
from .contenders import ORT_SPINNING_COOLDOWN_S, TORCH_COOLDOWN_S
from .layer_section import layer_section
from .loop import Log, Runner
from .options import SCHEMA, BenchOptions, step_seed
from .stack_section import stack_layers, stack_section, stack_skip_reason

__all__ = ["SCHEMA", "BenchOptions", "run_bench", "step_seed"]


def run_bench(options: BenchOptions) -> dict:
    """Run the benchmark; returns the JSON-ready result (docs/bench-method.md lists its fields)."""
    options.validate()
    threads = options.threads or machine.cores()
    torch.set_num_threads(threads)
    started = datetime.datetime.now(datetime.timezone.utc)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "created": started.isoformat(timespec="seconds"),
        "machine": machine.machine_info(threads),
        "settings": _settings(options, threads),
    }
    log = Log(options.progress)

    log.say(f"measuring read bandwidth ({options.bandwidth_bytes / 2**20:.0f} MiB buffer, {threads} threads)")
    before = bw.kernel_bandwidth(options.bandwidth_bytes, options.bandwidth_passes, threads)
    numpy_rate = bw.numpy_bandwidth(options.bandwidth_bytes, max(3, options.bandwidth_passes // 2))
    result["bandwidth"] = {"kernel_before": before, "numpy": numpy_rate}

    runner = Runner(options, threads, log)
    result["layer"] = layer_section(options, runner)
    gc.collect()
    num_layers = stack_layers(options, log)
    if num_layers:
        result["stack"] = stack_section(options, runner, num_layers)
    else:
        result["stack"] = {"status": "skipped", "reason": stack_skip_reason(options)}
    runner.close()
    gc.collect()

    after = bw.kernel_bandwidth(options.bandwidth_bytes, options.bandwidth_passes, threads)
    result["bandwidth"]["kernel_after"] = after
    passes = before["passes_bytes_per_s"] + after["passes_bytes_per_s"]
    result["bandwidth"]["standalone_bytes_per_s"] = statistics.median(passes)
    result["machine"]["load_average_end"] = machine.load_average()
    result["elapsed_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    return result


def _settings(options: BenchOptions, threads: int) -> dict:
    return {
        "preset": options.preset,
        "tokens": list(options.tokens),
        "dtype": options.dtype,
        "steps": options.steps,
        "warmup": options.warmup_steps,
        "seed": options.seed,
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "layers": options.layers,
        "stack_dtype": options.stack_dtype,
        "quick": options.quick,
        "gap_ms": options.gap_ms,
        "only": options.only,
        "ort_spinning": options.ort_spinning,
        "torch_cooldown_s": TORCH_COOLDOWN_S,
        "ort_spinning_cooldown_s": ORT_SPINNING_COOLDOWN_S,
        "probe_bytes": options.probe_bytes,
        "bandwidth_bytes": options.bandwidth_bytes,
        "bandwidth_passes": options.bandwidth_passes,
        "memory_fraction": options.memory_fraction,
        "step_seed": "seed * 100000000 + tokens * 10000 + step",
    }
