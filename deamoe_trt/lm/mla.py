"""Multi-head latent attention (MLA: DeepSeek-V2/V3) with a latent KV cache.

Per token, a block projects x to a compressed latent c_kv = RMSNorm(x W_dkv) of kv_lora_rank
values and one rotary key k_pe of qk_rope_head_dim values shared by all heads
(kv_a_proj_with_mqa); queries come from q_proj, or through a low-rank q_a_proj -> RMSNorm ->
q_b_proj (q_lora_rank), split per head into a nope part (qk_nope_head_dim) and a rope part.
kv_b_proj [H * (nope + v), kv_lora_rank] expands c_kv to each head's nope key and value.

The cache holds what DeepSeek's inference caches, c_kv [B, 1, P, kv_lora_rank] and the
rotated k_pe [B, 1, P, qk_rope_head_dim] (576 values per token and block at V2-Lite/V3
shapes), not the expanded keys and values (H * (nope + rope + v) values: 40960 for V3).

Attention reads the cache without expanding it, the up-projections absorbed ("weight
absorption", DeepSeek-V2 paper, section 2.1.2):
    score_h(t, s) = (q_nope_h W_uk_h) . c_kv(s) + q_pe_h . k_pe(s)       (W_uk_h: [nope, r])
    out_h(t)      = (sum_s p_h(t, s) c_kv(s)) W_uv_h^T                   (W_uv_h: [v, r])
so a decode step reads each cached token's kv_lora_rank + qk_rope_head_dim values once for
all heads, and kv_b_proj once, instead of H expanded keys and values per token. The same
form runs prefill (one code path; docs/design.md says why).

State-dict names are transformers': self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj},
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from ..quant import QuantizedWeight, dense
from .attention import RMSNorm, apply_rope, hidden_keys, softmax_scale
from .config import LMConfig

# transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm default, not rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    def __init__(self, config: LMConfig, **factory):
        super().__init__()
        c = self.config = config
        d, heads = config.hidden_size, config.num_heads
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank:
            self.q_a_proj = nn.Linear(d, c.q_lora_rank, bias=False, **factory)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, LATENT_NORM_EPS, **factory)
            self.q_b_proj = nn.Linear(c.q_lora_rank, heads * qk, bias=False, **factory)
        else:
            self.q_proj = nn.Linear(d, heads * qk, bias=False, **factory)
        self.kv_a_proj_with_mqa = nn.Linear(d, c.kv_lora_rank + c.qk_rope_head_dim, bias=False, **factory)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, LATENT_NORM_EPS, **factory)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False, **factory)
        self.o_proj = nn.Linear(heads * c.v_head_dim, d, bias=False, **factory)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.q_lora_rank:
            return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return self.q_proj(x)

    def up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_uk [H, nope, r] and W_uv [H, v, r]: kv_b_proj's rows per head."""
        c = self.config
        w = dense(self.kv_b_proj.weight).view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        return w[:, : c.qk_nope_head_dim], w[:, c.qk_nope_head_dim :]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        c = self.config
        batch, tokens, _ = x.shape
        q = self.queries(x).view(batch, tokens, c.num_heads, -1).transpose(1, 2)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent).view(batch, 1, tokens, c.kv_lora_rank)
        k_pe = k_pe.reshape(batch, 1, tokens, c.qk_rope_head_dim)
        q_pe, k_pe = apply_rope(q_pe, cos, sin), apply_rope(k_pe, cos, sin)
        if past is not None:
            latent = torch.cat((past[0], latent), dim=2)
            k_pe = torch.cat((past[1], k_pe), dim=2)
        w_uk, w_uv = (w.float() for w in self.up_projections())
        q_latent = q_nope.float() @ w_uk  # [B, H, T, r]
        cache = latent.float()
        scores = q_latent @ cache.transpose(-1, -2) + q_pe.float() @ k_pe.float().transpose(-1, -2)
        scores = softmax_scale(scores, c)
        scores = scores.masked_fill(hidden_keys(tokens, cache.shape[2] - tokens, 0, x.device), -torch.inf)
        out = (torch.softmax(scores, dim=-1) @ cache) @ w_uv.transpose(-1, -2)  # [B, H, T, v]
        out = out.to(x.dtype).transpose(1, 2).reshape(batch, tokens, -1)
        return self.o_proj(out), (latent, k_pe)


