"""The whole conversion of a layer stack or a language model, and its comparison report.

For the requested shared size (and, for the plot, shared fractions 0.25 / 0.5 / 0.75) it
builds, from the same calibration data:
- converted: departments by clustering, aligned neurons, least-squares fit (deamoe-trt's);
- converted + healed: the same after layer-wise (and, for LMs, end-to-end) distillation;
- naive: experts in source order, no alignment, plain mean of the first f_s neurons;
- merged: each department's experts merged into one expert (f_p = 0) as wide as makes its
  bytes per step equal to the converted layer's (M-SMoE / Sub-MoE style cluster merging);
and measures each against the source on held-out data: per-layer relative output error
and expert-set agreement on the source's own held-out hidden states, bytes per one-token
decoding step (deamoe_trt.traffic, routing on those hidden states), and for language
models held-out perplexity and greedy next-token agreement.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ..console import Progress
from ..layer import DeaMoELayer
from ..traffic import BYTES_PER_WEIGHT
from . import baselines

if TYPE_CHECKING:
    from ..lm.model import DeaMoELM
from ..work_folder import WorkCache, fingerprint, open_work
from .core import (
    ConvertSettings,
    LayerConversion,
    convert_layer,
    expert_agreement,
    plan_order,
    score_agreement,
    weight_kept,
)
from .distill import world
from .heal import heal_layer, heal_lm
from .metrics import (
    STEP_TOKENS,
    departments_per_token,
    error_split,
    layer_step_bytes,
    lm_quality,
    relative_error,
    step_bytes,
)
from .resume import pack_module, unpack_module

SWEEP = (0.25, 0.5, 0.75)


@dataclass
class Source:
    """A model to convert: its MoE layers and, per layer, calibration and held-out inputs."""

    layers: list[DeaMoELayer]
    calibration: list[torch.Tensor]  # [T, d] per layer
    heldout: list[torch.Tensor]
    lm: DeaMoELM | None = None
    calibration_windows: torch.Tensor | None = None  # [W, L] token ids
    heldout_windows: torch.Tensor | None = None
    heal_windows: torch.Tensor | None = None  # end-to-end healing's windows (default calibration_windows)


@dataclass
class Variant:
    name: str
    fraction: float
    layers: list[DeaMoELayer]
    orders: list[torch.Tensor]
    lm: DeaMoELM | None = None
    heal_losses: dict[str, list[float]] = field(default_factory=dict)
    detail: dict = field(default_factory=dict)  # a baseline's size (expert width, top-k, rank)


def source_lm_hidden(lm, windows: torch.Tensor) -> list[torch.Tensor]:
    """Each DeaMoE block's FFN input (post-attention RMSNorm output) on windows, [W*L, d] per block."""
    captured: list[torch.Tensor] = []
    hooks = [
        lm.layers[i].post_attention_layernorm.register_forward_hook(
            lambda _m, _i, out: captured.append(out.detach().reshape(-1, out.shape[-1]))
        )
        for i in lm.moe_layers()
    ]
    try:
        with torch.no_grad():
            lm(windows)
    finally:
        for h in hooks:
            h.remove()
    return captured


def _with_fraction(settings: ConvertSettings, fraction: float | None, width: int) -> ConvertSettings:
    if fraction is None:
        return settings
    return dataclasses.replace(settings, shared_size=round(fraction * width), shared_fraction=None, private_size=None)


