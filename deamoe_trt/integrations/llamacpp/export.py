"""A one-stage (vanilla) language model as a GGUF file that llama.cpp runs as `qwen3moe`.

What llama.cpp is measured on in `bench-lm --llama-bench`: the vanilla twin of the DeaMoE
model, i.e. the same attention and the same experts with top-k routing over all of them,
which is exactly Qwen3-MoE's block (per-head q/k RMSNorm, non-interleaved "NeoX" rotary,
softmax router, top-k weights renormalised, SwiGLU experts). The tensor names, the
metadata keys and the `qwen3moe` architecture come from the `gguf` package's constants,
the ones llama.cpp's own converter writes; weights are written as F16, the 1-D norms and
the router as F32 (as the converter keeps them), so llama-quantize can turn the file
into Q8_0 or Q4_0.

The vocabulary is deamoe-trt's byte tokenizer spelled as a GPT-2 byte-level BPE without
merges: id b < 256 is byte b, each in GPT-2's printable spelling of a byte, so llama.cpp
tokenizes a text into exactly the ids ByteTokenizer gives; ids from 256 up are unused
padding up to the model's vocabulary. No BOS is added.

Models that Qwen3-MoE's block cannot express (DeaMoE routing, latent attention, biases,
sliding windows, dense blocks, ...) are refused with every reason on one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..._io import atomic_path
from ...errors import UsageError
from ...lm.config import LMConfig
from ...lm.model import DeaMoELM

ARCHITECTURE = "qwen3moe"
BYTE_TOKENS = 256
# tokenizer.ggml.merges must exist for a BPE vocabulary; one pair of strings that are no
# single character (the symbols a merge can join) never applies.
_NO_MERGE = "<no-merges> <no-merges>"


def unsupported(config: LMConfig) -> list[str]:
    """Why a model of config cannot be written as qwen3moe; empty when it can."""
    c, m = config, config.moe
    checks = [
        (c.is_mla, "multi-head latent attention"),
        (c.qk_norm != "head", f"q/k norm {c.qk_norm!r} (qwen3moe has per-head q/k RMSNorm)"),
        (c.qkv_bias or c.o_bias, "attention biases"),
        (bool(c.clip_qkv), "q/k/v clipping"),
        (bool(c.sliding_window), "a sliding window"),
        (c.attention_sinks, "attention sinks"),
        (
            c.rope_scaling is not None and c.rope_scaling.get("rope_type", c.rope_scaling.get("type")) != "default",
            "scaled rotary embeddings",
        ),
        (bool(c.dense_layers), "dense blocks"),
        (
            c.embedding_multiplier != 1 or c.residual_multiplier != 1 or c.logits_scaling != 1,
            "embedding, residual or logit multipliers",
        ),
        (
            bool(c.attention_multiplier) and abs(c.attention_multiplier * c.head_dim**0.5 - 1) > 1e-6,
            "an attention multiplier other than head_dim^-0.5",
        ),
        (c.quantization is not None, "quantized FFNs (write the floating-point model; llama-quantize quantizes)"),
        (
            m.num_departments != 1 or m.shared_intermediate_size != 0,
            "DeaMoE departments (write the vanilla twin: model.vanilla())",
        ),
        (m.score_func != "softmax", f"router score {m.score_func!r} (qwen3moe: softmax)"),
        (not m.norm_topk_prob, "top-k weights not renormalised"),
        (m.routed_scaling_factor != 1, "a routed scaling factor"),
        (m.router_bias or m.router_logit_bias, "router biases"),
        (m.has_shared_experts, "shared experts"),
        (m.ffn_bias, "expert biases"),
        (m.activation != "swiglu", f"activation {m.activation!r}"),
        (c.vocab_size < BYTE_TOKENS, f"a vocabulary of {c.vocab_size} < 256 (the byte tokenizer's)"),
    ]
    return [why for failed, why in checks if failed]


def check_writable_as_gguf(config: LMConfig) -> None:
    reasons = unsupported(config)
    if reasons:
        raise UsageError(f"this model cannot be written as GGUF {ARCHITECTURE}: it has {'; '.join(reasons)}")


def byte_token_texts(vocab_size: int) -> list[str]:
    """Token texts: GPT-2's printable spelling of bytes 0..255, then [PAD<id>] padding."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelled = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(BYTE_TOKENS):
        if b not in spelled:  # control bytes, space, DEL, ...: moved past 255, in byte order
            spelled[b] = chr(BYTE_TOKENS + shifted)
            shifted += 1
    return [spelled[b] for b in range(BYTE_TOKENS)] + [f"[PAD{i}]" for i in range(BYTE_TOKENS, vocab_size)]


