"""A small decoder-only language model whose FFNs are DeaMoE layers (the PyTorch reference).

Layout (Llama / Qwen3-MoE): token embedding; per block RMSNorm -> causal self-attention
with rotary embeddings, grouped-query heads and a KV cache -> residual -> RMSNorm ->
DeaMoE FFN (deamoe_trt.layer.DeaMoELayer) -> residual; final RMSNorm; untied LM head.

State-dict names follow Hugging Face's: embed_tokens.weight, layers.{i}.input_layernorm.weight,
layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.post_attention_layernorm.weight,
layers.{i}.mlp.<the spec's canonical DeaMoE tensors>, norm.weight, lm_head.weight.

The KV cache is a list of (key, value) per block, each [B, num_key_value_heads, P, head_dim]
with keys already rotated (a sliding block's only its newest LMConfig.cache_keep keys); a
forward over T new tokens at positions P..P+T-1 returns the cache extended to P+T (Hugging
Face's legacy past_key_values, and the ONNX export's past/present inputs and outputs). With
multi-head latent attention (DeepSeek, deamoe_trt.lm.mla) the pair is (c_kv [B, 1, P,
kv_lora_rank], rotated key part [B, 1, P, qk_rope_head_dim]): LMConfig.cache_shapes() says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..checkpoint import DTYPES
from ..errors import UsageError
from ..layer import SUPPORTED_DTYPES, DeaMoELayer
from ..quant import QuantConfig
from ..routing import Routing
from .attention import Attention, RMSNorm, apply_rope  # noqa: F401 - re-exported, their historical home
from .checkpoint_format import read_lm_header, read_lm_tensors, stored_state, write_lm
from .config import LMConfig
from .rope import rope_tables as _rope_tables
from .tokenizer import Tokenizer

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


def rope_tables(config: LMConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_position_embeddings, head_dim // 2] in float32 (Llama's non-interleaved rotary)."""
    return _rope_tables(
        config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings, device=device
    )


class DenseMLP(nn.Module):
    """The dense SwiGLU MLP of a model's non-MoE blocks (Hugging Face's gate_proj/up_proj/down_proj)."""

    def __init__(self, hidden: int, width: int, **factory):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False, **factory)
        self.up_proj = nn.Linear(hidden, width, bias=False, **factory)
        self.down_proj = nn.Linear(width, hidden, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LMConfig, layer: int = 0, **factory):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        if config.is_mla:
            from .mla import LatentAttention

            self.self_attn: nn.Module = LatentAttention(config, **factory)
        else:
            self.self_attn = Attention(config, layer, **factory)
        self.residual_multiplier = config.residual_multiplier
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        if config.is_dense(layer):
            self.mlp: nn.Module = DenseMLP(config.hidden_size, config.dense_intermediate_size, **factory)
        else:
            router = torch.float32 if config.float32_router else None
            self.mlp = DeaMoELayer(config.moe, quant=config.quantization, router_dtype=router, **factory)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, DeaMoELayer)

    def forward(self, x, cos, sin, past, ffn=None):
        """ffn: a callable [N, d] -> [N, d] run instead of this block's DeaMoE FFN (another
        runtime's kernel, e.g. deamoe_trt.cpu.CpuDeaMoE); its routing is not returned."""
        attn, present = self.self_attn(self.input_layernorm(x), cos, sin, past)
        h = x + self._scaled(attn)
        y = self.post_attention_layernorm(h).reshape(-1, h.shape[-1])
        if ffn is not None:
            return h + self._scaled(ffn(y).to(h.dtype).view_as(h)), present, None
        if not self.is_moe:
            return h + self._scaled(self.mlp(y).view_as(h)), present, None
        routing = self.mlp.route(y)
        ffn = self.mlp.forward_routed(y, routing).to(h.dtype).view_as(h)
        return h + self._scaled(ffn), present, routing

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        """A residual branch times Granite's residual_multiplier (1: as it is)."""
        return branch if self.residual_multiplier == 1 else branch * self.residual_multiplier


