"""`deamoe-trt bench`: DeaMoE against its expanded twin and the vanilla ONNX Runtime anchor.

One process, one interleaved loop per token count, fresh pre-generated inputs each step,
medians after warm-up; bytes per step from each step's actual routing (deamoe_trt.traffic);
the roof from the machine's read bandwidth measured here. See docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import gc
import math
import time
from dataclasses import dataclass, field

import torch

from ..config import DeaMoEConfig
from ..errors import DeaMoEError, MissingDependencyError, UsageError
from ..inputs import random_hidden
from ..layer import DeaMoELayer, DeaMoEStack
from ..presets import get_preset
from ..report import Progress
from ..routing import route_logits, router_logits
from ..traffic import BYTES_PER_WEIGHT, weights_loaded
from . import bandwidth as bw
from . import machine
from .contenders import PRIORITY, Contender, MemoryPlan, layer_bytes
from .timing import interleaved, percentile, summary

SCHEMA = "deamoe-trt-bench/1"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
MAX_STEPS = 10_000
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


def step_seed(seed: int, tokens: int, step: int) -> int:
    """Seed of the input of `step` at `tokens` tokens: x = random_hidden(tokens, d, seed=...)."""
    return seed * 100_000_000 + tokens * 10_000 + step


@dataclass
class BenchOptions:
    preset: str = "qwen3-30b-a3b-layer"
    tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    dtype: str = "fp32"
    steps: int = 200
    warmup: int | None = None  # default: max(3, steps // 10)
    seed: int = 0
    threads: int | None = None  # default: every core
    layers: int | str = "auto"  # multi-layer section: a count, "auto" (fits memory) or 0 (off)
    stack_dtype: str = "fp16"
    quick: bool = False
    gap_ms: float = 2.0  # busy pause before each timed call (longer after spinning runtimes)
    only: list[str] | None = None  # contender names to run (default all)
    bandwidth_bytes: int = 1 << 30
    bandwidth_passes: int = 9
    probe_bytes: int = 128 << 20  # bytes the interleaved roof probe reads per step
    memory_fraction: float = 0.8  # of MemAvailable the run may use
    ort_spinning: bool = False  # see ORT_SPINNING_COOLDOWN_S
    progress: bool = True

    @classmethod
    def quick_run(cls, **changes) -> BenchOptions:
        """Seconds, not minutes: the tiny preset, few steps, a small bandwidth buffer."""
        base = {
            "preset": "tiny",
            "tokens": [1, 3],
            "steps": 12,
            "warmup": 2,
            "layers": "auto",
            "gap_ms": 0.0,
            "bandwidth_bytes": 64 << 20,
            "bandwidth_passes": 3,
            "probe_bytes": 8 << 20,
            "quick": True,
        }
        base.update(changes)
        return cls(**base)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.stack_dtype not in DTYPES:
            raise UsageError(f"--stack-dtype must be one of {', '.join(DTYPES)}, got {self.stack_dtype!r}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise UsageError(f"--steps must be between 1 and {MAX_STEPS}, got {self.steps}")
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if not 0 <= self.gap_ms <= 1000:
            raise UsageError(f"--gap-ms must be between 0 and 1000, got {self.gap_ms}")
        if any(t > 9_999 for t in self.tokens):
            raise UsageError("--tokens must be below 10000")
        if self.only:
            unknown = sorted(set(self.only) - set(PRIORITY))
            if unknown:
                raise UsageError(f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(PRIORITY)}")
        get_preset(self.preset)

    @property
    def warmup_steps(self) -> int:
        return self.warmup if self.warmup is not None else max(3, self.steps // 10)


def run_bench(options: BenchOptions) -> dict:
    """Run the benchmark; returns the JSON-ready result (see docs/benchmarks.md for its fields)."""
    options.validate()
    threads = options.threads or machine.cores()
    torch.set_num_threads(threads)
    started = datetime.datetime.now(datetime.timezone.utc)
    result = {
        "schema": SCHEMA,
        "created": started.isoformat(timespec="seconds"),
        "machine": machine.machine_info(threads),
        "settings": _settings(options, threads),
    }
    log = _Log(options.progress)

    log.say(f"measuring read bandwidth ({options.bandwidth_bytes / 2**20:.0f} MiB buffer, {threads} threads)")
    before = bw.kernel_bandwidth(options.bandwidth_bytes, options.bandwidth_passes, threads)
    numpy_rate = bw.numpy_bandwidth(options.bandwidth_bytes, max(3, options.bandwidth_passes // 2))
    result["bandwidth"] = {"kernel_before": before, "numpy": numpy_rate}

    runner = _Runner(options, threads, log)
    result["layer"] = _layer_section(options, runner)
    gc.collect()
    stack_layers = _stack_layers(options, log)
    if stack_layers:
        result["stack"] = _stack_section(options, runner, stack_layers)
    else:
        result["stack"] = {"status": "skipped", "reason": _stack_skip_reason(options)}
    runner.close()
    gc.collect()

    after = bw.kernel_bandwidth(options.bandwidth_bytes, options.bandwidth_passes, threads)
    result["bandwidth"]["kernel_after"] = after
    result["bandwidth"]["standalone_bytes_per_s"] = _median(before["passes_bytes_per_s"] + after["passes_bytes_per_s"])
    result["machine"]["load_average_end"] = machine.load_average()
    result["elapsed_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    return result


class _Runner:
    """What every timing loop shares: the threads, the busy pause between timed calls (a pool
    of its own, so no runtime's threads are kept awake for it) and the roof probe."""

    def __init__(self, options: BenchOptions, threads: int, log: _Log):
        from ..cpu import Pool

        self.options, self.threads, self.log = options, threads, log
        self.base_cooldown_s = options.gap_ms / 1e3
        self.warmer = Pool(threads, spin_us=0, wake_spin_us=0) if self.base_cooldown_s > 0 else None
        self.probe = bw.RoofProbe(options.probe_bytes, threads)

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


# ---------------------------------------------------------------------------------------------
# Single layer: every contender.
# ---------------------------------------------------------------------------------------------


def _layer_section(options: BenchOptions, runner: _Runner) -> dict:
    threads, log = runner.threads, runner.log
    config = get_preset(options.preset)
    dtype = DTYPES[options.dtype]
    wanted = options.only or list(PRIORITY)
    budget = int(machine.available_memory() * options.memory_fraction) - options.bandwidth_bytes
    plan = MemoryPlan.make(config, dtype, budget, wanted)
    section = {
        "preset": options.preset,
        "config": config.to_dict(),
        "dtype": options.dtype,
        "bytes_per_weight": BYTES_PER_WEIGHT[dtype],
        "layer_bytes": {"deamoe": plan.deamoe_bytes, "expanded": plan.expanded_bytes},
        "memory_budget_bytes": budget,
        "memory_peak_estimate_bytes": plan.peak,
    }
    # The kernel's DeaMoE is what every comparison is about: without it (or, with --only,
    # without anything) the section is skipped rather than run on PyTorch alone.
    if not plan.kept or ("deamoe/cpu" in wanted and "deamoe/cpu" not in plan.kept):
        reason = (
            f"{options.preset} in {options.dtype} needs a GPU-sized memory: its DeaMoE form alone is "
            f"{plan.deamoe_bytes / 1e9:.1f} GB (the expanded twin {plan.expanded_bytes / 1e9:.1f} GB) and a "
            f"contender needs a second copy; {budget / 1e9:.1f} GB may be used here"
        )
        log.say(f"skipping the single-layer benchmark: {reason}")
        return {**section, "status": "skipped", "reason": reason, "contenders": _skipped_list(plan, wanted)}

    warmup, steps = options.warmup_steps, options.steps
    contenders: dict[str, Contender] = {}
    for name, why in plan.skipped.items():
        contenders[name] = Contender(name, *name.split("/"), status="skipped", reason=f"memory: {why}")

    log.say(f"building {options.preset} ({options.dtype}): {plan.deamoe_bytes / 1e9:.2f} GB")
    layer = _random_layer(config, options.seed, dtype, budget)
    inputs = {
        t: [
            random_hidden(t, config.hidden_size, seed=step_seed(options.seed, t, s), dtype=dtype)
            for s in range(warmup + steps)
        ]
        for t in options.tokens
    }
    traffic = _layer_traffic(layer, inputs, warmup)
    checks = {t: xs[0] for t, xs in inputs.items()}
    refs = {"deamoe": _outputs(layer, checks)}

    def build(name: str, module: DeaMoELayer, ref: dict) -> None:
        if name not in plan.kept:
            return
        log.say(f"building {name}")
        contenders[name] = _build_contender(name, module, threads, options, ref, checks)

    build("deamoe/cpu", layer, refs["deamoe"])
    build("deamoe/ort", layer, refs["deamoe"])
    build("deamoe/torch", layer, refs["deamoe"])
    twin = vanilla = None
    if any(n.split("/")[0] != "deamoe" for n in plan.kept):
        log.say("building the expanded twin")
        with torch.no_grad():
            twin = layer.expanded()
        if "deamoe/torch" not in plan.kept:
            del layer
            gc.collect()
        refs["expanded"] = _outputs(twin, checks)
        vanilla = _sharing_vanilla(twin)
        refs["vanilla"] = _outputs(vanilla, checks)
        build("expanded/cpu", twin, refs["expanded"])
        build("vanilla/ort", vanilla, refs["vanilla"])
        build("expanded/ort", twin, refs["expanded"])
        build("expanded/torch", twin, refs["expanded"])
        del twin, vanilla
    else:
        del layer
    gc.collect()

    runnable = [contenders[n] for n in PRIORITY if n in contenders and contenders[n].status == "ok"]
    results, roof = _time_all(runnable, inputs, warmup, steps, runner, "layer")
    section.update(
        status="ok",
        inputs=f"random_hidden(T, {config.hidden_size}, seed=step_seed(seed, T, step), dtype), step < warmup + steps",
        warmup=warmup,
        steps=steps,
        contenders=[contenders[n].to_json() for n in PRIORITY if n in contenders]
        + [c for c in _skipped_list(plan, wanted) if c["name"] not in contenders],
        traffic={str(t): v for t, v in traffic.items()},
        roof=roof,
        results=_result_rows(results, traffic, roof["bytes_per_s"]),
    )
    return section


def _build_contender(name: str, module, threads: int, options: BenchOptions, ref: dict, checks: dict) -> Contender:
    model, runtime = name.split("/")
    contender = Contender(name, model, runtime, cooldown_s=options.gap_ms / 1e3)
    if options.gap_ms > 0 and runtime == "torch":
        contender.cooldown_s = max(contender.cooldown_s, TORCH_COOLDOWN_S)
    if options.gap_ms > 0 and runtime == "ort" and options.ort_spinning:
        contender.cooldown_s = max(contender.cooldown_s, ORT_SPINNING_COOLDOWN_S)
    try:
        if runtime == "cpu":
            from ..cpu import CpuDeaMoE, CpuDeaMoEStack, simd

            fast = (
                CpuDeaMoEStack(module, threads=threads)
                if isinstance(module, DeaMoEStack)
                else CpuDeaMoE(module, threads=threads)
            )
            contender.run = fast
            contender.prepare = _identity
            contender.to_torch = _identity
            contender.memory_bytes = fast.nbytes
            contender.info = {"simd": simd(), "threads": threads}
        elif runtime == "torch":

            def run(x, module=module):
                with torch.inference_mode():
                    return module(x)

            contender.run = run
            contender.prepare = _identity
            contender.to_torch = _identity
            contender.memory_bytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
            contender.info = {"threads": torch.get_num_threads()}
        else:
            contender.run, contender.info = _ort_runner(module, threads, options)
            contender.prepare = _to_numpy
            contender.to_torch = torch.from_numpy
            contender.memory_bytes = _module_bytes(module)
        # A runtime that cannot run this model (ORT or PyTorch without fp16 CPU kernels...)
        # fails here, on the check inputs, rather than in the middle of the timed loop.
        contender.info["max_abs_diff"] = _check(contender, ref, checks)
    except MissingDependencyError as exc:
        contender.status, contender.reason = "skipped", _one_line(exc)
        return contender
    except Exception as exc:  # one contender failing must not end the benchmark
        contender.status, contender.reason = "failed", f"{type(exc).__name__}: {_one_line(exc)}"
        contender.run = None
        return contender
    dtype = next(iter(checks.values())).dtype
    scale = max(float(r.abs().max()) for r in ref.values())
    if contender.info["max_abs_diff"] > CHECK_TOLERANCE[dtype] * max(scale, 1e-6):
        contender.info["warning"] = f"outputs differ from the PyTorch reference by {contender.info['max_abs_diff']:.3g}"
    return contender


def _ort_runner(module, threads: int, options: BenchOptions):
    from .ort_models import BUILDER, build_ort_model, make_session

    model = build_ort_model(module)
    ort_model = make_session(model, threads, spinning=options.ort_spinning)
    del model
    info = {
        "builder": BUILDER,
        "threads": threads,
        "spinning": options.ort_spinning,
        "execution_mode": "sequential",
    }
    return ort_model.run, info


def _check(contender: Contender, ref: dict, checks: dict) -> float:
    worst = 0.0
    for tokens, x in checks.items():
        y = contender.to_torch(contender.run(contender.prepare(x))).float()
        worst = max(worst, float((y - ref[tokens]).abs().max()))
    return worst


def _outputs(module, checks: dict) -> dict:
    with torch.inference_mode():
        return {t: module(x).float() for t, x in checks.items()}


def _sharing_vanilla(twin: DeaMoELayer) -> DeaMoELayer:
    """twin.vanilla() without a copy: same tensors, one-stage routing."""
    vanilla = DeaMoELayer(twin.config.vanilla(), dtype=twin.dtype, device="meta")
    vanilla.load_state_dict(twin.state_dict(), assign=True)
    return vanilla


def _layer_traffic(layer: DeaMoELayer, inputs: dict, warmup: int) -> dict:
    """Bytes per timed step for each model kind, from each step's routing (deamoe_trt.traffic).

    The expanded twin routes exactly as the layer (same router, same rule); vanilla routes
    one-stage over the same scores."""
    config, b, rb = layer.config, BYTES_PER_WEIGHT[layer.dtype], BYTES_PER_WEIGHT[layer.router_dtype]
    kinds = {"deamoe": config, "expanded": config.expanded(), "vanilla": config.vanilla()}
    bias = layer.router.bias.detach() if layer.router.bias is not None else None
    out = {}
    with torch.inference_mode():
        for tokens, xs in inputs.items():
            per = {k: {"bytes": [], "departments_used": [], "experts_used": [], "expert_ids": []} for k in kinds}
            for x in xs[warmup:]:
                logits = router_logits(x, layer.router.weight)
                deamoe_routing = route_logits(logits, bias, config)
                routings = {
                    "deamoe": deamoe_routing,
                    "expanded": deamoe_routing,
                    "vanilla": route_logits(logits, bias, kinds["vanilla"]),
                }
                for kind, cfg in kinds.items():
                    routing = routings[kind]
                    step = weights_loaded(cfg, routing, b, router_bytes_per_weight=rb)
                    per[kind]["bytes"].append(step.total)
                    per[kind]["departments_used"].append(step.departments_used)
                    per[kind]["experts_used"].append(step.experts_used)
                    per[kind]["expert_ids"].append(routing.expert_ids.tolist())
            out[tokens] = per
    return out


# ---------------------------------------------------------------------------------------------
# Multi-layer: a stack of layers, DeaMoE against its expanded twin, time per decoding step.
# ---------------------------------------------------------------------------------------------

STACK_CONTENDERS = ("deamoe/cpu", "expanded/cpu", "deamoe/torch", "expanded/torch")


def _stack_layers(options: BenchOptions, log: _Log) -> int:
    if options.layers in (0, "0"):
        return 0
    config = get_preset(options.preset)
    dtype = DTYPES[options.stack_dtype]
    per_layer = layer_bytes(config, dtype) + layer_bytes(config.expanded(), dtype)
    budget = int(machine.available_memory() * options.memory_fraction * 0.75)
    fits = budget // max(per_layer, 1)
    if options.layers == "auto":
        layers = int(min(fits, 2 if options.quick else 8))
        if layers < 1:
            return 0
        log.say(f"multi-layer: {layers} layer(s) of {options.preset} in {options.stack_dtype} fit comfortably")
        return layers
    layers = int(options.layers)
    if layers > fits:
        raise UsageError(
            f"--layers {layers}: {layers} layers of {options.preset} in {options.stack_dtype} with their expanded "
            f"twins need about {layers * per_layer / 1e9:.1f} GB; {budget / 1e9:.1f} GB may be used here "
            f"(try --layers {max(int(fits), 1)} or --layers auto)"
        )
    return layers


def _stack_skip_reason(options: BenchOptions) -> str:
    if options.layers in (0, "0"):
        return "not requested (--layers 0)"
    config = get_preset(options.preset)
    dtype = DTYPES[options.stack_dtype]
    per_layer = layer_bytes(config, dtype) + layer_bytes(config.expanded(), dtype)
    return (
        f"one layer of {options.preset} in {options.stack_dtype} with its expanded twin needs about "
        f"{per_layer / 1e9:.1f} GB: more than fits comfortably here (a GPU-sized memory)"
    )


def _stack_section(options: BenchOptions, runner: _Runner, num_layers: int) -> dict:
    """The FFN part of a decoder: num_layers DeaMoE layers (x <- x + layer(x)) against the
    same stack of expanded twins, on the CPU kernel, and on PyTorch when its copies fit."""
    threads, log = runner.threads, runner.log
    config = get_preset(options.preset)
    dtype = DTYPES[options.stack_dtype]
    warmup, steps = options.warmup_steps, options.steps
    per_layer = layer_bytes(config, dtype) + layer_bytes(config.expanded(), dtype)
    budget = int(machine.available_memory() * options.memory_fraction)
    wanted = [n for n in STACK_CONTENDERS if not options.only or n in options.only]
    if not wanted:
        return {
            "status": "skipped",
            "reason": f"--only names none of the stack's contenders ({', '.join(STACK_CONTENDERS)})",
        }
    keep_torch = 2 * num_layers * per_layer < budget and any(n.endswith("/torch") for n in wanted)

    log.say(f"building a {num_layers}-layer stack of {options.preset} ({options.stack_dtype}) and its twin")
    cpu_layers: dict[str, list] = {"deamoe": [], "expanded": []}
    torch_layers: dict[str, list] = {"deamoe": [], "expanded": []}
    from ..cpu import CpuDeaMoE, CpuDeaMoEStack, simd

    skipped = {}
    try:
        for i in range(num_layers):
            layer = _random_layer(config, options.seed + 1000 + i, dtype, budget)
            with torch.no_grad():
                twin = layer.expanded()
            for kind, module in (("deamoe", layer), ("expanded", twin)):
                cpu_layers[kind].append(CpuDeaMoE(module, threads=threads))
                if keep_torch:
                    torch_layers[kind].append(module)
            del layer, twin
            gc.collect()
    except (MissingDependencyError, DeaMoEError) as exc:
        return {"status": "skipped", "reason": " ".join(str(exc).split())}

    stacks = {kind: CpuDeaMoEStack.from_layers(cpu_layers[kind]) for kind in ("deamoe", "expanded")}

    contenders = []
    for name in wanted:
        kind, runtime = name.split("/")
        if runtime == "cpu":
            contenders.append(
                Contender(
                    name,
                    kind,
                    runtime,
                    run=stacks[kind],
                    prepare=_identity,
                    to_torch=_identity,
                    memory_bytes=stacks[kind].nbytes,
                    cooldown_s=options.gap_ms / 1e3,
                    info={"simd": simd(), "threads": threads},
                )
            )
        elif keep_torch:
            module = DeaMoEStack.from_layers(torch_layers[kind])

            def run(x, module=module):
                with torch.inference_mode():
                    return module(x)

            cooldown = max(options.gap_ms / 1e3, TORCH_COOLDOWN_S) if options.gap_ms > 0 else 0.0
            contenders.append(
                Contender(
                    name,
                    kind,
                    runtime,
                    run=run,
                    prepare=_identity,
                    to_torch=_identity,
                    cooldown_s=cooldown,
                    memory_bytes=_module_bytes(module),
                    info={"threads": torch.get_num_threads()},
                )
            )
        else:
            skipped[name] = "memory: the PyTorch copies of the stack do not fit next to the kernel's"

    inputs = {
        t: [
            random_hidden(t, config.hidden_size, seed=step_seed(options.seed, t, s), dtype=dtype)
            for s in range(warmup + steps)
        ]
        for t in options.tokens
    }
    traffic = _stack_traffic(stacks, config, dtype, inputs, warmup)
    # Outputs of the two CPU stacks agree (same routing, same math) up to rounding.
    check = {}
    for t, xs in inputs.items():
        a, b = stacks["deamoe"](xs[0]).float(), stacks["expanded"](xs[0]).float()
        check[str(t)] = float((a - b).abs().max())
    results, roof = _time_all(contenders, inputs, warmup, steps, runner, f"stack x{num_layers}")
    return {
        "status": "ok",
        "preset": options.preset,
        "dtype": options.stack_dtype,
        "num_layers": num_layers,
        "bytes_per_weight": BYTES_PER_WEIGHT[dtype],
        "layer_bytes": {"deamoe": layer_bytes(config, dtype), "expanded": layer_bytes(config.expanded(), dtype)},
        "inputs": "random_hidden(T, d, seed=step_seed(seed, T, step), dtype); layer i has weights of seed + 1000 + i",
        "warmup": warmup,
        "steps": steps,
        "deamoe_vs_expanded_max_abs_diff": check,
        "traffic_routing": "each layer's routing by the CPU kernel (held to deamoe_trt.routing's decisions by "
        "tests/cpu) of the input that layer receives; bytes by deamoe_trt.traffic",
        "contenders": [c.to_json() for c in contenders]
        + [
            {"name": n, "model": n.split("/")[0], "runtime": n.split("/")[1], "status": "skipped", "reason": r}
            for n, r in skipped.items()
        ],
        "traffic": {str(t): v for t, v in traffic.items()},
        "roof": roof,
        "results": _result_rows(results, traffic, roof["bytes_per_s"]),
    }


def _stack_traffic(stacks: dict, config: DeaMoEConfig, dtype: torch.dtype, inputs: dict, warmup: int) -> dict:
    """Bytes per step of each stack: the sum over layers of each layer's routing of the
    input it actually gets (the previous layers' outputs), per deamoe_trt.traffic."""
    b = BYTES_PER_WEIGHT[dtype]
    cfgs = {"deamoe": config, "expanded": config.expanded()}
    out = {}
    for tokens, xs in inputs.items():
        per = {k: {"bytes": [], "departments_used": [], "experts_used": []} for k in stacks}
        for x in xs[warmup:]:
            for kind, stack in stacks.items():
                total = used_d = used_e = 0
                h = x
                for layer in stack.layers:
                    step = weights_loaded(cfgs[kind], layer.route(h), b)
                    total += step.total
                    used_d += step.departments_used
                    used_e += step.experts_used
                    h = h + layer(h)
                per[kind]["bytes"].append(total)
                per[kind]["departments_used"].append(used_d)
                per[kind]["experts_used"].append(used_e)
        out[tokens] = per
    return out


# ---------------------------------------------------------------------------------------------
# Shared pieces.
# ---------------------------------------------------------------------------------------------


def _time_all(contenders, inputs, warmup, steps, runner: _Runner, label) -> tuple[dict, dict]:
    """Timings per token count and contender, and the roof: the probe's median read rate
    over every timed step of this section, measured interleaved with the contenders."""
    results, rates = {}, []
    options = runner.options
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
            probe=runner.probe,
            probe_cooldown_s=runner.base_cooldown_s,
            on_step=on_step,
        )
        rates += probe_rates
        results[tokens] = {c.name: (c, times[c.name]) for c in contenders}
    roof = {
        "bytes_per_s": _median(rates),
        "p10_bytes_per_s": percentile(rates, 10),
        "p90_bytes_per_s": percentile(rates, 90),
        "method": runner.probe.method,
        "probe_bytes": runner.probe.nbytes,
        "probes_bytes_per_s": rates,
    }
    return results, roof


