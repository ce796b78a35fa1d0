"""The multi-layer section: a stack of layers, DeaMoE against its expanded twin, time per decoding step."""

from __future__ import annotations

import gc

import torch

from .. import runtimes
from ..config import DeaMoEConfig
from ..errors import DeaMoEError, MissingDependencyError, UsageError
from ..inputs import random_hidden
from ..layer import DeaMoEStack
from ..presets import get_preset
from ..traffic import BYTES_PER_WEIGHT, layer_bytes, weights_loaded
from . import loop, machine
from .contenders import TORCH_COOLDOWN_S, Contender
from .loop import Log, Runner, result_rows, time_all
from .options import DTYPES, BenchOptions, step_seed

STACK_CONTENDERS = ("deamoe/cpu", "expanded/cpu", "deamoe/torch", "expanded/torch")


def stack_layers(options: BenchOptions, log: Log) -> int:
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


def stack_skip_reason(options: BenchOptions) -> str:
    if options.layers in (0, "0"):
        return "not requested (--layers 0)"
    config = get_preset(options.preset)
    dtype = DTYPES[options.stack_dtype]
    per_layer = layer_bytes(config, dtype) + layer_bytes(config.expanded(), dtype)
    return (
        f"one layer of {options.preset} in {options.stack_dtype} with its expanded twin needs about "
        f"{per_layer / 1e9:.1f} GB: more than fits comfortably here (a GPU-sized memory)"
    )


def stack_section(options: BenchOptions, runner: Runner, num_layers: int) -> dict:
    """The FFN part of a decoder: num_layers DeaMoE layers (x <- x + layer(x)) against the
    same stack of expanded twins, on the CPU kernel, and on PyTorch when its copies fit."""
    from ..runtimes.cpu_kernel import CpuKernelRuntime

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
    cpu = runtimes.get("cpu")
    assert isinstance(cpu, CpuKernelRuntime)  # the one runtime that chains layers into a stack

    skipped = {}
    try:
        for i in range(num_layers):
            layer = loop.random_layer(config, options.seed + 1000 + i, dtype, budget)
            with torch.no_grad():
                twin = layer.expanded()
            for kind, module in (("deamoe", layer), ("expanded", twin)):
                cpu_layers[kind].append(cpu.prepare(module, threads=threads))
                if keep_torch:
                    torch_layers[kind].append(module)
            del layer, twin
            gc.collect()
    except (MissingDependencyError, DeaMoEError) as exc:
        return {"status": "skipped", "reason": " ".join(str(exc).split())}

    stacks = {kind: cpu.stack(cpu_layers[kind]) for kind in ("deamoe", "expanded")}

    contenders = []
    for name in wanted:
        kind, runtime = name.split("/")
        if runtime == "cpu":
            # The CPU kernel's stack, packed above one layer at a time (so that the PyTorch
            # copies never pile up), rather than prepared from a whole DeaMoEStack.
            contenders.append(Contender(name, kind, runtime, cooldown_s=options.gap_ms / 1e3).take(stacks[kind]))
        elif keep_torch:
            stack = DeaMoEStack.from_layers(torch_layers[kind])
            cooldown = max(options.gap_ms / 1e3, TORCH_COOLDOWN_S) if options.gap_ms > 0 else 0.0
            contender = Contender(name, kind, runtime, cooldown_s=cooldown)
            contenders.append(contender.take(runtimes.get("torch").prepare(stack)))
        else:
            skipped[name] = "memory: the PyTorch copies of the stack do not fit next to the kernel's"

    inputs = {
        t: [
            random_hidden(t, config.hidden_size, seed=step_seed(options.seed, t, s), dtype=dtype)
            for s in range(warmup + steps)
        ]
        for t in options.tokens
    }
    traffic = _stack_traffic({kind: s.run for kind, s in stacks.items()}, config, dtype, inputs, warmup)
    # Outputs of the two CPU stacks agree (same routing, same math) up to rounding.
    check = {}
    for t, xs in inputs.items():
        a, b = stacks["deamoe"](xs[0]).float(), stacks["expanded"](xs[0]).float()
        check[str(t)] = float((a - b).abs().max())
    results, roof = time_all(contenders, inputs, warmup, steps, runner, f"stack x{num_layers}")
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
        "results": result_rows(results, traffic, roof["bytes_per_s"]),
    }


def _stack_traffic(stacks: dict, config: DeaMoEConfig, dtype: torch.dtype, inputs: dict, warmup: int) -> dict:
    """Bytes per step of each stack (the CPU kernel's): the sum over layers of each layer's routing of the
    input it actually gets (the previous layers' outputs), per deamoe_trt.traffic."""
    b = BYTES_PER_WEIGHT[dtype]
    cfgs = {"deamoe": config, "expanded": config.expanded()}
    out = {}
    for tokens, xs in inputs.items():
        per: dict[str, dict[str, list[int]]] = {
            k: {"bytes": [], "departments_used": [], "experts_used": []} for k in stacks
        }
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