def convert_model(
    source: Source,
    settings: ConvertSettings,
    *,
    compare: bool = True,
    sweep: tuple[float, ...] = (),
    progress: bool = True,
    work: str | None = None,
    work_writer: bool = True,
) -> tuple[Variant, dict]:
    """The converted (and healed, if settings.heal_steps) model at the requested size, and the
    report dict (rows of every variant at every size measured). With work (a folder), finished
    pieces are kept there and those of an earlier run with the same inputs reused (resume.py)."""
    for layer in source.layers:
        settings.check(layer.config)
    cache = None
    if work is not None:
        key = fingerprint(_source_tensors(source), settings, compare=compare, sweep=list(sweep))
        distributed = world()[1] > 1
        if distributed and not work_writer:
            torch.distributed.barrier()  # the writer makes or clears the folder first: no half-made folder seen
        cache = open_work(work, key, writer=work_writer, log=sys.stderr if progress else _Quiet())
        if distributed and work_writer:
            torch.distributed.barrier()
    width = source.layers[0].config.expert_intermediate_size
    requested = settings.sizes(width)[0] / width
    fractions = [None, *(f for f in sweep if abs(round(f * width) / width - requested) > 1e-9)]
    bar = Progress(len(source.layers), "convert: grouping experts", enabled=progress)
    bar.update("", step=0)

    def plan() -> list[torch.Tensor]:
        orders = []
        for i, (layer, x) in enumerate(zip(source.layers, source.calibration, strict=True)):
            orders.append(plan_order(layer, x, settings))
            bar.update(f"layer {i + 1}")
        return orders

    orders = _piece(
        cache,
        "orders",
        plan,
        lambda orders: ({str(i): o for i, o in enumerate(orders)}, len(orders)),
        lambda tensors, n: [tensors[str(i)] for i in range(n)],
    )
    rows = [_row(cache, "source", lambda: _measure(source, _source_variant(source), source))]
    result = None
    for fraction in fractions:
        s = _with_fraction(settings, fraction, width)
        variants = _convert_all(source, s, orders, compare=compare, progress=progress, cache=cache)
        if fraction is None:  # the converted model, healed when asked
            result = max((v for v in variants if v.name.startswith("converted")), key=lambda v: len(v.name))
        rows += [_measured(cache, source, v, s) for v in variants]
    assert result is not None  # fractions starts with None, the requested size
    report: dict = {
        "source": _describe(source),
        "settings": {k: v for k, v in dataclasses.asdict(settings).items() if v is not None},
        "rows": rows,
    }
    return result, report


def _source_variant(source: Source) -> Variant:
    n = source.layers[0].config.num_experts
    return Variant("source", 0.0, source.layers, [torch.arange(n)] * len(source.layers), lm=source.lm)


def _convert_all(
    source: Source, settings: ConvertSettings, orders, *, compare: bool, progress: bool, cache: WorkCache | None
) -> list[Variant]:
    width = source.layers[0].config.expert_intermediate_size
    fraction = round(settings.sizes(width)[0] / width, 4)
    n_layers = len(source.layers)
    if settings.department_score is None:
        settings = dataclasses.replace(settings, department_score=_common_score(source, settings, orders))
    methods = ["naive", "aligned", "merged"] if compare else ["aligned"]
    if "merged" in methods and source.layers[0].config.ffn_bias:
        # A merged expert has no private part, the only place an expert's own down bias can live.
        methods.remove("merged")
        if progress:
            note = "no merged-experts baseline for experts with biases (it cannot hold them)"
            print(f"convert: note: {note}", file=sys.stderr)
    bar = Progress(n_layers * settings.departments * len(methods), f"convert f_s={fraction:.2f}", enabled=progress)
    done: dict[str, list[LayerConversion]] = {}
    for method in methods:
        merged_width = _merged_width(source, done["aligned"], settings, width) if method == "merged" else None
        done[method] = [
            _piece(
                cache,
                f"fs{fraction:.4f}-{method}-{i}",
                lambda layer=layer, x=x, order=order, method=method, merged_width=merged_width: convert_layer(
                    layer,
                    x,
                    settings,
                    method=method,
                    order=None if method == "naive" else order,
                    merged_width=merged_width,
                    progress=bar,
                ),
                _pack_conversion,
                lambda tensors, meta, layer=layer: LayerConversion(
                    unpack_module(meta["layer"], "layer.", tensors, layer),
                    tensors["order"],
                    meta["method"],
                    meta["agreement"],
                ),
            )
            for i, (layer, x, order) in enumerate(zip(source.layers, source.calibration, orders, strict=True))
        ]
    variants = [
        Variant(m, fraction, [c.layer for c in done[m]], [c.order for c in done[m]]) for m in methods if m != "aligned"
    ]
    aligned = Variant("converted", fraction, [c.layer for c in done["aligned"]], [c.order for c in done["aligned"]])
    variants.append(aligned)
    if compare:
        built = _piece(
            cache,
            f"fs{fraction:.4f}-baselines",
            lambda: baselines.build(
                source.layers, source.calibration, source.heldout, aligned.layers, aligned.orders, settings
            ),
            _pack_baselines,
            lambda tensors, meta: _unpack_baselines(tensors, meta, source.layers),
        )
        variants += [Variant(b.name, fraction, b.layers, b.orders, detail=b.detail) for b in built]
    for v in variants:
        v.lm = _lm_with(source.lm, v.layers) if source.lm is not None else None
    if settings.heal_steps:
        others = baselines.strongest([v for v in variants if v is not aligned], source, 2) if compare else []
        for v in variants if cache is not None else ():  # kept now: a run killed while healing need not again
            _measured(cache, source, v, settings)
        variants += [_heal(source, v, settings, progress, cache) for v in (aligned, *others)]
    return variants


