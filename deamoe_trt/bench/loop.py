"""What both sections of the benchmark share: the timing loop with its pauses and roof probe,
progress lines, result rows, and layers drawn within the memory budget."""

from __future__ import annotations

import statistics
import time

import torch

from ..config import DeaMoEConfig
from ..console import Progress
from ..layer import DeaMoELayer
from ..traffic import layer_bytes
from . import bandwidth as bw
from .contenders import MemoryPlan
from .options import BenchOptions
from .timing import interleaved, percentile, summary


class Runner:
    """What every timing loop shares: the threads, the busy pause between timed calls (a pool
    of its own, so no runtime's threads are kept awake for it) and the roof probe."""

    def __init__(self, options: BenchOptions, threads: int, log: Log):
        from ..cpu import Pool

        self.options, self.threads, self.log = options, threads, log
        self.base_cooldown_s = options.gap_ms / 1e3
        self.warmer = Pool(threads, spin_us=0, wake_spin_us=0) if self.base_cooldown_s > 0 else None
        self.probe: bw.RoofProbe | None = bw.RoofProbe(options.probe_bytes, threads)  # None once closed

    def cooldown(self, seconds: float) -> None:
        """Idle, so that spinning threads of the last runtime finish their spin undisturbed and
        go to sleep, then keep every core busy for the last base_cooldown_s: an idle vCPU is
        halted by the hypervisor and takes ~0.2 ms to wake, which would land on whichever
        runtime is timed next (a decoder's cores never idle like that)."""
        if self.warmer is None:
            return
        busy = min(seconds, self.base_cooldown_s)
        if seconds > busy:
            time.sleep(seconds - busy)
        self.warmer.busy_wait(busy)

    def close(self) -> None:
        self.warmer = None
        self.probe = None


def time_all(contenders, inputs, warmup, steps, runner: Runner, label) -> tuple[dict, dict]:
    """Timings per token count and contender, and the roof: the probe's median read rate
    over every timed step of this section, measured interleaved with the contenders."""
    results, rates = {}, []
    options, probe = runner.options, runner.probe
    if probe is None:
        raise RuntimeError("time_all on a closed Runner")
    for tokens, xs in inputs.items():
        prepared = {c.name: [c.prepare(x) for x in xs] for c in contenders}
        progress = Progress(warmup + steps, f"{label} T={tokens}", enabled=options.progress)
        every = max(1, (warmup + steps) // 10)

        def on_step(step, progress=progress, every=every, total=warmup + steps):
            done = step + 1
            if done % every == 0 or done == total:
                progress.update("warm-up" if done <= warmup else "", step=done - progress.done)

        times, probe_rates = interleaved(
            contenders,
            prepared,
            warmup,
            steps,
            cooldown=runner.cooldown,
            probe=probe,
            probe_cooldown_s=runner.base_cooldown_s,
            on_step=on_step,
        )
        rates += probe_rates
        results[tokens] = {c.name: (c, times[c.name]) for c in contenders}
    roof = {
        "bytes_per_s": statistics.median(rates),
        "p10_bytes_per_s": percentile(rates, 10),
        "p90_bytes_per_s": percentile(rates, 90),
        "method": probe.method,
        "probe_bytes": probe.nbytes,
        "probes_bytes_per_s": rates,
    }
    return results, roof


def result_rows(results: dict, traffic: dict, rate: float) -> list[dict]:
    rows = []
    for tokens, per in results.items():
        medians = {name: statistics.median(times) for name, (_, times) in per.items()}
        for name, (contender, times) in per.items():
            step_bytes = traffic[tokens][contender.model]["bytes"]
            row = {
                "tokens": tokens,
                "contender": name,
                "model": contender.model,
                "runtime": contender.runtime,
                "bytes_per_step_mean": sum(step_bytes) / len(step_bytes),
                **summary(times),
                "times_s": times,
            }
            if contender.model == "deamoe":
                twin = f"expanded/{contender.runtime}"
                if twin in medians:
                    row["speedup_vs_expanded"] = medians[twin] / row["median_s"]
            if "vanilla/ort" in medians and name != "vanilla/ort":
                row["speedup_vs_vanilla_ort"] = medians["vanilla/ort"] / row["median_s"]
            rows.append(row)
    _add_roofs(rows, rate)
    return rows


def _add_roofs(rows: list[dict], rate: float) -> None:
    for row in rows:
        row["roof_s"] = row["bytes_per_step_mean"] / rate
        row["roof_fraction"] = row["roof_s"] / row["median_s"]


def random_layer(config: DeaMoEConfig, seed: int, dtype: torch.dtype, budget: int) -> DeaMoELayer:
    """DeaMoELayer.random, drawn straight into dtype where its float32 copy would not fit."""
    fits = layer_bytes(config, torch.float32) + layer_bytes(config, dtype) < budget
    return DeaMoELayer.random(config, seed=seed, dtype=dtype, low_memory=not fits)


def skipped_list(plan: MemoryPlan, wanted: list[str]) -> list[dict]:
    return [
        {"name": n, "model": n.split("/")[0], "runtime": n.split("/")[1], "status": "skipped", "reason": f"memory: {r}"}
        for n, r in plan.skipped.items()
        if n in wanted
    ]


class Log:
    """Phase lines on stderr (the timing loops report through console.Progress)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress = Progress(1, "bench", enabled=enabled)

    def say(self, message: str) -> None:
        if self.enabled:
            import sys
            import time

            print(f"bench {time.perf_counter() - self.progress.start:7.1f}s {message}", file=sys.stderr, flush=True)
