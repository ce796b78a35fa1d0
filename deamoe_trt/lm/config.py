"""The decoder-only language model's configuration: attention sizes plus one DeaMoEConfig for every block."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, DeaMoEConfig, check_fields
from ..errors import UsageError
from ..quant import QuantConfig


@dataclass(frozen=True)
class LMConfig:
    """Sizes of a decoder-only DeaMoE language model (Llama/Qwen3-MoE layout).

    Every block is RMSNorm -> causal self-attention (rotary embeddings, grouped-query heads,
    KV cache) -> residual -> RMSNorm -> FFN -> residual; then a final RMSNorm and the LM head.
    The FFN is a DeaMoE layer (`moe`), or a dense SwiGLU MLP of width
    `dense_intermediate_size` in the blocks listed in `dense_layers`. `moe.hidden_size` must
    equal `hidden_size`.

    The fields after `rms_norm_eps` describe the attention variants of imported Hugging Face
    models; their defaults are the tiny sample's architecture, so older configs read unchanged:
    - head_dim: per-head width (0: hidden_size / num_heads; Qwen3 sets it explicitly);
    - qkv_bias / o_bias: biases on the q/k/v and output projections (Qwen2, Qwen3 attention_bias);
    - qk_norm: RMSNorm of queries and keys before the rotary embedding, "head" over each head
      (Qwen3) or "full" over the whole projection (OLMoE); "none" by default;
    - clip_qkv: clamp q, k and v to [-clip, clip] after the projections (OLMoE), 0: off;
    - rope_scaling: None, or {"rope_type": "linear" | "yarn", "factor": ..., ...} with the
      Hugging Face keys (see deamoe_trt.lm.rope);
    - sliding_window: keys at distance >= window are hidden (0: off), in the blocks listed in
      sliding_window_layers (None: every block);
    - tie_word_embeddings: the LM head is the embedding matrix (no lm_head.weight stored);
    - attention_sinks: every head has one learned sink logit (self_attn.sinks [num_heads], gpt-oss)
      that joins the softmax over the keys and takes probability mass but adds no value.
      Written to JSON only when set.

    The KV cache of a sliding-window block keeps only the window - 1 newest keys (all a later
    query can see) when some block attends to every key: that block's cache length is the
    position (see `cache_keep`). A model whose every block slides keeps full caches.

    Granite's scalings (1.0, or 0.0 for the attention scale, leave a block as Llama's):
    - embedding_multiplier: the token embeddings are multiplied by it;
    - residual_multiplier: each block adds attention and FFN outputs times it to the residual;
    - attention_multiplier: the softmax scale of q k^T (0: head_dim^-0.5; MLA models store
      theirs, (qk_nope_head_dim + qk_rope_head_dim)^-0.5 times YaRN's mscale^2);
    - logits_scaling: the logits are divided by it.

    Multi-head latent attention (DeepSeek-V2/V3, deamoe_trt.lm.mla) when kv_lora_rank > 0:
    q_lora_rank (0: one q_proj), qk_nope_head_dim, qk_rope_head_dim (the rotary part of
    every query and key head; head_dim equals it), v_head_dim; num_key_value_heads equals
    num_heads. The cache holds the compressed c_kv and the rotated key part per token.
    float32_router: every DeaMoE router weight stays float32 in a half-precision model, as
    transformers keeps DeepSeek's and ERNIE's gate.weight (the spec's "Router precision").
    These fields are written to JSON only when set.

    `quantization`: None, or how every DeaMoE FFN's weights are stored (deamoe_trt.quant,
    docs/quantization.md); attention, embeddings, norms, dense MLPs and routers stay in the
    model's dtype, except the parts listed in `quantized_linears` ("attention", "dense",
    "head"; deamoe_trt.lm.qlinear), whose projections are stored with the same bits and
    group size. Written to JSON only when set, so float configs read and write unchanged.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    moe: DeaMoEConfig
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    head_dim: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    clip_qkv: float = 0.0
    rope_scaling: dict[str, Any] | None = None
    sliding_window: int = 0
    sliding_window_layers: tuple[int, ...] | None = None
    dense_layers: tuple[int, ...] = ()
    dense_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    quantization: QuantConfig | None = None
    attention_sinks: bool = False
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 0.0
    logits_scaling: float = 1.0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    float32_router: bool = False
    quantized_linears: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):
            object.__setattr__(self, "moe", DeaMoEConfig.from_dict(self.moe))
        if isinstance(self.quantization, dict):
            try:
                object.__setattr__(self, "quantization", QuantConfig.from_dict(self.quantization))
            except UsageError as exc:
                raise ConfigError(str(exc)) from None
        for name in ("sliding_window_layers", "dense_layers", "quantized_linears"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        if _is_int(self.kv_lora_rank) and self.kv_lora_rank > 0 and self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.qk_rope_head_dim)  # MLA: the rotary heads' width
        _validate(self)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rms_norm_eps", float(self.rms_norm_eps))
        object.__setattr__(self, "clip_qkv", float(self.clip_qkv))
        for name in _SCALINGS:
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def is_mla(self) -> bool:
        """Whether the attention is multi-head latent attention (deamoe_trt.lm.mla)."""
        return self.kv_lora_rank > 0

    def cache_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(heads, width) of the two cache tensors of a block, [B, heads, P, width] each:
        key and value, or MLA's c_kv and rotated key part (one head each)."""
        if self.is_mla:
            return (1, self.kv_lora_rank), (1, self.qk_rope_head_dim)
        return (self.num_key_value_heads, self.head_dim), (self.num_key_value_heads, self.head_dim)

    def kv_cache_values_per_token(self) -> int:
        """Values the KV cache holds per token over all blocks."""
        return self.num_layers * sum(heads * width for heads, width in self.cache_shapes())

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    def is_dense(self, layer: int) -> bool:
        """Whether block `layer` has a dense MLP rather than a DeaMoE FFN."""
        return layer in self.dense_layers

    def window(self, layer: int) -> int:
        """The sliding window of block `layer` (0: full causal attention)."""
        if not self.sliding_window:
            return 0
        layers = self.sliding_window_layers
        return self.sliding_window if layers is None or layer in layers else 0

    def cache_keep(self, layer: int) -> int:
        """How many of its newest keys block `layer` keeps in its KV cache (0: all of them).

        A sliding block keeps window - 1: a later query at position p sees keys after p - window
        only. Only while some block keeps all its keys, whose cache length is the position."""
        window = self.window(layer)
        if window < 2 or self.position_layer() is None:
            return 0
        return window - 1

    def cached_keys(self, layer: int, length: int) -> int:
        """The cache length of block `layer` after `length` tokens."""
        keep = self.cache_keep(layer)
        return min(length, keep) if keep else length

    def position_layer(self) -> int | None:
        """The first block whose cache holds every key (its length is the position), if any."""
        return next((i for i in range(self.num_layers) if not self.window(i)), None)

    # Twins, as DeaMoEConfig.expanded()/vanilla() for the FFN of every block -----------------

    def expanded(self) -> LMConfig:
        return self.replace(moe=self.moe.expanded())

    def vanilla(self) -> LMConfig:
        return self.replace(moe=self.moe.vanilla())

    def replace(self, **changes: Any) -> LMConfig:
        return dataclasses.replace(self, **changes)

    # JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["moe"] = self.moe.to_dict()
        for name in ("sliding_window_layers", "dense_layers", "quantized_linears"):
            if data[name] is not None:
                data[name] = list(data[name])
        for f in dataclasses.fields(self):
            if f.name in _OPTIONAL_FIELDS and getattr(self, f.name) == f.default:
                del data[f.name]
        if self.quantization is None:
            del data["quantization"]
        else:
            data["quantization"] = self.quantization.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LMConfig:
        check_fields(cls, data, "LM config")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_file(cls, path: str | Path) -> LMConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None