def emit_latent_attention(b, block: LatentAttention, h: str, prefix: str, graph) -> str:
    """The block's attention in the ONNX graph of deamoe_trt.export.lm (standard ops, the
    same absorbed form as forward): h [N, d] -> [N, d]; extends the block's cache inputs
    graph.past (c_kv, k_pe) into the outputs named graph.present.

    graph carries the export's helpers: linear(x, weight name), rope(x [B, H, T, hd]),
    heads(x, shape) ([N, H*w] -> [B, H, T, w]), bt (Shape of input_ids), mask ([T, S] bool,
    True where hidden), act (the activation type), f32(x) and w(weight name) (a stored weight; a
    quantized projection dequantized, as the [in, out] weight a MatMul reads)."""
    from onnx import TensorProto

    c = block.config
    heads, nope, rope, r = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
    att = prefix + "self_attn."

    def norm(x: str, weight: str) -> str:  # RMSNorm with the latents' eps
        xf = graph.f32(x)
        mean = b.reduce("ReduceMean", b.op("Mul", [xf, xf]), [-1], keepdims=True)
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean, b.scalar(LATENT_NORM_EPS)])])])
        y = b.op("Mul", [b.op("Mul", [xf, inv]), graph.f32(graph.w(weight))])
        return b.cast(y, graph.act) if graph.act != TensorProto.FLOAT else y

    def shape(*tail: int) -> str:
        return b.op("Concat", [graph.bt, b.i64(*tail)], axis=0)

    if c.q_lora_rank:
        q = graph.linear(
            norm(graph.linear(h, att + "q_a_proj.weight"), att + "q_a_layernorm.weight"), att + "q_b_proj.weight"
        )
    else:
        q = graph.linear(h, att + "q_proj.weight")
    q_nope, q_pe = b.op("Split", [graph.heads(q, shape(heads, nope + rope)), b.i64(nope, rope)], outputs=2, axis=-1)
    latent, k_pe = b.op(
        "Split", [graph.linear(h, att + "kv_a_proj_with_mqa.weight"), b.i64(r, rope)], outputs=2, axis=-1
    )
    latent = graph.heads(norm(latent, att + "kv_a_layernorm.weight"), shape(1, r))  # [B, 1, T, r]
    q_pe, k_pe = graph.rope(q_pe), graph.rope(graph.heads(k_pe, shape(1, rope)))
    latent_all = b.op("Concat", [graph.past[0], latent], axis=2, outputs=[graph.present[0]])[0]
    k_pe_all = b.op("Concat", [graph.past[1], k_pe], axis=2, outputs=[graph.present[1]])[0]
    if isinstance(block.kv_b_proj.weight, QuantizedWeight):  # its codes stay packed: split after dequantizing
        kv_b = b.reshape(graph.w(att + "kv_b_proj.weight"), [r, heads, nope + c.v_head_dim])  # [in, out] weight
        uk = b.op("Transpose", [b.slice(kv_b, 2, 0, nope)], perm=[1, 2, 0])  # [H, nope, r]
        uv = b.op("Transpose", [b.slice(kv_b, 2, nope, nope + c.v_head_dim)], perm=[1, 0, 2])  # [H, r, v]
    else:
        w_uk, w_uv = block.up_projections()
        uk = b.weight(att + "kv_b_proj.absorbed_k", w_uk.contiguous())  # [H, nope, r]
        uv = b.weight(att + "kv_b_proj.absorbed_v", w_uv.transpose(1, 2).contiguous())  # [H, r, v]
    cache = graph.f32(latent_all)
    q_latent = b.op("MatMul", [graph.f32(q_nope), graph.f32(uk)])  # [B, H, T, r]
    scores = b.op(
        "Add",
        [
            b.op("MatMul", [q_latent, b.op("Transpose", [cache], perm=[0, 1, 3, 2])]),
            b.op("MatMul", [graph.f32(q_pe), b.op("Transpose", [graph.f32(k_pe_all)], perm=[0, 1, 3, 2])]),
        ],
    )
    scores = b.op("Mul", [scores, b.scalar(c.attention_multiplier)])
    probs = b.op("Softmax", [b.op("Where", [graph.mask, b.scalar(float("-inf")), scores])], axis=-1)
    out = b.op("MatMul", [b.op("MatMul", [probs, cache]), graph.f32(uv)])  # [B, H, T, v]
    out = b.reshape(b.op("Transpose", [out], perm=[0, 2, 1, 3]), [-1, heads * c.v_head_dim])
    out = b.cast(out, graph.act) if graph.act != TensorProto.FLOAT else out
    return graph.linear(out, att + "o_proj.weight")
