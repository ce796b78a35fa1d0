"""Hugging Face MoE blocks and models as DeaMoE layers (f_s = 0).

A vanilla top-k MoE is the DeaMoE layer with one department (D = 1, g = 1) and no shared
neurons; DeepSeek-V3's group-limited routing is the layer with D = n_group departments,
g = topk_group, sigmoid scores, a selection bias and sum-of-top-2 department scores
(see docs/spec.md, "Special cases"). Importing copies the router, the experts
and the always-on shared experts into the spec's canonical tensors; nothing is trained
or approximated, so the DeaMoE layer's outputs equal the Hugging Face block's.

Both weight layouts are read, by looking at the block's attributes rather than at the
transformers version:
- transformers 5.x: fused experts (``experts.gate_up_proj`` [E, 2I, H], gate rows first;
  ``experts.down_proj`` [E, H, I]) and a router module with ``.weight``;
- transformers 4.x: ``experts`` an ``nn.ModuleList`` of per-expert MLPs with
  ``gate_proj/up_proj/down_proj`` or Mixtral's ``w1/w3/w2`` (gate/up/down), and the
  router an ``nn.Linear`` ``gate`` (DeepSeek-V3: a router module with ``.weight``).

Where this importer differs from a Hugging Face implementation, see docs/importers.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ConfigError, DeaMoEConfig, top_k_moe
from ..errors import UsageError
from ..layer import SUPPORTED_DTYPES, DeaMoELayer, DeaMoEStack

# Hugging Face block class -> family. Subclasses of these classes are accepted too.
SUPPORTED_MODULES = {
    "MixtralSparseMoeBlock": "mixtral",
    "Qwen2MoeSparseMoeBlock": "qwen2_moe",
    "Qwen3MoeSparseMoeBlock": "qwen3_moe",
    "DeepseekV3MoE": "deepseek_v3",
    "GptOssMLP": "gpt_oss",
}
# Hugging Face config.model_type values whose MoE blocks are the ones above.
SUPPORTED_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


@dataclass
class _Weights:
    """One block's tensors in the spec's orientation, before they become a layer."""

    router: torch.Tensor  # [N, d]
    router_bias: torch.Tensor | None  # [N]
    gate_up: torch.Tensor  # [N, 2I, d]
    down: torch.Tensor  # [N, d, I]
    shared_gate_up: torch.Tensor | None = None  # [2F, d]
    shared_down: torch.Tensor | None = None  # [d, F]
    shared_gate: torch.Tensor | None = None  # [1, d]


# Public API -------------------------------------------------------------------------------


def family_of(module: nn.Module) -> str | None:
    """The supported family of a Hugging Face MoE block ('mixtral', ...), or None."""
    for cls in type(module).__mro__:
        if cls.__name__ in SUPPORTED_MODULES:
            return SUPPORTED_MODULES[cls.__name__]
    return None


def from_hf(module: nn.Module, *, dtype: torch.dtype | None = None) -> DeaMoELayer:
    """A DeaMoELayer with the same outputs as a Hugging Face MoE block.

    module: MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock or
    DeepseekV3MoE, in the transformers 5.x or 4.x weight layout, with its weights loaded.
    dtype: the layer's dtype; default the experts' dtype. A float32 router weight stays
    float32 (DeepSeek-V3's), any other is cast to dtype; the selection bias is float32.
    The layer lives on the device of the block's expert weights and shares no storage
    with the block.
    """
    if not isinstance(module, nn.Module):
        raise UsageError(f"from_hf expects a Hugging Face MoE block (an nn.Module), got {type(module).__name__}")
    family = family_of(module)
    name = type(module).__name__
    if family is None:
        raise UsageError(f"unsupported Hugging Face module {name}; supported: {', '.join(SUPPORTED_MODULES)}")
    if family == "gpt_oss":  # biases, the clamped SwiGLU and interleaved experts: its own mapping
        from .families.gpt_oss import layer_from_hf

        return layer_from_hf(module, dtype=dtype)
    if family == "deepseek_v3":
        config, weights = _read_deepseek_v3(module, name)
    else:
        config, weights = _read_softmax_topk(module, name, family)
    return _build_layer(config, weights, dtype, name)


def find_moe_blocks(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    """(HF layer index, module name, block) of every supported MoE block of a model, in order.

    Dense layers (DeepSeek-V3's first_k_dense_replace, Qwen-MoE's mlp_only_layers and
    decoder_sparse_step) hold plain MLPs, so they are not found. The index comes from the
    block's name (``...layers.<i>...``); blocks outside the decoder layers (e.g. a future
    multi-token-prediction head) are left out when the decoder layers have any, and a
    model with no ``layers.<i>`` names has its blocks numbered in order.
    """
    blocks: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if family_of(module) is not None and not any(name.startswith(prefix + ".") for prefix, _ in blocks):
            blocks.append((name, module))
    indexed = [(int(m.group(1)), name, module) for name, module in blocks if (m := _LAYER_INDEX.search(name))]
    return indexed or [(i, name, module) for i, (name, module) in enumerate(blocks)]


def from_hf_model(
    model: nn.Module, *, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None
) -> DeaMoEStack:
    """Every MoE layer of a Hugging Face model (or the ones in layers, by HF layer index)
    as a DeaMoEStack; dense layers are skipped.

    The stack's ``source`` attribute records where it came from, ready for
    ``stack.save_pretrained(dir)``:
    {"hf_model_type": ..., "hf_module": ..., "layers": [HF layer indices, in stack order]}.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"from_hf_model expects a Hugging Face model (an nn.Module), got {type(model).__name__}")
    blocks = find_moe_blocks(model)
    if not blocks:
        raise UsageError(
            f"{type(model).__name__} has no supported MoE layers (looked for {', '.join(SUPPORTED_MODULES)})"
        )
    available = [index for index, _, _ in blocks]
    if len(set(available)) != len(available):
        raise UsageError(f"{type(model).__name__} has more than one MoE block per layer; cannot number its layers")
    if layers is not None:
        wanted = list(dict.fromkeys(int(i) for i in layers))
        if not wanted:
            raise UsageError("no layers selected; pass HF layer indices or leave layers unset for all MoE layers")
        missing = [i for i in wanted if i not in available]
        if missing:
            raise UsageError(
                f"layer {missing[0]} is not a MoE layer of this model "
                f"(dense or out of range); its MoE layers are {_ranges(available)}"
            )
        by_index = {index: (index, name, block) for index, name, block in blocks}
        blocks = [by_index[i] for i in wanted]

    imported: list[DeaMoELayer] = []
    for index, name, block in blocks:
        try:
            imported.append(from_hf(block, dtype=dtype))
        except UsageError as exc:
            raise UsageError(f"layer {index} ({name}): {exc}") from None
        first = imported[0]
        if imported[-1].config != first.config:
            raise UsageError(
                f"MoE layers {blocks[0][0]} and {index} have different shapes or routing "
                f"({', '.join(first.config.differences(imported[-1].config))}); a DeaMoE stack needs one config, "
                "import them separately (layers=[...])"
            )
        if imported[-1].dtype != first.dtype:
            raise UsageError(
                f"MoE layers {blocks[0][0]} and {index} have different dtypes ({first.dtype}, {imported[-1].dtype}); "
                "pass dtype= to import them in one"
            )
    stack = DeaMoEStack.from_layers(imported)
    model_config = getattr(model, "config", None)
    stack.source = {
        "hf_model_type": getattr(model_config, "model_type", None) or family_of(blocks[0][2]),
        "hf_module": type(blocks[0][2]).__name__,
        "layers": [index for index, _, _ in blocks],
    }
    return stack