# A model and its two twins (DeaMoELM.expanded, DeaMoELM.vanilla), by name.
TWINS = ("deamoe", "expanded", "vanilla")


def check_twin(name: str) -> None:
    """A one-line UsageError unless name is one of TWINS."""
    if name not in TWINS:
        raise UsageError(f"unknown twin {name!r}; choose one of: {', '.join(TWINS)}")


@dataclass
class LMOutput:
    logits: torch.Tensor  # [B, T, vocab] float32
    past_key_values: KVCache  # extended by the T new tokens
    routings: list[Routing] = field(default_factory=list)  # one per DeaMoE block, tokens flattened [B*T]


class DeaMoELM(nn.Module):
    """The decoder-only DeaMoE language model; see the module docstring for its layout."""

    def __init__(self, config: LMConfig, *, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        if dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        factory = {"dtype": dtype, "device": device}
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(Block(config, i, **factory) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        if config.quantized_linears:
            from .qlinear import swap_in_quantized

            assert config.quantization is not None  # LMConfig checks
            swap_in_quantized(self, config.quantized_linears, config.quantization)
        if config.tie_word_embeddings:
            self.tie_weights()
        rope_device = None if device == "meta" else device
        cos, sin = rope_tables(config, device=rope_device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    # Construction ------------------------------------------------------------------------

    @classmethod
    def random(cls, config: LMConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32, device=None) -> DeaMoELM:
        """Random weights (reset_parameters); a quantized config gets the float model's weights
        quantized (round to nearest)."""
        if config.quantization is not None:
            float_config = config.replace(quantization=None, quantized_linears=())
            float_model = cls.random(float_config, seed=seed, dtype=dtype, device=device)
            return float_model.quantized(config.quantization, linears=config.quantized_linears)
        model = cls(config, dtype=torch.float32, device=device)
        model.reset_parameters(seed)
        for block in model.layers:
            if isinstance(block.mlp, DeaMoELayer) and not config.float32_router:
                block.mlp.router.cast_weight(dtype)  # a float32 router would otherwise stay float32
        return model.to(dtype)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Scaled normal init: unit-variance embeddings, fan-in scaled projections, and the
        residual branches' output projections scaled by 1/sqrt(2 * num_layers) (GPT-2)."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        c = self.config

        def normal_(param: torch.Tensor, std: float) -> None:
            param.copy_(torch.randn(param.shape, generator=gen) * std)

        residual = 1.0 / math.sqrt(2 * c.num_layers)
        normal_(self.embed_tokens.weight, 1.0)
        for i, block in enumerate(self.layers):
            for name, proj in block.self_attn.named_children():
                if isinstance(proj, nn.Linear):  # q/k/v (MLA: its down and up projections), o_proj
                    scale = residual if name == "o_proj" else 1.0
                    fan_in = proj.in_features if c.is_mla else c.hidden_size
                    normal_(proj.weight, scale / math.sqrt(fan_in))
            if block.is_moe:
                block.mlp.reset_parameters(seed * 1000 + i + 1)
                for part in (block.mlp.departments, block.mlp.experts, block.mlp.shared_experts):
                    if part is not None:
                        part.down.mul_(residual)
            else:
                normal_(block.mlp.gate_proj.weight, 1.0 / math.sqrt(c.hidden_size))
                normal_(block.mlp.up_proj.weight, 1.0 / math.sqrt(c.hidden_size))
                normal_(block.mlp.down_proj.weight, residual / math.sqrt(c.dense_intermediate_size))
            for name, param in block.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.startswith("self_attn.") and name.endswith(".bias"):
                    param.zero_()
                elif name == "self_attn.sinks":
                    normal_(param, 1.0)
        self.norm.weight.fill_(1.0)
        if not c.tie_word_embeddings:
            normal_(self.lm_head.weight, 1.0 / math.sqrt(c.hidden_size))

    def tie_weights(self) -> None:
        """With tie_word_embeddings the head is the embedding matrix: one Parameter, saved once."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def moe_layers(self) -> list[int]:
        """Indices of the blocks whose FFN is a DeaMoE layer."""
        return [i for i, block in enumerate(self.layers) if block.is_moe]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # Forward ------------------------------------------------------------------------------

    def forward(
        self, input_ids: torch.Tensor, past_key_values: KVCache | None = None, *, ffns: dict | None = None
    ) -> LMOutput:
        """Logits for input_ids [B, T] at positions P..P+T-1, P the cache's length (0 without one).

        ffns: {block index: callable [N, d] -> [N, d]} replacing those blocks' DeaMoE FFNs."""
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise UsageError(f"input_ids must have shape [batch, tokens >= 1], got {list(input_ids.shape)}")
        c = self.config
        past_len = cache_length(past_key_values, c)
        tokens = input_ids.shape[1]
        if past_len + tokens > c.max_position_embeddings:
            raise UsageError(
                f"{past_len} cached + {tokens} new tokens exceed the model's context of {c.max_position_embeddings}"
            )
        if past_key_values is not None and len(past_key_values) != c.num_layers:
            raise UsageError(f"the cache has {len(past_key_values)} layers, the model {c.num_layers}")
        cos = self.rope_cos[past_len : past_len + tokens]
        sin = self.rope_sin[past_len : past_len + tokens]
        x = self.embed_tokens(input_ids)
        if c.embedding_multiplier != 1:
            x = x * c.embedding_multiplier
        presents: KVCache = []
        routings: list[Routing] = []
        for i, block in enumerate(self.layers):
            past = None if past_key_values is None else past_key_values[i]
            x, present, routing = block(x, cos, sin, past, None if ffns is None else ffns.get(i))
            presents.append(present)
            if routing is not None:
                routings.append(routing)
        logits = self.lm_head(self.norm(x)).float()
        if c.logits_scaling != 1:
            logits = logits / c.logits_scaling
        return LMOutput(logits=logits, past_key_values=presents, routings=routings)

    def empty_cache(self, batch: int = 1) -> KVCache:
        """A cache of length 0 (what a prefill starts from; the ONNX graph takes it as input)."""
        c = self.config
        (kh, kw), (vh, vw) = c.cache_shapes()
        return [
            (
                torch.zeros((batch, kh, 0, kw), dtype=self.dtype, device=self.device),
                torch.zeros((batch, vh, 0, vw), dtype=self.dtype, device=self.device),
            )
            for _ in range(c.num_layers)
        ]

    # Twins ------------------------------------------------------------------------------------

    @torch.no_grad()
    def expanded(self) -> DeaMoELM:
        """Same model with every block's FFN replaced by DeaMoELayer.expanded(): identical
        outputs, no department sharing. Shares the non-FFN tensors with this model."""
        return self._twin(self.config.expanded(), {i: self.layers[i].mlp.expanded() for i in self.moe_layers()})

    @torch.no_grad()
    def vanilla(self) -> DeaMoELM:
        """Same model with one-stage top-k FFNs (DeaMoELayer.vanilla()): different routing, so
        different outputs. Shares the non-FFN tensors with this model."""
        return self._twin(self.config.vanilla(), {i: self.layers[i].mlp.vanilla() for i in self.moe_layers()})

    @torch.no_grad()
    def quantized(
        self, quant: QuantConfig, ffns: dict[int, DeaMoELayer] | None = None, *, linears: tuple[str, ...] = ()
    ) -> DeaMoELM:
        """Same model with every DeaMoE FFN quantized, and the projections of `linears`
        (deamoe_trt.lm.qlinear.LINEAR_PARTS) round to nearest with the same bits and group
        size; embeddings, norms, routers and the other projections shared with this model.

        ffns: {block: that block's FFN already quantized with quant} (a calibrated method's,
        e.g. deamoe_trt.quantize.awq.quantize_awq's); default: DeaMoELayer.quantized, round to nearest."""
        if self.config.quantization is not None:
            q = self.config.quantization
            raise UsageError(
                f"the model is already quantized (int{q.bits}, group size {q.group_size}); "
                "quantize the floating-point checkpoint instead"
            )
        # Checks every FFN width against the group size, and the parts.
        config = self.config.replace(quantization=quant, quantized_linears=tuple(linears))
        extra = {}
        if linears:
            from .qlinear import quantized_state

            extra = quantized_state(self, config.quantized_linears, quant)
        if ffns is None:
            ffns = {i: self.layers[i].mlp.quantized(quant) for i in self.moe_layers()}
        if sorted(ffns) != self.moe_layers() or any(ffn.quant != quant for ffn in ffns.values()):
            raise UsageError(f"ffns must hold blocks {self.moe_layers()}, each quantized as {quant}")
        return self._twin(config, ffns, extra)

    def twin(self, name: str) -> DeaMoELM:
        """'deamoe' (this model), 'expanded' or 'vanilla'."""
        check_twin(name)
        return self if name == "deamoe" else getattr(self, name)()

    def _twin(self, config: LMConfig, mlps: dict[int, DeaMoELayer], extra: dict | None = None) -> DeaMoELM:
        """A model of config sharing this one's tensors, with mlps as those blocks' FFNs and
        extra's state entries (quantized projections) in place of the float ones they name."""
        twin = DeaMoELM(config, dtype=self.dtype, device="meta")
        extra = extra or {}
        replaced = {k.rsplit(".weight.", 1)[0] + ".weight" for k in extra}
        state = {
            k: v
            for k, v in self.state_dict().items()
            if not any(k.startswith(f"layers.{i}.mlp.") for i in mlps) and k not in replaced
        }
        state.update(extra)
        for i, mlp in mlps.items():
            state.update({f"layers.{i}.mlp.{k}": v for k, v in mlp.state_dict().items()})
        twin.load_state_dict(state, assign=True)
        twin.tie_weights()
        twin.materialize_rope()
        return twin.train(self.training)

    def materialize_rope(self, device=None) -> DeaMoELM:
        """After load_state_dict(assign=True) into a meta model: compute the rotary tables
        (not saved, derived from the config) and move to device."""
        self.rope_cos, self.rope_sin = rope_tables(self.config, device=self.embed_tokens.weight.device)
        return self.to(device) if device is not None else self

    # Checkpoints ------------------------------------------------------------------------------

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        tokenizer: Tokenizer | None = None,
        training: dict[str, Any] | None = None,
    ) -> Path:
        """Write the checkpoint (deamoe_trt.lm.checkpoint_format); each file appears whole or not at all.
        tokenizer defaults to the byte tokenizer of the config's vocabulary."""
        return write_lm(self.state_dict(), self.config, self.dtype, directory, tokenizer=tokenizer, training=training)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device=None, header: dict[str, Any] | None = None) -> DeaMoELM:
        """Read a checkpoint written by save_pretrained, checking every tensor against its config.
        header: its config.json as read_lm_header returned it, when the caller has read it already."""
        if header is None:
            header = read_lm_header(directory)
        model = cls(header["config"], dtype=DTYPES[header["dtype"]], device="meta")
        model.load_state_dict(
            read_lm_tensors(directory, header, stored_state(model.state_dict(), model.config)), assign=True
        )
        model.tie_weights()
        return model.materialize_rope(device).eval()


def cache_length(cache: KVCache | None, config: LMConfig | None = None) -> int:
    """The position after the cache: the length of a block that keeps every key (config's
    position_layer; block 0 without a config)."""
    if not cache:
        return 0
    layer = 0 if config is None else config.position_layer() or 0
    return int(cache[layer][0].shape[2])