def _f16(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float16).contiguous().numpy()


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


def write_gguf(model: DeaMoELM, path: str | Path, *, name: str = "deamoe-trt vanilla twin") -> Path:
    """Write model (one-stage, see `unsupported`) as an F16 GGUF at path (whole or not at all)."""
    import gguf

    check_writable_as_gguf(model.config)
    c, m = model.config, model.config.moe
    path = Path(path)
    names = gguf.TENSOR_NAMES
    T = gguf.MODEL_TENSOR

    def tensor_name(kind, block: int | None = None) -> str:
        return names[kind].format(bid=block) + ".weight"

    with atomic_path(path) as tmp, torch.no_grad():
        writer = gguf.GGUFWriter(tmp, ARCHITECTURE)
        writer.add_name(name)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_context_length(c.max_position_embeddings)
        writer.add_embedding_length(c.hidden_size)
        writer.add_block_count(c.num_layers)
        writer.add_feed_forward_length(m.expert_intermediate_size)
        writer.add_head_count(c.num_heads)
        writer.add_head_count_kv(c.num_key_value_heads)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_rope_freq_base(float(c.rope_theta))
        writer.add_layer_norm_rms_eps(float(c.rms_norm_eps))
        writer.add_expert_count(m.num_experts)
        writer.add_expert_used_count(m.top_k)
        writer.add_expert_feed_forward_length(m.expert_intermediate_size)

        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(byte_token_texts(c.vocab_size))
        types = [gguf.TokenType.NORMAL] * BYTE_TOKENS + [gguf.TokenType.UNUSED] * (c.vocab_size - BYTE_TOKENS)
        writer.add_token_types(types)
        writer.add_token_merges([_NO_MERGE])
        writer.add_bos_token_id(0)  # NUL: outside every alphabet, and never added
        writer.add_eos_token_id(0)
        writer.add_add_bos_token(False)
        writer.add_add_eos_token(False)

        writer.add_tensor(tensor_name(T.TOKEN_EMBD), _f16(model.embed_tokens.weight))
        for i, block in enumerate(model.layers):
            attn, mlp = block.self_attn, block.mlp
            writer.add_tensor(tensor_name(T.ATTN_NORM, i), _f32(block.input_layernorm.weight))
            writer.add_tensor(tensor_name(T.ATTN_Q, i), _f16(attn.q_proj.weight))
            writer.add_tensor(tensor_name(T.ATTN_K, i), _f16(attn.k_proj.weight))
            writer.add_tensor(tensor_name(T.ATTN_V, i), _f16(attn.v_proj.weight))
            writer.add_tensor(tensor_name(T.ATTN_OUT, i), _f16(attn.o_proj.weight))
            writer.add_tensor(tensor_name(T.ATTN_Q_NORM, i), _f32(attn.q_norm.weight))
            writer.add_tensor(tensor_name(T.ATTN_K_NORM, i), _f32(attn.k_norm.weight))
            writer.add_tensor(tensor_name(T.FFN_NORM, i), _f32(block.post_attention_layernorm.weight))
            writer.add_tensor(tensor_name(T.FFN_GATE_INP, i), _f32(mlp.router.weight))
            # gate_up [N, 2f, d] holds the gate rows, then the up rows; ggml's [d, f, N] is
            # numpy's [N, f, d], so each half goes as it is.
            gate, up = mlp.experts.gate_up.chunk(2, dim=1)
            writer.add_tensor(tensor_name(T.FFN_GATE_EXP, i), _f16(gate))
            writer.add_tensor(tensor_name(T.FFN_UP_EXP, i), _f16(up))
            writer.add_tensor(tensor_name(T.FFN_DOWN_EXP, i), _f16(mlp.experts.down))
        writer.add_tensor(tensor_name(T.OUTPUT_NORM), _f32(model.norm.weight))
        if not c.tie_word_embeddings:  # a tied head: llama.cpp reuses token_embd
            writer.add_tensor(tensor_name(T.OUTPUT), _f16(model.lm_head.weight))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path