# Reading blocks ---------------------------------------------------------------------------


def _read_softmax_topk(module: nn.Module, name: str, family: str) -> tuple[DeaMoEConfig, _Weights]:
    """Mixtral, Qwen2-MoE, Qwen3-MoE: softmax over all experts, top-k, optional renormalise."""
    router = _router(module, name)
    weights = _experts(module, name, router)
    num_experts, hidden = cast(torch.Tensor, router.weight).shape
    sources = _param_sources(module)
    top_k = _hyper(sources, ("top_k", "num_experts_per_tok"), name, "top_k")
    # Mixtral always renormalises its top-k probabilities; the Qwen blocks say whether they do.
    norm = family == "mixtral" or bool(_hyper(sources, ("norm_topk_prob",), name, "norm_topk_prob"))
    if family == "qwen2_moe":
        _read_shared(module, name, weights, "shared_expert", gated=True)
    fields = dict(
        hidden_size=hidden,
        num_experts=num_experts,
        intermediate_size=weights.down.shape[-1],
        top_k=int(top_k),
        norm_topk_prob=norm,
        shared_expert_intermediate_size=0 if weights.shared_down is None else weights.shared_down.shape[-1],
        shared_expert_gate=weights.shared_gate is not None,
    )
    return _config(fields, name, top_k_moe), weights