def _validate(cfg: LMConfig) -> None:
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_key_value_heads",
        "max_position_embeddings",
    ):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(cfg.moe, DeaMoEConfig):
        raise ConfigError(f"moe must be a DeaMoEConfig or its JSON object, got {type(cfg.moe).__name__}")
    if cfg.moe.hidden_size != cfg.hidden_size:
        raise ConfigError(f"moe.hidden_size ({cfg.moe.hidden_size}) must equal hidden_size ({cfg.hidden_size})")
    if not _is_int(cfg.head_dim) or cfg.head_dim < 0:
        raise ConfigError(f"head_dim must be an integer >= 0 (0: hidden_size / num_heads), got {cfg.head_dim!r}")
    _validate_families(cfg)
    if cfg.head_dim == 0 and cfg.hidden_size % cfg.num_heads:
        raise ConfigError(f"hidden_size ({cfg.hidden_size}) must be a multiple of num_heads ({cfg.num_heads})")
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_heads
    if head_dim % 2:
        raise ConfigError(f"head_dim ({head_dim}) must be even for rotary embeddings")
    if cfg.num_heads % cfg.num_key_value_heads:
        raise ConfigError(
            f"num_heads ({cfg.num_heads}) must be a multiple of num_key_value_heads ({cfg.num_key_value_heads})"
        )
    for name in ("rope_theta", "rms_norm_eps"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    for name in ("qkv_bias", "o_bias", "tie_word_embeddings", "attention_sinks"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(cfg, name)!r}")
    if cfg.qk_norm not in QK_NORMS:
        raise ConfigError(f"qk_norm must be one of {', '.join(QK_NORMS)}, got {cfg.qk_norm!r}")
    if isinstance(cfg.clip_qkv, bool) or not isinstance(cfg.clip_qkv, (int, float)) or not cfg.clip_qkv >= 0:
        raise ConfigError(f"clip_qkv must be a number >= 0 (0: off), got {cfg.clip_qkv!r}")
    if not _is_int(cfg.sliding_window) or cfg.sliding_window < 0:
        raise ConfigError(f"sliding_window must be an integer >= 0 (0: off), got {cfg.sliding_window!r}")
    if not _is_int(cfg.dense_intermediate_size) or cfg.dense_intermediate_size < 0:
        raise ConfigError(f"dense_intermediate_size must be an integer >= 0, got {cfg.dense_intermediate_size!r}")
    for name in ("sliding_window_layers", "dense_layers"):
        layers = getattr(cfg, name)
        if layers is None and name == "sliding_window_layers":
            continue
        if not isinstance(layers, tuple) or not all(_is_int(i) and 0 <= i < cfg.num_layers for i in layers):
            raise ConfigError(f"{name} must list block indices 0..{cfg.num_layers - 1}, got {layers!r}")
    if cfg.dense_layers and cfg.dense_intermediate_size < 1:
        raise ConfigError("dense_layers needs dense_intermediate_size >= 1 (the dense MLP's width)")
    if cfg.rope_scaling is not None:
        from .rope import check_rope_scaling

        check_rope_scaling(cfg.rope_scaling)
    if cfg.quantization is not None:
        if not isinstance(cfg.quantization, QuantConfig):
            raise ConfigError(f"quantization must be a QuantConfig or its JSON object, got {cfg.quantization!r}")
        from ..layer import check_quantizable

        try:
            check_quantizable(cfg.moe, cfg.quantization)
        except UsageError as exc:
            raise ConfigError(str(exc)) from None
    if not isinstance(cfg.quantized_linears, tuple):
        raise ConfigError(f"quantized_linears must list parts of the model, got {cfg.quantized_linears!r}")
    if cfg.quantized_linears:
        from .qlinear import check_parts

        if cfg.quantization is None:
            raise ConfigError("quantized_linears needs quantization (its bits and group size)")
        try:
            check_parts(cfg.quantized_linears, cfg.tie_word_embeddings)
        except UsageError as exc:
            raise ConfigError(str(exc)) from None


QK_NORMS = ("none", "head", "full")
_SCALINGS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
_MLA_SIZES = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_OPTIONAL_FIELDS = ("attention_sinks", *_SCALINGS, *_MLA_SIZES, "float32_router", "quantized_linears")


def _validate_families(cfg: LMConfig) -> None:
    """The Granite scalings and the MLA sizes."""
    for name in _SCALINGS:
        value = getattr(cfg, name)
        low = 0 if name == "attention_multiplier" else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
        if value < 0 if low == 0 else value <= 0:
            raise ConfigError(f"{name} must be > 0{' (0: head_dim^-0.5)' if low == 0 else ''}, got {value!r}")
    if not isinstance(cfg.float32_router, bool):
        raise ConfigError(f"float32_router must be true or false, got {cfg.float32_router!r}")
    for name in _MLA_SIZES:
        if not _is_int(getattr(cfg, name)) or getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be an integer >= 0, got {getattr(cfg, name)!r}")
    if not cfg.kv_lora_rank:
        others = [name for name in _MLA_SIZES[1:] if getattr(cfg, name)]
        if others:
            raise ConfigError(f"{others[0]} is set but kv_lora_rank is 0 (MLA needs kv_lora_rank >= 1)")
        return
    for name in ("qk_rope_head_dim", "v_head_dim"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"multi-head latent attention needs {name} >= 1")
    if cfg.qk_rope_head_dim % 2:
        raise ConfigError(f"qk_rope_head_dim ({cfg.qk_rope_head_dim}) must be even for rotary embeddings")
    if cfg.head_dim != cfg.qk_rope_head_dim:
        raise ConfigError(f"with MLA head_dim ({cfg.head_dim}) must equal qk_rope_head_dim ({cfg.qk_rope_head_dim})")
    if cfg.num_key_value_heads != cfg.num_heads:
        raise ConfigError(
            f"with MLA num_key_value_heads ({cfg.num_key_value_heads}) must equal num_heads ({cfg.num_heads})"
        )
    for name in ("qkv_bias", "o_bias", "clip_qkv", "sliding_window"):
        if getattr(cfg, name):
            raise ConfigError(f"{name} is not supported with multi-head latent attention")
    if cfg.qk_norm != "none":
        raise ConfigError("qk_norm is not supported with multi-head latent attention")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