def _result_rows(results: dict, traffic: dict, rate: float) -> list[dict]:
    rows = []
    for tokens, per in results.items():
        medians = {name: _median(times) for name, (_, times) in per.items()}
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


def _random_layer(config: DeaMoEConfig, seed: int, dtype: torch.dtype, budget: int) -> DeaMoELayer:
    """DeaMoELayer.random, which initialises in fp32 and then converts: where that fp32 copy
    does not fit, the same distribution drawn tensor slice by tensor slice in dtype."""
    if layer_bytes(config, torch.float32) + layer_bytes(config, dtype) < budget:
        return DeaMoELayer.random(config, seed=seed, dtype=dtype)
    layer = DeaMoELayer(config, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    c = config
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if name == "router.bias":
                param.copy_(0.02 * torch.randn(param.shape, generator=gen))
                continue
            fan_in = param.shape[-1]
            if name.endswith("down") and not name.startswith("shared_experts"):
                fan_in = c.expert_intermediate_size
            for part in param.view(-1, *param.shape[-2:]) if param.dim() >= 2 else [param]:
                part.copy_(torch.randn(part.shape, generator=gen) / math.sqrt(fan_in))
    return layer


def _skipped_list(plan: MemoryPlan, wanted: list[str]) -> list[dict]:
    return [
        {"name": n, "model": n.split("/")[0], "runtime": n.split("/")[1], "status": "skipped", "reason": f"memory: {r}"}
        for n, r in plan.skipped.items()
        if n in wanted
    ]


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


def _module_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _identity(x):
    return x


def _to_numpy(x: torch.Tensor):
    return x.numpy()


def _median(values) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


class _Log:
    """Phase lines on stderr (the timing loops report through report.Progress)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress = Progress(1, "bench", enabled=enabled)

    def say(self, message: str) -> None:
        if self.enabled:
            import sys
            import time

            print(f"bench {time.perf_counter() - self.progress.start:7.1f}s {message}", file=sys.stderr, flush=True)
