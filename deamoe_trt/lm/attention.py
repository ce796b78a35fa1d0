"""Causal self-attention of the language model: grouped-query heads, rotary embeddings, a KV
cache, and the variants of imported Hugging Face models (q/k/v and output biases, q/k
RMSNorm per head or over the whole projection, q/k/v clipping, sliding window, attention
sinks).

The order of operations is Hugging Face's: project (+ bias) -> [full q/k norm] -> [clip] -> [per-head
q/k norm] -> rotate
-> append to the cache -> softmax(q k^T * head_dim^-0.5 + mask) v -> output projection.

With sinks (gpt-oss) each head's softmax also covers one more logit, the head's sink, whose
probability is dropped: p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink)). A sliding block's
cache keeps only the keys a later query can see (LMConfig.cache_keep).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import LMConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, **factory):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd] rotated by position: halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def hidden_keys(tokens: int, past_len: int, window: int, device=None) -> torch.Tensor:
    """[T, P + T] bool, True where query i (at position P + i) may not see key j: keys after
    it, and with a sliding window keys at distance >= window (Hugging Face's
    `kv_idx > q_idx - window` keeps the rest)."""
    key_pos = torch.arange(past_len + tokens, device=device)
    query_pos = torch.arange(tokens, device=device)[:, None] + past_len
    hidden = key_pos > query_pos
    if window:
        hidden |= key_pos <= query_pos - window
    return hidden


def softmax_scale(scores: torch.Tensor, config: LMConfig) -> torch.Tensor:
    """q k^T times the config's attention_multiplier, or divided by sqrt(head_dim) without one."""
    if config.attention_multiplier:
        return scores * config.attention_multiplier
    return scores / math.sqrt(config.head_dim)


class Attention(nn.Module):
    def __init__(self, config: LMConfig, layer: int = 0, **factory):
        super().__init__()
        self.config = config
        self.window = config.window(layer)
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(d, config.q_dim, bias=config.qkv_bias, **factory)
        self.k_proj = nn.Linear(d, config.kv_dim, bias=config.qkv_bias, **factory)
        self.v_proj = nn.Linear(d, config.kv_dim, bias=config.qkv_bias, **factory)
        self.o_proj = nn.Linear(config.q_dim, d, bias=config.o_bias, **factory)
        if config.qk_norm != "none":
            per_head = config.qk_norm == "head"
            self.q_norm = RMSNorm(hd if per_head else config.q_dim, config.rms_norm_eps, **factory)
            self.k_norm = RMSNorm(hd if per_head else config.kv_dim, config.rms_norm_eps, **factory)
        self.keep = config.cache_keep(layer)
        if config.attention_sinks:
            self.sinks = nn.Parameter(torch.zeros(config.num_heads, **factory))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        batch, tokens, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if c.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if c.clip_qkv:  # after the full-width norms, as OLMoE
            q, k, v = (t.clamp(-c.clip_qkv, c.clip_qkv) for t in (q, k, v))
        q = q.view(batch, tokens, c.num_heads, c.head_dim)
        k = k.view(batch, tokens, c.num_key_value_heads, c.head_dim)
        if c.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(batch, tokens, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v) if not self.keep else (k[:, :, -self.keep :].contiguous(), v[:, :, -self.keep :].contiguous())
        groups = c.num_heads // c.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        # The mask depends on distances only, so the kept keys' count stands in for the position.
        past_len = k.shape[2] - tokens
        scores = softmax_scale(q.float() @ k.float().transpose(-1, -2), c)
        scores = scores.masked_fill(hidden_keys(tokens, past_len, self.window, x.device), -torch.inf)
        if c.attention_sinks:
            sink = self.sinks.float().view(1, -1, 1, 1).expand(batch, -1, tokens, 1)
            probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out = (probs @ v.float()).to(x.dtype)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1)), present