def _common_score(source: Source, settings: ConvertSettings, orders) -> str:
    """One department score for every layer (a model has one config): the best mean agreement."""
    totals: dict[str, float] = {}
    width = source.layers[0].config.expert_intermediate_size
    for layer, x, order in zip(source.layers, source.calibration, orders, strict=True):
        config = settings.target_config(layer.config, width, "max")
        bias = layer.router.bias.detach()[order] if layer.router.bias is not None else None
        logit_bias = layer.router.logit_bias.detach()[order] if layer.router.logit_bias is not None else None
        weight = layer.router.weight.detach()[order]
        agreement = score_agreement(layer.route(x), x, weight, bias, config, order, logit_bias=logit_bias)
        for score, value in agreement.items():
            totals[score] = totals.get(score, 0.0) + value
    return max(totals, key=lambda s: totals[s])


def _merged_width(source: Source, aligned: list[LayerConversion], settings, width) -> int:
    """Neurons per merged expert for the same expected bytes per step as the aligned layers:
    mean U_d x W = mean U_d x f_s + k x f_p (a one-token step loads k private parts)."""
    f_s, f_p = settings.sizes(width)
    k = source.layers[0].config.top_k
    per_token = [departments_per_token(c.layer.route(x)) for c, x in zip(aligned, source.calibration, strict=True)]
    u_d = sum(per_token) / len(per_token)
    return max(1, int(f_s + k * f_p / u_d))


def _heal(
    source: Source, aligned: Variant, settings: ConvertSettings, progress: bool, cache: WorkCache | None
) -> Variant:
    layers = [copy.deepcopy(layer) for layer in aligned.layers]
    healed = Variant(f"{aligned.name} + healed", aligned.fraction, layers, aligned.orders, detail=aligned.detail)
    bar = Progress(settings.heal_steps * len(layers), "heal layer-wise", enabled=progress)
    healed.heal_losses["layer"] = []
    for i, (src, x) in enumerate(zip(source.layers, source.calibration, strict=True)):

        def compute(layer=layers[i], src=src, x=x, i=i):
            steps, lr, seed = settings.heal_steps, settings.heal_lr, settings.seed + i
            return layer, heal_layer(layer, src, x, steps, lr=lr, seed=seed, progress=bar)

        def pack(value):
            tensors: dict[str, torch.Tensor] = {}
            return tensors, {"layer": pack_module(value[0], "layer.", tensors), "losses": value[1]}

        layers[i], losses = _piece(
            cache,
            f"fs{aligned.fraction:.4f}-{healed.name}-{i}",
            compute,
            pack,
            lambda tensors, meta, src=src: (unpack_module(meta["layer"], "layer.", tensors, src), meta["losses"]),
        )
        healed.heal_losses["layer"].append(losses)
    if source.lm is not None:
        healed.lm = _lm_with(source.lm, layers)
        bar = Progress(settings.heal_steps, "heal end-to-end", enabled=progress)
        healed.heal_losses["lm"] = heal_lm(
            healed.lm,
            source.lm,
            source.calibration_windows if source.heal_windows is None else source.heal_windows,
            settings.heal_steps,
            lr=settings.heal_lr,
            seed=settings.seed,
            progress=bar,
            blocks=source.lm.moe_layers(),
            batch_size=settings.heal_batch,
            checkpoint=_checkpoint_path(settings, healed, cache),
            checkpoint_every=settings.heal_checkpoint_every or _work_checkpoint_every(settings, cache),
            device=settings.heal_device,
            fsdp=settings.heal_fsdp,
        )
        healed.layers = [cast(DeaMoELayer, healed.lm.layers[i].mlp) for i in source.lm.moe_layers()]
    return healed


def _checkpoint_path(settings: ConvertSettings, variant: Variant, cache: WorkCache | None = None) -> str | None:
    """One checkpoint file per healed variant and shared fraction in the folder asked for (else
    in the work folder, if any)."""
    folder = settings.heal_checkpoint if settings.heal_checkpoint is not None else cache and cache.folder
    if not folder:
        return None
    name = "".join(c if c.isalnum() else "-" for c in variant.name)
    return f"{folder}/{name}-fs{variant.fraction:.4f}.safetensors"


# End-to-end healing checkpoints per run in the work folder when no --checkpoint-every is given.
WORK_CHECKPOINTS = 10


