"""A small decoder-only language model whose FFNs are DeaMoE layers (the PyTorch reference).

Layout (Llama / Qwen3-MoE): token embedding; per block RMSNorm -> causal self-attention
with rotary embeddings, grouped-query heads and a KV cache -> residual -> RMSNorm ->
DeaMoE FFN (deamoe_trt.layer.DeaMoELayer) -> residual; final RMSNorm; untied LM head.

State-dict names follow Hugging Face's: embed_tokens.weight, layers.{i}.input_layernorm.weight,
layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.post_attention_layernorm.weight,
layers.{i}.mlp.<the spec's canonical DeaMoE tensors>, norm.weight, lm_head.weight.

The KV cache is a list of (key, value) per block, each [B, num_key_value_heads, P, head_dim]
with keys already rotated; a forward over T new tokens at positions P..P+T-1 returns the
cache extended to P+T (Hugging Face's legacy past_key_values, and the ONNX export's
past/present inputs and outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError
from ..layer import SUPPORTED_DTYPES, DeaMoELayer
from ..routing import Routing
from .config import LMConfig

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, **factory):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(config: LMConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_position_embeddings, head_dim // 2] in float32 (Llama's non-interleaved rotary)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64, device=device) / half))
    angles = torch.arange(config.max_position_embeddings, dtype=torch.float64, device=device)[:, None] * inv_freq
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd] rotated by position: halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LMConfig, **factory):
        super().__init__()
        self.config = config
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=False, **factory)
        self.k_proj = nn.Linear(d, config.kv_dim, bias=False, **factory)
        self.v_proj = nn.Linear(d, config.kv_dim, bias=False, **factory)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=False, **factory)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)
        groups = c.num_heads // c.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        # Query i sits at absolute position P + i and sees keys 0..P + i.
        past_len = k.shape[2] - tokens
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(c.head_dim)
        key_pos = torch.arange(k.shape[2], device=x.device)
        query_pos = torch.arange(tokens, device=x.device)[:, None] + past_len
        scores = scores.masked_fill(key_pos > query_pos, -torch.inf)
        out = (torch.softmax(scores, dim=-1) @ v.float()).to(x.dtype)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1)), present


class Block(nn.Module):
    def __init__(self, config: LMConfig, **factory):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.self_attn = Attention(config, **factory)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.mlp = DeaMoELayer(config.moe, **factory)

    def forward(self, x, cos, sin, past):
        attn, present = self.self_attn(self.input_layernorm(x), cos, sin, past)
        h = x + attn
        y = self.post_attention_layernorm(h).reshape(-1, h.shape[-1])
        routing = self.mlp.route(y)
        ffn = self.mlp.forward_routed(y, routing).to(h.dtype).view_as(h)
        return h + ffn, present, routing


@dataclass
class LMOutput:
    logits: torch.Tensor  # [B, T, vocab] float32
    past_key_values: KVCache  # extended by the T new tokens
    routings: list[Routing] = field(default_factory=list)  # one per block, tokens flattened [B*T]


class DeaMoELM(nn.Module):
    """The decoder-only DeaMoE language model; see the module docstring for its layout."""

    def __init__(self, config: LMConfig, *, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        if dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        factory = {"dtype": dtype, "device": device}
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(Block(config, **factory) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        rope_device = None if device == "meta" else device
        cos, sin = rope_tables(config, device=rope_device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    # Construction ------------------------------------------------------------------------

    @classmethod
    def random(cls, config: LMConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32, device=None) -> DeaMoELM:
        model = cls(config, dtype=torch.float32, device=device)
        model.reset_parameters(seed)
        for block in model.layers:
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
            for proj in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
                normal_(proj.weight, 1.0 / math.sqrt(c.hidden_size))
            normal_(block.self_attn.o_proj.weight, residual / math.sqrt(c.hidden_size))
            block.mlp.reset_parameters(seed * 1000 + i + 1)
            for part in (block.mlp.departments, block.mlp.experts, block.mlp.shared_experts):
                if part is not None:
                    part.down.mul_(residual)
            block.input_layernorm.weight.fill_(1.0)
            block.post_attention_layernorm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        normal_(self.lm_head.weight, 1.0 / math.sqrt(c.hidden_size))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    # Forward ------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, past_key_values: KVCache | None = None) -> LMOutput:
        """Logits for input_ids [B, T] at positions P..P+T-1, P the cache's length (0 without one)."""
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise UsageError(f"input_ids must have shape [batch, tokens >= 1], got {list(input_ids.shape)}")
        c = self.config
        past_len = cache_length(past_key_values)
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
        presents: KVCache = []
        routings: list[Routing] = []
        for i, block in enumerate(self.layers):
            x, present, routing = block(x, cos, sin, None if past_key_values is None else past_key_values[i])
            presents.append(present)
            routings.append(routing)
        logits = self.lm_head(self.norm(x)).float()
        return LMOutput(logits=logits, past_key_values=presents, routings=routings)

    def empty_cache(self, batch: int = 1) -> KVCache:
        """A cache of length 0 (what a prefill starts from; the ONNX graph takes it as input)."""
        c = self.config
        shape = (batch, c.num_key_value_heads, 0, c.head_dim)
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(c.num_layers)
        ]

    # Twins ------------------------------------------------------------------------------------

    @torch.no_grad()
    def expanded(self) -> DeaMoELM:
        """Same model with every block's FFN replaced by DeaMoELayer.expanded(): identical
        outputs, no department sharing. Shares the non-FFN tensors with this model."""
        return self._twin(self.config.expanded(), [block.mlp.expanded() for block in self.layers])

    @torch.no_grad()
    def vanilla(self) -> DeaMoELM:
        """Same model with one-stage top-k FFNs (DeaMoELayer.vanilla()): different routing, so
        different outputs. Shares the non-FFN tensors with this model."""
        return self._twin(self.config.vanilla(), [block.mlp.vanilla() for block in self.layers])

    def twin(self, name: str) -> DeaMoELM:
        """'deamoe' (this model), 'expanded' or 'vanilla'."""
        if name == "deamoe":
            return self
        if name in ("expanded", "vanilla"):
            return getattr(self, name)()
        raise UsageError(f"unknown twin {name!r}; choose deamoe, expanded or vanilla")

    def _twin(self, config: LMConfig, mlps: list[DeaMoELayer]) -> DeaMoELM:
        twin = DeaMoELM(config, dtype=self.dtype, device="meta")
        state = {k: v for k, v in self.state_dict().items() if ".mlp." not in k}
        for i, mlp in enumerate(mlps):
            state.update({f"layers.{i}.mlp.{k}": v for k, v in mlp.state_dict().items()})
        twin.load_state_dict(state, assign=True)
        twin.materialize_rope()
        return twin.train(self.training)

    def materialize_rope(self, device=None) -> DeaMoELM:
        """After load_state_dict(assign=True) into a meta model: compute the rotary tables
        (not saved, derived from the config) and move to device."""
        self.rope_cos, self.rope_sin = rope_tables(self.config, device=self.embed_tokens.weight.device)
        return self.to(device) if device is not None else self

    # Checkpoints ------------------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path, **kwargs) -> Path:
        from .checkpoint import save_lm

        return save_lm(self, directory, **kwargs)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device=None) -> DeaMoELM:
        from .checkpoint import load_lm

        return load_lm(directory, device=device).model


def cache_length(cache: KVCache | None) -> int:
    return 0 if not cache else int(cache[0][0].shape[2])
