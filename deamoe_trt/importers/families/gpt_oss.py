"""gpt-oss (GptOssForCausalLM) as a deamoe-trt language model: the mapping the whole-model
importer (deamoe_trt.importers.hf_lm) uses for model_type "gpt_oss".

What is carried over exactly, as transformers' gpt_oss modeling computes it:
- attention: q/k/v/o biases, one sink logit per head (`self_attn.sinks`), the layer_types'
  alternating sliding-window (`sliding_attention`) and full blocks, YaRN rotary;
- each MoE block as one department (D = 1, f_s = 0): the router's bias as
  `router.logit_bias` (it moves both the choice and the weights); softmax over the top-k
  logits, which is softmax over all experts with norm_topk_prob; the experts' gate/up and
  down biases; the clamped SwiGLU with swiglu_alpha and swiglu_limit;
- the experts' layout: transformers keeps gate_up_proj as [E, d, 2f] with gate and up in
  alternating columns (gate_up[..., ::2] gate, [..., 1::2] up) and down_proj as [E, f, d];
  the canonical experts.gate_up is [E, 2f, d] with the f gate rows first, down [E, d, f];
- MXFP4 experts (quantization_config quant_method "mxfp4": `*_blocks` and `*_scales`)
  decoded to their exact values (deamoe_trt.importers.mxfp4), in the checkpoint's
  [E, rows, cols] orientation (gate_up's rows interleaved like the columns above).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from ...config import ConfigError, top_k_moe
from ...errors import UsageError
from ...lm.config import LMConfig
from ..derived import Derived, Source
from ..mxfp4 import BLOCK, decode_mxfp4
from .common import HFConfig, lm_fields, rope_from_hf

MODEL_TYPE = "gpt_oss"
DEFAULT_THETA = 150000.0  # transformers' GptOssConfig.default_theta
LAYER_TYPES = ("sliding_attention", "full_attention")


def check_quantization(hf: dict[str, Any], model_dir: str | Path) -> None:
    """MXFP4 experts are read exactly; every other quantized format is refused."""
    quantization = hf.get("quantization_config")
    if not quantization:
        return
    method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
    if method != "mxfp4":
        raise UsageError(
            f"{model_dir} holds quantized weights (quant_method {method!r}); deamoe-trt reads gpt-oss in "
            "bfloat16/float32 or with MXFP4 experts only: dequantize them first"
        )


def is_mxfp4(hf: dict[str, Any]) -> bool:
    quantization = hf.get("quantization_config")
    return isinstance(quantization, dict) and quantization.get("quant_method") == "mxfp4"


def lm_config(hf: dict[str, Any], where: str = "config.json") -> LMConfig:
    """The LMConfig of a gpt-oss config.json (a dict), or a one-line UsageError."""
    cfg = HFConfig(hf, where, "gpt-oss")
    get, need = cfg.get, cfg.need
    layers = cfg.int("num_hidden_layers")
    hidden = cfg.int("hidden_size")
    theta, scaling = rope_from_hf(hf, DEFAULT_THETA, where)
    types = get("layer_types", [LAYER_TYPES[(i + 1) % 2] for i in range(layers)])  # transformers' default
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown or len(types) != layers:
        raise UsageError(
            f"{where}: layer_types must list {layers} of {', '.join(LAYER_TYPES)}"
            + (f", got {unknown[0]!r}" if unknown else f", got {len(types)} entries")
        )
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    window = int(get("sliding_window", 0)) if sliding else 0
    if sliding and window < 1:
        raise UsageError(f"{where}: sliding_attention layers need sliding_window >= 1, got {window}")
    try:
        moe = top_k_moe(
            hidden_size=hidden,
            num_experts=int(need("num_local_experts")),
            intermediate_size=int(need("intermediate_size")),
            top_k=int(need("num_experts_per_tok")),
            norm_topk_prob=True,  # softmax over the top-k logits
            ffn_bias=True,
            activation="swiglu_clamped",
            swiglu_alpha=float(get("swiglu_alpha", 1.702)),
            swiglu_limit=float(get("swiglu_limit", 7.0)),
            router_logit_bias=True,
        )
        attention_bias = bool(get("attention_bias", True))
        return LMConfig(
            **lm_fields(cfg, rms_norm_eps=1e-5),
            moe=moe,
            rope_theta=theta,
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            rope_scaling=scaling,
            sliding_window=window,
            sliding_window_layers=sliding if window else None,
            attention_sinks=True,
        )
    except (ConfigError, TypeError, ValueError) as exc:
        raise UsageError(f"{where} has no deamoe-trt equivalent: {exc}") from None


def moe_sources(config: LMConfig, index: dict, prefix: str) -> dict[str, Any]:
    """Our names under layers.{i}. -> recipes for one MoE block whose tensors are under prefix
    (e.g. "model.layers.3.mlp.")."""
    n, f, d = config.moe.num_experts, config.moe.private_intermediate_size, config.hidden_size
    experts = prefix + "experts."
    out: dict[str, Any] = {
        "mlp.router.weight": prefix + "router.weight",
        "mlp.router.logit_bias": prefix + "router.bias",
        "mlp.experts.gate_up_bias": Derived((Source(experts + "gate_up_proj_bias", (n, 2 * f)),), _split_bias),
        "mlp.experts.down_bias": experts + "down_proj_bias",
    }
    if experts + "gate_up_proj_blocks" in index:
        out["mlp.experts.gate_up"] = _mxfp4(experts + "gate_up_proj", (n, 2 * f, d), _interleaved_rows)
        out["mlp.experts.down"] = _mxfp4(experts + "down_proj", (n, d, f), _rows)
    else:
        out["mlp.experts.gate_up"] = Derived((Source(experts + "gate_up_proj", (n, d, 2 * f)),), _gate_up)
        out["mlp.experts.down"] = Derived((Source(experts + "down_proj", (n, f, d)),), _down)
    return out


def _split_bias(bias: torch.Tensor):
    yield torch.cat((bias[:, 0::2], bias[:, 1::2]), dim=1)  # [E, 2f]: gate entries, then up


def _gate_up(weight: torch.Tensor):  # [E, d, 2f], x @ W with interleaved columns
    for w in weight:
        yield torch.cat((w[:, 0::2], w[:, 1::2]), dim=1).T  # [2f, d]


def _down(weight: torch.Tensor):  # [E, f, d], h @ W
    for w in weight:
        yield w.T  # [d, f]


def _interleaved_rows(w: torch.Tensor) -> torch.Tensor:  # one expert's [2f, d], gate and up rows alternating
    return torch.cat((w[0::2], w[1::2]), dim=0)


def _rows(w: torch.Tensor) -> torch.Tensor:
    return w


def _mxfp4(name: str, shape: tuple[int, int, int], arrange) -> Derived:
    """An expert stack stored as MXFP4 (shape [E, rows, cols], cols a multiple of 32), decoded
    one expert at a time in float32 (exact) and then arranged."""
    e, rows, cols = shape
    if cols % BLOCK:
        raise UsageError(f"{name}: MXFP4 needs a multiple of {BLOCK} columns, config.json implies {cols}")
    groups = cols // BLOCK
    blocks = Source(name + "_blocks", (e, rows, groups, BLOCK // 2), ("U8",))
    scales = Source(name + "_scales", (e, rows, groups), ("U8",))

    def make(b: torch.Tensor, s: torch.Tensor):
        for expert in range(e):
            yield arrange(decode_mxfp4(b[expert], s[expert], torch.float32, name=name))

    return Derived((blocks, scales), make)


# One MoE block from a loaded transformers model (import-hf --layers-only) ---------------------


def layer_from_hf(module: torch.nn.Module, *, dtype: torch.dtype | None = None):
    """A DeaMoELayer (D = 1, f_s = 0) with the same outputs as a transformers GptOssMLP whose
    float weights are loaded. dtype: default the experts'; a float32 router stays float32."""
    from ...layer import SUPPORTED_DTYPES, DeaMoELayer

    router, experts = module.router, module.experts
    name = type(module).__name__
    gate_up = cast(torch.Tensor, experts.gate_up_proj)  # a Parameter, typed Tensor | Module by nn.Module
    if not gate_up.is_floating_point():
        raise UsageError(f"{name} holds packed MXFP4 experts; import the whole model (import-hf without --layers-only)")
    n, d = cast(torch.Tensor, router.weight).shape
    try:
        config = top_k_moe(
            hidden_size=d,
            num_experts=n,
            intermediate_size=experts.intermediate_size,
            top_k=router.top_k,
            norm_topk_prob=True,
            ffn_bias=True,
            activation="swiglu_clamped",
            swiglu_alpha=float(experts.alpha),
            swiglu_limit=float(experts.limit),
            router_logit_bias=True,
        )
    except ConfigError as exc:
        raise UsageError(f"{name} has no DeaMoE equivalent: {exc}") from None
    dtype = gate_up.dtype if dtype is None else dtype
    if dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"{name}: cannot make a {dtype} layer; use float32, float16 or bfloat16")
    router_dtype = torch.float32 if router.weight.dtype == torch.float32 else dtype
    layer = DeaMoELayer(config, dtype=dtype, device=gate_up.device, router_dtype=router_dtype)
    with torch.no_grad():
        layer.router.weight.copy_(router.weight)
        layer.router.logit_bias.copy_(router.bias)
        layer.experts.gate_up.copy_(torch.stack(list(_gate_up(gate_up))))
        layer.experts.down.copy_(experts.down_proj.transpose(1, 2))
        layer.experts.gate_up_bias.copy_(next(_split_bias(experts.gate_up_proj_bias)))
        layer.experts.down_bias.copy_(experts.down_proj_bias)
    return layer.eval()