def _work_checkpoint_every(settings: ConvertSettings, cache: WorkCache | None) -> int:
    if cache is None or settings.heal_checkpoint is not None:
        return 0
    return max(1, settings.heal_steps // WORK_CHECKPOINTS)


def _piece(cache: WorkCache | None, key: str, compute, pack, unpack):
    return compute() if cache is None else cache.piece(key, compute, pack, unpack)


def _row(cache: WorkCache | None, key: str, measure) -> dict:
    """A report row, kept like a piece: measuring every variant again is a rerun's largest fixed cost."""
    return _piece(cache, key, measure, lambda row: ({}, row), lambda _tensors, row: row)


def _measured(cache: WorkCache | None, source: Source, variant: Variant, settings: ConvertSettings) -> dict:
    key = f"fs{variant.fraction:.4f}-row-{variant.name}"
    return _row(cache, key, lambda: _measure(source, variant, source, settings=settings))


def _pack_conversion(c: LayerConversion):
    tensors = {"order": c.order}
    layer = pack_module(c.layer, "layer.", tensors)
    return tensors, {"layer": layer, "method": c.method, "agreement": c.agreement_by_score}


def _pack_baselines(built: list[baselines.Baseline]):
    tensors: dict[str, torch.Tensor] = {}
    meta = []
    for b, base in enumerate(built):
        layers = [pack_module(layer, f"{b}.{i}.", tensors) for i, layer in enumerate(base.layers)]
        tensors.update({f"{b}.order.{i}": o for i, o in enumerate(base.orders)})
        meta.append({"name": base.name, "detail": base.detail, "layers": layers})
    return tensors, meta


def _unpack_baselines(tensors, meta, sources: list[DeaMoELayer]) -> list[baselines.Baseline]:
    return [
        baselines.Baseline(
            m["name"],
            [
                unpack_module(d, f"{b}.{i}.", tensors, src)
                for i, (d, src) in enumerate(zip(m["layers"], sources, strict=True))
            ],
            [tensors[f"{b}.order.{i}"] for i in range(len(sources))],
            m["detail"],
        )
        for b, m in enumerate(meta)
    ]


def _source_tensors(source: Source) -> list[torch.Tensor]:
    """What the source's conversion depends on: its weights and its data."""
    model = source.lm if source.lm is not None else torch.nn.ModuleList(source.layers)
    assert isinstance(model, torch.nn.Module)
    windows = (source.calibration_windows, source.heldout_windows, source.heal_windows)
    return [
        *model.state_dict().values(),
        *source.calibration,
        *source.heldout,
        *(w if w is not None else torch.zeros(0) for w in windows),
    ]


class _Quiet:
    def write(self, _text: str) -> int:
        return 0


def _lm_with(lm, layers: list[DeaMoELayer]):
    """A copy of the language model lm with its DeaMoE FFNs replaced by layers (all of one
    config; its dense blocks kept)."""
    from ..lm import DeaMoELM

    if not all(isinstance(layer, DeaMoELayer) for layer in layers):  # a baseline of another structure
        model = copy.deepcopy(lm)
        for i, layer in zip(lm.moe_layers(), layers, strict=True):
            model.layers[i].mlp = layer
        return model.eval()
    config = lm.config.replace(moe=layers[0].config)
    model = DeaMoELM(config, dtype=lm.dtype)
    moe = lm.moe_layers()
    state = {k: v for k, v in lm.state_dict().items() if not k.startswith(tuple(f"layers.{i}.mlp." for i in moe))}
    for i, layer in zip(moe, layers, strict=True):
        state.update({f"layers.{i}.mlp.{k}": v for k, v in layer.state_dict().items()})
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def _measure(source: Source, variant: Variant, reference: Source, *, settings: ConvertSettings | None = None) -> dict:
    errors, agreements, kept, split = [], [], [], []
    bytes_at = dict.fromkeys(STEP_TOKENS, 0.0)
    source_at = dict.fromkeys(STEP_TOKENS, 0.0)
    for layer, src, x in zip(variant.layers, reference.layers, reference.heldout, strict=True):
        x = x.to(src.dtype)
        y, y_src = layer(x), src(x)
        errors.append(relative_error(y, y_src))
        order = variant.orders[len(errors) - 1]
        routing = layer.route(x)
        agreements.append(expert_agreement(src.route(x), routing, order))
        kept.append(weight_kept(src.route(x), routing, order))
        split.append(error_split(layer, src, order, x))
        for tokens in STEP_TOKENS:
            bytes_at[tokens] += layer_step_bytes(layer, routing, tokens)
            source_at[tokens] += step_bytes(src.config, src.route(x), BYTES_PER_WEIGHT[src.dtype], tokens)
    bytes_per_step, source_bytes = bytes_at[1], source_at[1]
    c = variant.layers[0].config
    row = {
        "method": variant.name,
        "shared_fraction": variant.fraction,
        "f_s": c.shared_intermediate_size,
        "f_p": c.private_intermediate_size,
        "departments": c.num_departments,
        "top_departments": c.top_departments,
        "department_score": c.department_score,
        "bytes_per_step": round(bytes_per_step),
        "bytes_vs_source": round(bytes_per_step / source_bytes, 4),
        # the same at each of STEP_TOKENS tokens per step, keyed by that count
        "bytes_per_step_at": {str(t): round(b) for t, b in bytes_at.items()},
        "bytes_vs_source_at": {str(t): round(b / source_at[t], 4) for t, b in bytes_at.items()},
        "relative_error": [round(e, 5) for e in errors],
        "expert_agreement": [round(a, 4) for a in agreements],
        "weight_kept": [round(w, 4) for w in kept],
        "routing_error": [round(r, 5) for r, _ in split],
        "weights_error": [round(w, 5) for _, w in split],
        **variant.detail,
    }
    if reference.lm is not None and variant.lm is not None:
        windows = reference.heldout_windows
        assert windows is not None  # a language-model source keeps its held-out windows
        source_logits = reference.lm(windows[:, :-1]).logits
        row.update({k: round(v, 4) for k, v in lm_quality(variant.lm, source_logits, windows).items()})
    if variant.heal_losses:
        row["heal_loss"] = {k: _first_last(v) for k, v in variant.heal_losses.items()}
    return row


def _first_last(losses):
    if losses and isinstance(losses[0], list):
        return [_first_last(layer) for layer in losses]
    return [round(losses[0], 5), round(losses[-1], 5)] if losses else []


def _describe(source: Source) -> dict:
    c = source.layers[0].config
    out: dict[str, Any] = {
        "layers": len(source.layers),
        "num_experts": c.num_experts,
        "expert_width": c.expert_intermediate_size,
        "top_k": c.top_k,
        "hidden_size": c.hidden_size,
        "calibration_tokens": int(source.calibration[0].shape[0]),
        "heldout_tokens": int(source.heldout[0].shape[0]),
    }
    if source.lm is not None:
        out["kind"] = "language model"
    return out


# The report's alternatives a user can write instead of the converted model (`convert --method`).
ALTERNATIVES = {"pruned": baselines.PRUNED, "top-k": baselines.TOP_K}


def alternative_model(
    source: Source,
    settings: ConvertSettings,
    method: str,
    size: int,
    *,
    progress: bool = True,
    work: str | None = None,
    work_writer: bool = True,
) -> tuple[Variant, dict]:
    """The report's `method` model ("pruned": experts of `size` neurons; "top-k": top-`size`
    routing), built by the functions the report uses and healed as it heals a baseline when
    settings.heal_steps; and a report of it (and its unhealed self) against the source.
    settings carry healing, ridge and seed only. Pieces resume from work like convert_model's."""
    cache = None
    if work is not None:
        key = fingerprint(_source_tensors(source), settings, method=method, size=size)
        distributed = world()[1] > 1
        if distributed and not work_writer:
            torch.distributed.barrier()
        cache = open_work(work, key, writer=work_writer, log=sys.stderr if progress else _Quiet())
        if distributed and work_writer:
            torch.distributed.barrier()
    name = ALTERNATIVES[method]
    layers: list[DeaMoELayer] = []
    for i, (layer, x) in enumerate(zip(source.layers, source.calibration, strict=True)):
        if method == "top-k":
            layers.append(baselines.lowered_topk_layer(layer, size))
            continue

        def pack(value: DeaMoELayer):
            tensors: dict[str, torch.Tensor] = {}
            return tensors, pack_module(value, "layer.", tensors)

        layers.append(
            _piece(
                cache,
                f"{method}-{i}",
                lambda layer=layer, x=x: baselines.pruned_layer(layer, x, size, ridge=settings.ridge),
                pack,
                lambda tensors, meta, layer=layer: unpack_module(meta, "layer.", tensors, layer),
            )
        )
    n = source.layers[0].config.num_experts
    detail = {"expert_width": size} if method == "pruned" else {"top_k": size}
    variant = Variant(name, 0.0, cast(list, layers), [torch.arange(n)] * len(layers), detail=detail)
    variant.lm = _lm_with(source.lm, variant.layers) if source.lm is not None else None
    rows = [
        _row(cache, "source", lambda: _measure(source, _source_variant(source), source)),
        _measured(cache, source, variant, settings),
    ]
    if settings.heal_steps:
        variant = _heal(source, variant, settings, progress, cache)
        rows.append(_measured(cache, source, variant, settings))
    report: dict = {
        "source": _describe(source),
        "settings": {"method": method, **detail, "heal_steps": settings.heal_steps, "seed": settings.seed},
        "rows": rows,
    }
    return variant, report
