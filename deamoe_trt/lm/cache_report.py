"""What a language model's attention reads per decode step: its KV cache per token, and for
multi-head latent attention what caching expanded keys and values would hold instead."""

from __future__ import annotations

from ..console import format_bytes, format_table
from .config import LMConfig


def expanded_values_per_token(config: LMConfig) -> int:
    """Per token, all blocks: the keys and values attention multiplies with, [H, qk] and [H, v]
    for MLA (what a cache of expanded keys and values holds), or the standard cache itself."""
    if not config.is_mla:
        return config.kv_cache_values_per_token()
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    return config.num_layers * config.num_heads * (qk + config.v_head_dim)


def cache_table(config: LMConfig, bytes_per_value: int, contexts: tuple[int, ...] = (1024, 4096)) -> str:
    """Values and bytes per token, and the bytes one decode step reads from the cache at each
    context length (batch 1): every cached value once."""
    per_token = config.kv_cache_values_per_token()
    rows = []
    if config.is_mla:
        kind = f"latent (c_kv {config.kv_lora_rank} + rotary key {config.qk_rope_head_dim} per block)"
    else:
        kind = f"keys and values ({config.num_key_value_heads} heads x {config.head_dim} each per block)"
    rows.append(("cached", kind, per_token, format_bytes(per_token * bytes_per_value)))
    for n in contexts:
        rows.append((f"read per step at {n} tokens", "", per_token * n, format_bytes(per_token * n * bytes_per_value)))
    if config.is_mla:
        expanded = expanded_values_per_token(config)
        rows.append(
            (
                "expanded K/V instead",
                "what MLA without a latent cache holds",
                expanded,
                format_bytes(expanded * bytes_per_value),
            )
        )
    return format_table(
        ("KV cache", "holds", "values/token", "bytes/token"),
        rows,
        title=f"KV cache ({config.num_layers} blocks, {bytes_per_value} bytes per value)",
        align="llrr",
    )
