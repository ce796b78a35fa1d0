"""The whole language model as one ONNX graph with its KV cache as inputs and outputs.

One graph serves prefill and decode (Hugging Face Optimum's "merged decoder" I/O, without
its If node): the past length P and the new-token count T are both dynamic, P may be 0.

    inputs   input_ids                   int64 [batch, tokens]
             past_key_values.{i}.key     dtype [batch, kv_heads, past, head_dim]   i = 0..L-1
             past_key_values.{i}.value   dtype [batch, kv_heads, past, head_dim]
    outputs  logits                      float32 [batch, tokens, vocab]
             present.{i}.key             dtype [batch, kv_heads, past + tokens, head_dim]
             present.{i}.value           dtype [batch, kv_heads, past + tokens, head_dim]

With multi-head latent attention (DeepSeek) the ".key" and ".value" tensors are the latent
cache, c_kv [batch, 1, past, kv_lora_rank] and the rotated key part [batch, 1, past,
qk_rope_head_dim] (LMConfig.cache_shapes(); deamoe_trt.lm.mla).

Prefill feeds the prompt with past = 0 (empty tensors); each decode step feeds one token
and the previous step's present.* as past_key_values.*. Keys in the cache are already
rotated. Positions are past .. past + tokens - 1; everything is left-aligned (no padding).
A sliding block whose cache keeps only its window (LMConfig.cache_keep) has present of
min(past + tokens, keep) keys; the position is then the past length of the first block that
keeps every key (LMConfig.position_layer).

Why one graph rather than a prefill graph and a decode graph: the weights are stored and
loaded once (two graphs would carry them twice, or need shared external data that
TensorRT engines cannot share anyway), one TensorRT engine holds both shapes as two
optimisation profiles, and the cache flows between the two phases without conversion.
What two graphs would buy (a static decode shape for CUDA graphs) TensorRT gets from a
decode profile whose T is fixed to 1.

Each block's FFN is written by deamoe_trt.export.emit_layer in the chosen form (plugin,
ort or onnx), its weights under "layers.{i}.mlp.<canonical name>"; every other weight keeps
its checkpoint name. Attention, RMSNorm and rotary embeddings are standard ONNX ops in every
form (GQA by broadcasting MatMul over a kv-head axis, no repeated K/V).

Projections stored quantized (LMConfig.quantized_linears: attention, dense MLPs, head) stay
packed: "<name>.qweight" holds their codes transposed to the [in, out] weight a MatMul reads
(uint4/uint8, two int4 codes a byte), "<name>.scales" their scales [in / group, out], and a
blocked DequantizeLinear along the input axis (onnx_form.dequantized: opset 21) feeds the
MatMul, in every form. In that layout ONNX Runtime fuses the pair into its MatMulNBits, which
reads the packed codes, rather than dequantizing every weight on every run (what it does for
weights kept [out, in] before a Gemm). The plugin form, for TensorRT, whose DequantizeLinear
takes no zero point, stores signed int4/int8 codes q - 2^(bits-1) instead
(onnx_form.tensor_codes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import onnx
import torch
from onnx import TensorProto

from .. import __version__
from ..errors import UsageError
from ..lm.config import LMConfig
from ..lm.mla import emit_latent_attention
from ..lm.model import DeaMoELM
from ..lm.tokenizer import HFTokenizer, Tokenizer, default_tokenizer, tokenizer_from_dict
from ..quant import unpack
from . import EXTERNAL_DATA_THRESHOLD, ExternalData, GraphBuilder, emit_layer, get_dtype, save_model_streamed
from .layer_graph import check_form
from .onnx_form import code_type, dequantized, export_opset, tensor_codes
from .routing_graph import to_float32

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64

FORMAT = "deamoe-trt-lm-onnx"
FORMAT_VERSION = "1"
PREFIX = "deamoe_trt."
INPUT_IDS = "input_ids"
LOGITS = "logits"


def past_names(i: int) -> tuple[str, str]:
    return f"past_key_values.{i}.key", f"past_key_values.{i}.value"


def present_names(i: int) -> tuple[str, str]:
    return f"present.{i}.key", f"present.{i}.value"


@dataclass(frozen=True)
class LMExportInfo:
    """What an exported language model says about itself (metadata_props under deamoe_trt.)."""

    form: str
    dtype: str
    config: LMConfig
    tokenizer: Tokenizer
    twin: str = "deamoe"

    def to_metadata(self) -> dict[str, str]:
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "module": "lm",
            "form": self.form,
            "dtype": self.dtype,
            "twin": self.twin,
            "lm_config": json.dumps(self.config.to_dict(), sort_keys=True),
            "tokenizer": json.dumps(self.tokenizer.to_dict(), sort_keys=True),
        }
        return {PREFIX + k: v for k, v in meta.items()}


def lm_export_info(model: onnx.ModelProto, where: str = "the model", directory: Path | None = None) -> LMExportInfo:
    """The export's metadata; directory: where its tokenizer files are (a Hugging Face tokenizer)."""
    meta = {p.key[len(PREFIX) :]: p.value for p in model.metadata_props if p.key.startswith(PREFIX)}
    if meta.get("format") != FORMAT:
        raise UsageError(
            f"{where} is not a deamoe-trt language-model export (made with `deamoe-trt export` of a language model)"
            + (f"; its deamoe_trt.format is {meta['format']!r}" if "format" in meta else "")
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise UsageError(f"{where} has format_version {meta.get('format_version')!r}; this deamoe-trt reads 1")
    try:
        return LMExportInfo(
            form=meta["form"],
            dtype=meta["dtype"],
            config=LMConfig.from_dict(json.loads(meta["lm_config"])),
            tokenizer=tokenizer_from_dict(json.loads(meta["tokenizer"]), directory),
            twin=meta.get("twin", "deamoe"),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise UsageError(f"{where} has damaged deamoe_trt metadata ({type(exc).__name__}: {exc})") from None


def stored_scales(scales: torch.Tensor) -> torch.Tensor:
    """A quantized projection's scales [out, in / group] as the export stores them, [in / group, out]
    (the layout its MatMul reads; see the module docstring)."""
    return scales.t()


def build_lm_model(
    model: DeaMoELM,
    form: str = "ort",
    dtype: str = "fp32",
    opset: int | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    twin: str = "deamoe",
    external: ExternalData | None = None,
) -> onnx.ModelProto:
    """model as one ONNX graph with KV-cache inputs and outputs (see the module docstring).

    external: where the weights go as they are made (export_lm), rather than into the graph."""
    if not isinstance(model, DeaMoELM):
        raise UsageError(f"build_lm_model needs a DeaMoELM, got {type(model).__name__}")
    check_form(form)
    export_dtype = get_dtype(dtype, form)
    c = model.config
    opset = export_opset(form, opset, c.quantization, quantized_linears=bool(c.quantized_linears))
    b = GraphBuilder(opset, export_dtype, external=external)
    act = export_dtype.onnx
    hd, half, kvh, groups = c.head_dim, c.head_dim // 2, c.num_key_value_heads, c.num_heads // c.num_key_value_heads

    ids = b.add_input(INPUT_IDS, ["batch", "tokens"], I64)
    pasts = []
    cache_shapes = c.cache_shapes()
    for i in range(c.num_layers):
        pasts.append(
            tuple(
                b.add_input(n, ["batch", cache_heads, "past", width])
                for n, (cache_heads, width) in zip(past_names(i), cache_shapes, strict=True)
            )
        )
    state = model.state_dict()

    stored: dict[str, str] = {}

    # TensorRT's DequantizeLinear takes no zero point: the plugin form stores signed codes.
    signed = form == "plugin"

    def dequantized_weight(name: str) -> str:
        """A quantized projection [out, in] (LMConfig.quantized_linears) as the [in, out] weight
        its MatMul reads: codes and scales transposed, the codes packed again, dequantized along
        the input axis as the onnx form dequantizes a quantized FFN weight."""
        assert c.quantization is not None
        bits = c.quantization.bits
        codes = unpack(state[f"{name}.qweight"], bits).t()  # [in, out]
        packed = tensor_codes(codes, bits, signed)
        quantized = {
            f"{name}.qweight": b.add_initializer(f"{name}.qweight", packed, code_type(bits, signed), list(codes.shape)),
            f"{name}.scales": b.weight(f"{name}.scales", stored_scales(state[f"{name}.scales"])),
        }
        return dequantized(b, quantized, c.quantization, signed=signed, axis=0)[name]

    def w(name: str) -> str:  # each weight stored once (a tied head reuses the embedding)
        if name not in stored:
            stored[name] = dequantized_weight(name) if f"{name}.qweight" in state else b.weight(name, state[name])
        return stored[name]

    # Shapes and positions: P from the first cache input that keeps every key, B and T from input_ids.
    bt = b.op("Shape", [ids])  # [B, T]
    past_len = b.op("Gather", [b.op("Shape", [pasts[c.position_layer() or 0][0]]), b.i64(2)])  # [1]
    tokens = b.op("Gather", [bt, b.i64(1)])  # [1]
    total = b.op("Add", [past_len, tokens])  # [1]
    positions = b.op("Range", [b.squeeze(past_len, [0]), b.squeeze(total, [0]), b.const(1, I64, shape=())])  # [T]
    cos_table, sin_table = model.rope_cos, model.rope_sin
    cos = b.op("Gather", [b.weight("rope.cos", cos_table, "fp32"), positions], axis=0)  # [T, half] float32
    sin = b.op("Gather", [b.weight("rope.sin", sin_table, "fp32"), positions], axis=0)
    # Causal mask over [T, P + T]: key j is hidden from query i when j > P + i, and with a
    # sliding window W also when j <= P + i - W (see deamoe_trt.lm.attention.hidden_keys).
    key_pos = b.op("Range", [b.const(0, I64, shape=()), b.squeeze(total, [0]), b.const(1, I64, shape=())])
    query_pos = b.unsqueeze(positions, [1])  # [T, 1]
    hidden_mask = b.op("Greater", [key_pos, query_pos])  # [T, S] bool
    window_masks = {0: hidden_mask}
    for window in sorted({c.window(i) for i in range(c.num_layers)} - {0}):
        keys, hidden = key_pos, hidden_mask
        first = next(i for i in range(c.num_layers) if c.window(i) == window)
        if c.cache_keep(first):  # its keys are the kept past's and the new ones: positions total - S .. total - 1
            kept = b.op("Gather", [b.op("Shape", [pasts[first][0]]), b.i64(2)])
            start = b.squeeze(b.op("Sub", [past_len, kept]), [0])
            keys = b.op("Range", [start, b.squeeze(total, [0]), b.const(1, I64, shape=())])
            hidden = b.op("Greater", [keys, query_pos])
        too_far = b.op("LessOrEqual", [keys, b.op("Sub", [query_pos, b.const(window, I64, shape=())])])
        window_masks[window] = b.op("Or", [hidden, too_far])
    neg_inf = b.scalar(-math.inf)
    q_shape = b.op("Concat", [bt, b.i64(c.num_heads, hd)], axis=0)  # [B, T, H, hd]
    kv_shape = b.op("Concat", [bt, b.i64(kvh, hd)], axis=0)
    scale = b.scalar(c.attention_multiplier or 1.0 / math.sqrt(hd))

    def rms_norm(x: str, weight: str) -> str:  # over the last axis
        xf = to_float32(b, x)
        mean = b.reduce("ReduceMean", b.op("Mul", [xf, xf]), [-1], keepdims=True)
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean, b.scalar(c.rms_norm_eps)])])])
        y = b.op("Mul", [b.op("Mul", [xf, inv]), to_float32(b, w(weight))])
        return b.cast(y, act) if act != F32 else y

    def linear(x: str, weight: str) -> str:
        bias = weight.removesuffix(".weight") + ".bias"
        if f"{weight}.qweight" in state:  # [in, out] (dequantized_weight)
            y = b.op("MatMul", [x, w(weight)])
            return b.op("Add", [y, w(bias)]) if bias in state else y
        return b.op("Gemm", [x, w(weight)] + ([w(bias)] if bias in state else []), transB=1)

    def heads(x: str, shape: str) -> str:  # [N, H*hd] -> [B, H, T, hd]
        return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    def rope(x: str) -> str:  # [B, H, T, hd], halves rotated in float32
        x1, x2 = b.op("Split", [to_float32(b, x), b.i64(half, half)], outputs=2, axis=-1)
        r1 = b.op("Sub", [b.op("Mul", [x1, cos]), b.op("Mul", [x2, sin])])
        r2 = b.op("Add", [b.op("Mul", [x2, cos]), b.op("Mul", [x1, sin])])
        out = b.op("Concat", [r1, r2], axis=-1)
        return b.cast(out, act) if act != F32 else out

    if c.clip_qkv:
        clip_low = b.weight("clip_qkv.min", torch.tensor(-c.clip_qkv))
        clip_high = b.weight("clip_qkv.max", torch.tensor(c.clip_qkv))

    def clip(x: str) -> str:
        return b.op("Clip", [x, clip_low, clip_high]) if c.clip_qkv else x

    def sink_softmax(scores: str, name: str) -> str:
        # softmax over the keys and the head's sink logit, the sink's share dropped:
        # exp(s - m) / (sum exp(s - m) + exp(sink - m)), m the larger of both maxima.
        sink = b.reshape(to_float32(b, w(name)), [1, kvh, groups, 1, 1])
        top = b.op("Max", [b.reduce("ReduceMax", scores, [-1], keepdims=True), sink])
        e = b.op("Exp", [b.op("Sub", [scores, top])])
        denom = b.op("Add", [b.reduce("ReduceSum", e, [-1], keepdims=True), b.op("Exp", [b.op("Sub", [sink, top])])])
        return b.op("Div", [e, denom])

    def dense_mlp(x: str, p: str) -> str:  # SwiGLU with Hugging Face's gate_proj/up_proj/down_proj
        gate = linear(x, p + "mlp.gate_proj.weight")
        hidden = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), linear(x, p + "mlp.up_proj.weight")])
        return linear(hidden, p + "mlp.down_proj.weight")

    x = b.reshape(b.op("Gather", [w("embed_tokens.weight"), ids], axis=0), [-1, c.hidden_size])  # [N, d]
    if c.embedding_multiplier != 1:
        x = b.op("Mul", [x, b.scalar(c.embedding_multiplier, act)])

    def residual(branch: str) -> str:  # Granite's residual_multiplier
        return branch if c.residual_multiplier == 1 else b.op("Mul", [branch, b.scalar(c.residual_multiplier, act)])

    for i, block in enumerate(model.layers):
        p = f"layers.{i}."
        if c.is_mla:  # DeepSeek's latent attention (deamoe_trt.lm.mla); the FFN as below
            helpers = SimpleNamespace(
                linear=linear,
                rope=rope,
                heads=heads,
                bt=bt,
                mask=window_masks[0],
                act=act,
                w=w,
                f32=lambda t: to_float32(b, t),
                past=pasts[i],
                present=present_names(i),
            )
            with b.scope(p):
                h = rms_norm(x, p + "input_layernorm.weight")
                x = b.op("Add", [x, residual(emit_latent_attention(b, block.self_attn, h, p, helpers))])
                h = rms_norm(x, p + "post_attention_layernorm.weight")
                y = None if block.is_moe else dense_mlp(h, p)
            if block.is_moe:
                y = emit_layer(b, h, block.mlp, form, prefix=p + "mlp.")
            with b.scope(p):
                x = b.op("Add", [x, residual(y)], name="ffn_residual")
            continue
        with b.scope(p):
            h = rms_norm(x, p + "input_layernorm.weight")
            q = linear(h, p + "self_attn.q_proj.weight")
            k = linear(h, p + "self_attn.k_proj.weight")
            v = clip(linear(h, p + "self_attn.v_proj.weight"))
            if c.qk_norm == "full":
                q, k = rms_norm(q, p + "self_attn.q_norm.weight"), rms_norm(k, p + "self_attn.k_norm.weight")
            q, k = clip(q), clip(k)
            q, k, v = heads(q, q_shape), heads(k, kv_shape), heads(v, kv_shape)
            if c.qk_norm == "head":
                q, k = rms_norm(q, p + "self_attn.q_norm.weight"), rms_norm(k, p + "self_attn.k_norm.weight")
            q, k = rope(q), rope(k)
            keep = c.cache_keep(i)
            if keep:  # attend over past + new, keep the newest `keep` keys
                k_all, v_all = b.op("Concat", [pasts[i][0], k], axis=2), b.op("Concat", [pasts[i][1], v], axis=2)
                for name, kv in zip(present_names(i), (k_all, v_all), strict=True):
                    b.op("Slice", [kv, b.i64(-keep), b.i64(2**62), b.i64(2)], outputs=[name])
            else:
                k_all = b.op("Concat", [pasts[i][0], k], axis=2, outputs=[present_names(i)[0]])[0]
                v_all = b.op("Concat", [pasts[i][1], v], axis=2, outputs=[present_names(i)[1]])[0]
            # Grouped-query attention: q [B, kvh, g, T, hd] against k, v [B, kvh, 1, S, hd].
            q5 = b.op("Reshape", [q, b.i64(0, kvh, groups, -1, hd)])
            k5, v5 = b.unsqueeze(to_float32(b, k_all), [2]), b.unsqueeze(to_float32(b, v_all), [2])
            scores = b.op(
                "Mul", [b.op("MatMul", [to_float32(b, q5), b.op("Transpose", [k5], perm=[0, 1, 2, 4, 3])]), scale]
            )
            scores = b.op("Where", [window_masks[c.window(i)], neg_inf, scores])
            if c.attention_sinks:
                probs = sink_softmax(scores, p + "self_attn.sinks")
            else:
                probs = b.op("Softmax", [scores], axis=-1)
            ctx = b.op("MatMul", [probs, v5])  # [B, kvh, g, T, hd] float32
            ctx = b.op("Reshape", [ctx, b.i64(0, c.num_heads, -1, hd)])  # [B, H, T, hd]
            ctx = b.reshape(b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), [-1, c.num_heads * hd])
            ctx = b.cast(ctx, act) if act != F32 else ctx
            x = b.op("Add", [x, residual(linear(ctx, p + "self_attn.o_proj.weight"))], name="attn_residual")
            h = rms_norm(x, p + "post_attention_layernorm.weight")
            if not block.is_moe:
                y = dense_mlp(h, p)
        if block.is_moe:
            y = emit_layer(b, h, block.mlp, form, prefix=p + "mlp.")
        with b.scope(p):
            x = b.op("Add", [x, residual(y)], name="ffn_residual")
    head = "embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    logits = linear(rms_norm(x, "norm.weight"), head)  # [N, V]
    logits = b.op("Reshape", [to_float32(b, logits), b.op("Concat", [bt, b.i64(c.vocab_size)], axis=0)])
    if c.logits_scaling != 1:
        logits = b.op("Div", [logits, b.scalar(c.logits_scaling)])
    b.add_output(logits, ["batch", "tokens", c.vocab_size], F32, name=LOGITS)
    for i in range(c.num_layers):
        for name, (cache_heads, width) in zip(present_names(i), cache_shapes, strict=True):
            b.add_output(name, ["batch", cache_heads, "kept" if c.cache_keep(i) else "total", width])

    info = LMExportInfo(
        form=form,
        dtype=export_dtype.name,
        config=c,
        tokenizer=tokenizer or default_tokenizer(c.vocab_size),
        twin=twin,
    )
    doc = (
        f"DeaMoE language model ({c.num_layers} blocks, d={c.hidden_size}) with KV cache, FFNs in the {form} "
        f"form, {export_dtype.name}; deamoe-trt {__version__}"
    )
    return b.build(f"deamoe_lm_{form}", metadata=info.to_metadata(), doc=doc)


def export_lm(
    model: DeaMoELM,
    path: str | Path,
    form: str = "ort",
    dtype: str = "fp32",
    opset: int | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    twin: str = "deamoe",
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> Path:
    """build_lm_model(...) written to path (atomically; weights to path.data past 2 GB), the
    files save_model writes; each weight goes to the data file as it is made, so the graph
    never holds them all (save_model_streamed)."""

    def build(external: ExternalData) -> onnx.ModelProto:
        return build_lm_model(model, form, dtype, opset, tokenizer=tokenizer, twin=twin, external=external)

    saved = save_model_streamed(build, path, external_data_threshold=external_data_threshold)
    if isinstance(tokenizer, HFTokenizer):  # its files travel beside the model
        tokenizer.save(Path(saved).parent)
    return saved