def _read_deepseek_v3(module: nn.Module, name: str) -> tuple[DeaMoEConfig, _Weights]:
    """DeepSeek-V3: sigmoid, selection bias, group-limited routing, ungated shared experts."""
    from .families.deepseek import v3_routing

    router = _router(module, name)
    weights = _experts(module, name, router)
    num_experts, hidden = cast(torch.Tensor, router.weight).shape
    sources = _param_sources(module)
    scoring = _hyper(sources, ("scoring_func",), name, "scoring_func", default="sigmoid")
    if scoring != "sigmoid":
        raise UsageError(f"{name} scores experts with {scoring!r}; DeepSeek-V3 blocks must use 'sigmoid'")
    method = _hyper(sources, ("topk_method",), name, "topk_method", default="noaux_tc")
    if method != "noaux_tc":
        raise UsageError(f"{name} picks experts with topk_method {method!r}; only DeepSeek-V3's noaux_tc is supported")
    n_group = int(_hyper(sources, ("num_group", "n_group"), name, "n_group"))
    topk_group = int(_hyper(sources, ("topk_group",), name, "topk_group"))
    top_k = int(_hyper(sources, ("top_k", "num_experts_per_tok"), name, "top_k"))
    norm = bool(_hyper(sources, ("norm_topk_prob",), name, "norm_topk_prob"))
    scale = float(_hyper(sources, ("routed_scaling_factor",), name, "routed_scaling_factor"))
    if n_group < 1 or num_experts % n_group:
        raise UsageError(f"{name} has {num_experts} experts, not divisible into n_group={n_group} groups")
    bias = getattr(router, "e_score_correction_bias", None)
    if bias is not None:
        weights.router_bias = _tensor(bias, f"{name}.gate.e_score_correction_bias", (num_experts,))
    _read_shared(module, name, weights, "shared_experts", gated=False)
    fields = dict(
        hidden_size=hidden,
        shared_intermediate_size=0,
        private_intermediate_size=weights.down.shape[-1],
        **v3_routing(num_experts, n_group, topk_group, top_k, norm, scale),
        router_bias=bias is not None,
        shared_expert_intermediate_size=0 if weights.shared_down is None else weights.shared_down.shape[-1],
        shared_expert_gate=False,
    )
    return _config(fields, name), weights


def _router(module: nn.Module, name: str) -> nn.Module:
    router = getattr(module, "gate", None)
    weight = getattr(router, "weight", None)
    if not isinstance(router, nn.Module) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise UsageError(f"{name} has no router: expected a .gate module with a 2-D .weight [num_experts, hidden]")
    if isinstance(getattr(router, "bias", None), torch.Tensor):
        raise UsageError(f"{name}.gate has a bias; the DeaMoE router is bias-free (its bias only selects)")
    _tensor(weight, f"{name}.gate.weight", tuple(weight.shape))
    return router


def _experts(module: nn.Module, name: str, router: nn.Module) -> _Weights:
    """Routed experts as gate_up [N, 2I, d], down [N, d, I], from either layout."""
    num_experts, hidden = cast(torch.Tensor, router.weight).shape
    experts = getattr(module, "experts", None)
    if isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor):
        gate_up, down = _fused_experts(experts, name, num_experts, hidden)
    elif isinstance(experts, Iterable) and not isinstance(experts, torch.Tensor):
        members = list(experts)
        if len(members) != num_experts:
            raise UsageError(f"{name} has {len(members)} experts but its router scores {num_experts}")
        pairs = [_mlp(expert, f"{name}.experts.{i}", hidden) for i, expert in enumerate(members)]
        widths = {down.shape[-1] for _, down in pairs}
        if len(widths) != 1:
            raise UsageError(f"{name}'s experts have different widths {sorted(widths)}; DeaMoE experts share one")
        gate_up = torch.stack([gu for gu, _ in pairs])
        down = torch.stack([dn for _, dn in pairs])
    else:
        raise UsageError(
            f"{name}.experts has an unknown layout ({type(experts).__name__}): expected fused gate_up_proj/down_proj "
            "(transformers 5) or a ModuleList of per-expert MLPs (transformers 4)"
        )
    return _Weights(router=router.weight, router_bias=None, gate_up=gate_up, down=down)


