"""The single-layer section: every contender on one layer, with its bytes per step."""

from __future__ import annotations

import gc

import torch

from ..inputs import random_hidden
from ..layer import DeaMoELayer
from ..presets import get_preset
from ..routing import route_logits, router_logits
from ..traffic import BYTES_PER_WEIGHT, weights_loaded
from . import loop, machine
from .contenders import PRIORITY, Contender, MemoryPlan, build_contender, reference_outputs
from .loop import Runner, result_rows, skipped_list, time_all
from .options import DTYPES, BenchOptions, step_seed


def layer_section(options: BenchOptions, runner: Runner) -> dict:
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
        return {**section, "status": "skipped", "reason": reason, "contenders": skipped_list(plan, wanted)}

    warmup, steps = options.warmup_steps, options.steps
    contenders: dict[str, Contender] = {}
    for name, why in plan.skipped.items():
        model, runtime = name.split("/")
        contenders[name] = Contender(name, model, runtime, status="skipped", reason=f"memory: {why}")

    log.say(f"building {options.preset} ({options.dtype}): {plan.deamoe_bytes / 1e9:.2f} GB")
    layer = loop.random_layer(config, options.seed, dtype, budget)
    inputs = {
        t: [
            random_hidden(t, config.hidden_size, seed=step_seed(options.seed, t, s), dtype=dtype)
            for s in range(warmup + steps)
        ]
        for t in options.tokens
    }
    traffic = _layer_traffic(layer, inputs, warmup)
    checks = {t: xs[0] for t, xs in inputs.items()}
    refs = {"deamoe": reference_outputs(layer, checks)}

    def build(name: str, module: DeaMoELayer, ref: dict) -> None:
        if name not in plan.kept:
            return
        log.say(f"building {name}")
        contenders[name] = build_contender(name, module, threads, options, ref, checks)

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
        refs["expanded"] = reference_outputs(twin, checks)
        vanilla = _sharing_vanilla(twin)
        refs["vanilla"] = reference_outputs(vanilla, checks)
        build("expanded/cpu", twin, refs["expanded"])
        build("vanilla/ort", vanilla, refs["vanilla"])
        build("expanded/ort", twin, refs["expanded"])
        build("expanded/torch", twin, refs["expanded"])
        del twin, vanilla
    else:
        del layer
    gc.collect()

    runnable = [contenders[n] for n in PRIORITY if n in contenders and contenders[n].status == "ok"]
    results, roof = time_all(runnable, inputs, warmup, steps, runner, "layer")
    section.update(
        status="ok",
        inputs=f"random_hidden(T, {config.hidden_size}, seed=step_seed(seed, T, step), dtype), step < warmup + steps",
        warmup=warmup,
        steps=steps,
        contenders=[contenders[n].to_json() for n in PRIORITY if n in contenders]
        + [c for c in skipped_list(plan, wanted) if c["name"] not in contenders],
        traffic={str(t): v for t, v in traffic.items()},
        roof=roof,
        results=result_rows(results, traffic, roof["bytes_per_s"]),
    )
    return section


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
            per: dict[str, dict[str, list]] = {
                k: {"bytes": [], "departments_used": [], "experts_used": [], "expert_ids": []} for k in kinds
            }
            for x in xs[warmup:]:
                logits = router_logits(x, layer.router.weight, layer.router.logit_bias)
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
