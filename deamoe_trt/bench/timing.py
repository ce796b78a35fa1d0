"""The interleaved timing loop and the statistics drawn from it."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence

from .contenders import Contender

PROBE = "roof probe"


def interleaved(
    contenders: Sequence[Contender],
    inputs: dict[str, list],
    warmup: int,
    steps: int,
    *,
    cooldown: Callable[[float], None] | None = None,
    probe: Callable[[int], float] | None = None,
    probe_cooldown_s: float = 0.0,
    on_step: Callable[[int], None] | None = None,
) -> tuple[dict[str, list[float]], list[float]]:
    """Seconds per step of each contender over `steps` timed steps after `warmup` untimed
    ones, and the roof probe's bytes/s at each timed step.

    Round-robin: every step runs every contender (and the probe) once on that step's input,
    starting one further along the list each step, so machine noise and cache state fall on
    all of them alike and none is always first. inputs[name][step] is the contender's
    prepared input. Before each timed call, cooldown(s) runs for the cooldown_s of whatever
    ran before it: long enough for that runtime's spinning threads to go back to sleep, so
    they never take the cores of the next one.
    """
    slots: list[Contender | None] = list(contenders) + ([None] if probe else [])
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    rates: list[float] = []
    clock = time.perf_counter
    previous_cooldown = max([c.cooldown_s for c in contenders] + [probe_cooldown_s])
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection in the middle of a timed call would land on one contender
    try:
        for step in range(warmup + steps):
            for i in range(len(slots)):
                contender = slots[(step + i) % len(slots)]
                if cooldown and previous_cooldown > 0:
                    cooldown(previous_cooldown)
                if contender is None:
                    assert probe is not None  # the only empty slot is the probe's
                    rate = probe(step)
                    if step >= warmup:
                        rates.append(rate)
                    previous_cooldown = probe_cooldown_s
                    continue
                x = inputs[contender.name][step]
                start = clock()
                contender.run(x)
                elapsed = clock() - start
                if step >= warmup:
                    times[contender.name].append(elapsed)
                previous_cooldown = contender.cooldown_s
            if on_step:
                on_step(step)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times, rates


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(values),
        "p10_s": percentile(values, 10),
        "p90_s": percentile(values, 90),
        "mean_s": statistics.fmean(values),
        "min_s": min(values),
    }