def _fused_experts(experts: nn.Module, name: str, num_experts: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    where = f"{name}.experts"
    flags = (("has_bias", True), ("has_gate", False), ("is_concatenated", False), ("has_post_expert_norm", True))
    for flag, bad in flags:
        if getattr(experts, flag, not bad) is bad:
            raise UsageError(f"{where} has {flag}={bad}; only bias-free SwiGLU experts, [gate; up] rows, are supported")
    if getattr(experts, "_is_expert_parallel", False):
        raise UsageError(f"{where} is expert-parallel (holds only local experts); import an unsharded model")
    for attr in ("gate_up_proj_bias", "down_proj_bias"):
        if isinstance(getattr(experts, attr, None), torch.Tensor):
            raise UsageError(f"{where} has {attr}; DeaMoE experts are bias-free")
    # The caller routes here only modules whose gate_up_proj is a tensor.
    gate_up, down = cast(torch.Tensor, experts.gate_up_proj), getattr(experts, "down_proj", None)
    if not isinstance(down, torch.Tensor):
        raise UsageError(f"{where} has gate_up_proj but no down_proj tensor")
    if getattr(experts, "is_transposed", False):  # [E, H, 2I] and [E, I, H]
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if gate_up.dim() != 3 or gate_up.shape[0] != num_experts or gate_up.shape[2] != hidden or gate_up.shape[1] % 2:
        shape = list(gate_up.shape)
        raise UsageError(f"{where}.gate_up_proj has shape {shape}; expected [{num_experts}, 2*I, {hidden}]")
    width = gate_up.shape[1] // 2
    _tensor(gate_up, f"{where}.gate_up_proj", (num_experts, 2 * width, hidden))
    _tensor(down, f"{where}.down_proj", (num_experts, hidden, width))
    _check_silu(getattr(experts, "act_fn", None), where)
    return gate_up, down


def _mlp(mlp: nn.Module | None, where: str, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A SwiGLU MLP (gate_proj/up_proj/down_proj or Mixtral's w1/w3/w2) as gate_up [2I, d], down [d, I]."""
    if mlp is None:
        raise UsageError(f"{where} is missing (an expert-parallel shard?); import an unsharded model")
    for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        if all(isinstance(getattr(mlp, n, None), nn.Module) for n in names):
            gate, up, down = (getattr(mlp, n) for n in names)
            break
    else:
        raise UsageError(
            f"{where} ({type(mlp).__name__}) is not a SwiGLU MLP with gate_proj/up_proj/down_proj or w1/w3/w2"
        )
    for n, linear in zip(names, (gate, up, down), strict=True):
        if isinstance(getattr(linear, "bias", None), torch.Tensor):
            raise UsageError(f"{where}.{n} has a bias; DeaMoE experts are bias-free")
    width = gate.weight.shape[0]
    g = _tensor(gate.weight, f"{where}.{names[0]}.weight", (width, hidden))
    u = _tensor(up.weight, f"{where}.{names[1]}.weight", (width, hidden))
    d = _tensor(down.weight, f"{where}.{names[2]}.weight", (hidden, width))
    _check_silu(getattr(mlp, "act_fn", None), where)
    return torch.cat([g, u], dim=0), d


def _read_shared(module: nn.Module, name: str, weights: _Weights, attr: str, *, gated: bool) -> None:
    mlp = getattr(module, attr, None)
    if mlp is None:
        return
    hidden = weights.router.shape[1]
    gate_up, down = _mlp(mlp, f"{name}.{attr}", hidden)
    if down.shape[-1] == 0:
        return  # width-0 shared expert: contributes nothing
    weights.shared_gate_up, weights.shared_down = gate_up, down
    if gated:
        gate = getattr(module, f"{attr}_gate", None)
        if gate is None:
            raise UsageError(f"{name} has {attr} but no {attr}_gate")
        if isinstance(getattr(gate, "bias", None), torch.Tensor):
            raise UsageError(f"{name}.{attr}_gate has a bias; DeaMoE's shared-expert gate is bias-free")
        weights.shared_gate = _tensor(getattr(gate, "weight", None), f"{name}.{attr}_gate.weight", (1, hidden))


# Helpers ------------------------------------------------------------------------------------


def _param_sources(module: nn.Module) -> list[Any]:
    """Where routing hyperparameters live: the router (transformers 5), the block (4.x),
    then any config the block, its router or its experts keep."""
    router = getattr(module, "gate", None)
    experts = getattr(module, "experts", None)
    sources = [router, module]
    for owner in (module, router, experts):
        config = getattr(owner, "config", None)
        if config is not None and not isinstance(config, torch.Tensor):
            sources.append(config)
    return [s for s in sources if s is not None]


_MISSING = object()


def _hyper(sources: list[Any], names: tuple[str, ...], where: str, what: str, default: Any = _MISSING) -> Any:
    for source in sources:
        for attr in names:
            value = getattr(source, attr, None)
            if value is not None and not isinstance(value, (nn.Module, torch.Tensor)):
                return value
    if default is not _MISSING:
        return default
    raise UsageError(f"cannot find {what} on {where}, its router or its config (looked for {', '.join(names)})")


def _tensor(value: Any, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise UsageError(f"{where} is missing or not a tensor")
    if tuple(value.shape) != tuple(shape):
        raise UsageError(f"{where} has shape {list(value.shape)}; expected {list(shape)}")
    if value.is_meta:
        raise UsageError(f"{where} is on the meta device; load the model's weights before importing")
    if not (value.is_floating_point() and value.dtype.itemsize >= 2):
        raise UsageError(
            f"{where} is {str(value.dtype).removeprefix('torch.')}; import a float32, float16 or bfloat16 model "
            "(dequantize quantized weights first)"
        )
    return value.detach()


_PROBE = torch.linspace(-6.0, 6.0, 49)


def _check_silu(act: Any, where: str) -> None:
    """DeaMoE experts are SwiGLU: the activation must be silu. Checked by value, so any
    silu implementation (nn.SiLU, transformers' SiLUActivation, a hub kernel) passes."""
    if act is None:
        return  # layouts without an act_fn attribute: the class decides, and all supported ones use silu
    try:
        with torch.no_grad():
            ok = bool(torch.allclose(act(_PROBE).float(), F.silu(_PROBE), atol=1e-6))
    except Exception:  # e.g. a GPU-only kernel: fall back to its name
        ok = type(act).__name__ in ("SiLU", "SiLUActivation")
    if not ok:
        raise UsageError(f"{where} uses activation {type(act).__name__}, not silu; DeaMoE experts are SwiGLU")


def _config(fields: dict[str, Any], name: str, make: Callable[..., DeaMoEConfig] = DeaMoEConfig) -> DeaMoEConfig:
    try:
        return make(**fields)
    except ConfigError as exc:
        raise UsageError(f"{name} has no DeaMoE equivalent: {exc}") from None


def _build_layer(config: DeaMoEConfig, w: _Weights, dtype: torch.dtype | None, name: str) -> DeaMoELayer:
    dtype = w.gate_up.dtype if dtype is None else dtype
    if dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"{name}: cannot make a {dtype} layer; use float32, float16 or bfloat16")
    device = w.gate_up.device
    # The router keeps Hugging Face's precision: DeepSeek-V3 holds gate.weight in float32
    # even in bf16 models (spec, "Router precision"); the bias is float32 whatever it was.
    router_dtype = torch.float32 if w.router.dtype == torch.float32 else dtype
    layer = DeaMoELayer(config, dtype=dtype, device=device, router_dtype=router_dtype)
    with torch.no_grad():
        layer.router.weight.copy_(w.router)
        if layer.router.bias is not None:
            layer.router.bias.copy_(w.router_bias)
        layer.experts.gate_up.copy_(w.gate_up)
        layer.experts.down.copy_(w.down)
        if layer.shared_experts is not None:
            layer.shared_experts.gate_up.copy_(w.shared_gate_up)
            layer.shared_experts.down.copy_(w.shared_down)
            if layer.shared_experts.gate is not None:
                layer.shared_experts.gate.copy_(w.shared_gate)
    return layer.eval()


def _ranges(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)
