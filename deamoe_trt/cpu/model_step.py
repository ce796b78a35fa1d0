"""A whole language model's decode step in native code (deamoe_cpu_model.h): embedding,
attention, DeaMoE FFNs on the kernel, head, with no Python between the layers.

    from deamoe_trt.cpu.model_step import NativeDecoder
    decoder = NativeDecoder(model)     # packs every weight once
    logits = decoder.prefill(ids)      # then decoder.step(token), as any Decoder

Several sequences decode together through dm_lm_forward_batch (runtimes.cpu_kernel's
NativeBatchDecoder): one C call steps them all, every weight read once for the batch, each
token attending over its own sequence's cache at its own position.

Weights outside the FFNs are held in the model's dtype when it is float32 or float16
(a bfloat16 model's in float32, exactly; its FFNs in float16, as the kernel runs them);
projections quantized in the checkpoint (`quantized_linears`: attention, dense MLPs, head)
are held in int8/int4 and read as they are (the codes turned into floats in registers).
Activations, the KV cache and every sum are float32.

Multi-head latent attention (DeepSeek's MLA) is not in the native step: `unsupported(config)`
says so, and such models decode on the PyTorch path.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from ..errors import DeaMoEError, UsageError
from ..lm.config import LMConfig
from ..lm.model import DeaMoELM, check_twin
from ..quant import unpack
from .layer import SCALE_DTYPES, CpuDeaMoE, _LayerDesc, _round_up
from .runtime import _Buffer, pool

_QK_NORMS = {"none": 0, "head": 1, "full": 2}


class _Linear(ctypes.Structure):
    """Mirror of `struct dm_lm_linear` in deamoe_cpu_model.h."""

    _fields_ = [
        ("w", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("rows", ctypes.c_int64),
        ("cols_p", ctypes.c_int64),
        ("bits", ctypes.c_int32),
        ("group_size", ctypes.c_int32),
        ("scale_dtype", ctypes.c_int32),
    ]


class _Block(ctypes.Structure):
    """Mirror of `struct dm_lm_block`."""

    _fields_ = [
        ("input_norm", ctypes.c_void_p),
        ("post_norm", ctypes.c_void_p),
        ("q", _Linear),
        ("k", _Linear),
        ("v", _Linear),
        ("o", _Linear),
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("window", ctypes.c_int64),
        ("ffn", ctypes.c_void_p),
        ("dense", ctypes.c_int32),
    ]


class _Model(ctypes.Structure):
    """Mirror of `struct dm_lm`."""

    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("qk_norm", ctypes.c_int32),
        *((name, ctypes.c_int64) for name in ("vocab", "d", "dp", "layers", "heads", "kv_heads", "head_dim")),
        ("max_context", ctypes.c_int64),
        *(
            (name, ctypes.c_float)
            for name in (
                "eps",
                "clip_qkv",
                "attention_scale",
                "embedding_multiplier",
                "residual_multiplier",
                "logits_scaling",
            )
        ),
        ("embed", ctypes.c_void_p),
        ("final_norm", ctypes.c_void_p),
        ("head", _Linear),
        ("rope_cos", ctypes.c_void_p),
        ("rope_sin", ctypes.c_void_p),
        ("blocks", ctypes.c_void_p),
    ]


def unsupported(config: LMConfig) -> str | None:
    """Why the native step cannot run a model of config (one line), or None when it can."""
    if config.is_mla:
        return "the native CPU step does not run multi-head latent attention (MLA) models; they decode on PyTorch"
    return None


class NativeModel:
    """A DeaMoELM's weights packed once for the native step; sessions (`NativeDecoder`) share them."""

    def __init__(self, model: DeaMoELM, *, threads: int | None = None, twin: str = "deamoe"):
        """twin: whose FFNs run on model's attention: "deamoe" (model's own), "expanded" or
        "vanilla" (DeaMoELayer's twins, each made and packed one block at a time)."""
        check_twin(twin)
        c = model.config
        reason = unsupported(c)
        if reason:
            raise UsageError(reason)
        if model.device.type != "cpu":
            raise UsageError("the native CPU step needs the model's weights on the CPU")
        self.config = c
        self.pool = pool(threads)
        self.lib = self.pool.lib
        self.dtype = torch.float16 if model.dtype == torch.float16 else torch.float32
        self.dp = _round_up(c.hidden_size, int(self.lib.dm_row_pad()))
        self._keep: list = []  # every tensor and buffer the native side points into
        state = model.state_dict()
        self.quant = c.quantization if c.quantized_linears else None
        self.twin = twin
        self.ffns: dict[int, CpuDeaMoE] = {}
        self.nbytes = 0
        with torch.no_grad():
            embed = self._rows(state["embed_tokens.weight"], self.dp)
            head = _Linear(embed.ptr, None, c.vocab_size, self.dp)
            if not c.tie_word_embeddings:
                head = self._linear(state, "lm_head", self.dp)
            blocks = (_Block * c.num_layers)()
            for i in range(c.num_layers):
                blocks[i] = self._block(model, state, i)
            cos = model.rope_cos.float().contiguous()
            sin = model.rope_sin.float().contiguous()
            self._keep += [cos, sin, blocks]
        self.desc = _Model(
            dtype=1 if self.dtype == torch.float16 else 0,
            qk_norm=_QK_NORMS[c.qk_norm],
            vocab=c.vocab_size,
            d=c.hidden_size,
            dp=self.dp,
            layers=c.num_layers,
            heads=c.num_heads,
            kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            max_context=c.max_position_embeddings,
            eps=c.rms_norm_eps,
            clip_qkv=c.clip_qkv,
            attention_scale=c.attention_multiplier or c.head_dim**-0.5,
            embedding_multiplier=c.embedding_multiplier,
            residual_multiplier=c.residual_multiplier,
            logits_scaling=c.logits_scaling,
            embed=embed.ptr,
            final_norm=self._f32(state["norm.weight"]).data_ptr(),
            head=head,
            rope_cos=cos.data_ptr(),
            rope_sin=sin.data_ptr(),
            blocks=ctypes.addressof(blocks),
        )
        self.nbytes += sum(layer.nbytes for layer in self.ffns.values())

    # Packing --------------------------------------------------------------------------------

    def _rows(self, weight: torch.Tensor, cols_p: int) -> _Buffer:
        """weight [rows, cols] in the step's dtype, columns zero-padded to cols_p, packed four
        rows at a time (dm_pack_linear: the layout the step's projections and embedding read)
        in the kernel's memory (transparent huge pages, as the FFNs' weights)."""
        w = weight.detach().to(self.dtype).contiguous()
        rows, cols = w.shape
        esize = w.element_size()
        buf = _Buffer(int(self.lib.dm_pack_linear_elems(rows, cols_p)) * esize)
        if self.lib.dm_pack_linear(w.data_ptr(), rows, cols, cols_p, esize, buf.ptr) != 0:
            raise DeaMoEError(f"CPU kernel: packing a [{rows}, {cols}] projection failed")
        self._keep.append(buf)
        self.nbytes += buf.nbytes
        return buf

    def _f32(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        out = t.detach().float().contiguous()
        self._keep.append(out)
        return out

    def _linear(self, state: dict, prefix: str, cols_p: int) -> _Linear:
        """A projection as the step reads it: float rows padded to cols_p, or its quantized
        codes and scales packed (deamoe_cpu_model.h, q_quad_bytes)."""
        bias = _ptr(self._f32(state.get(f"{prefix}.bias")))
        if f"{prefix}.weight.qweight" not in state:
            weight = state[f"{prefix}.weight"]
            return _Linear(self._rows(weight, cols_p).ptr, bias, weight.shape[0], cols_p)
        q = self.quant
        assert q is not None  # a quantized projection comes with the config's quantization
        codes = unpack(state[f"{prefix}.weight.qweight"], q.bits).contiguous()
        stored = state[f"{prefix}.weight.scales"]
        sd = SCALE_DTYPES.get(stored.dtype, 0)
        scales = self._f32(stored)
        rows, cols = codes.shape
        buf = _Buffer(int(self.lib.dm_pack_linear_q_bytes(rows, cols, q.group_size, q.bits, sd)))
        code = self.lib.dm_pack_linear_q(
            codes.data_ptr(), scales.data_ptr(), sd, rows, cols, q.group_size, q.bits, buf.ptr
        )
        if code != 0 or cols != cols_p:
            raise DeaMoEError(f"CPU kernel: packing the quantized projection {prefix} failed (code {code})")
        self._keep.append(buf)
        self.nbytes += buf.nbytes
        return _Linear(buf.ptr, bias, rows, cols, q.bits, q.group_size, sd)

    def _block(self, model: DeaMoELM, state: dict, i: int) -> _Block:
        c = self.config
        p = f"layers.{i}."
        qdp = _round_up(c.q_dim, int(self.lib.dm_row_pad()))
        block = model.layers[i]
        desc = _Block(
            input_norm=self._f32(state[p + "input_layernorm.weight"]).data_ptr(),
            post_norm=self._f32(state[p + "post_attention_layernorm.weight"]).data_ptr(),
            q=self._linear(state, p + "self_attn.q_proj", self.dp),
            k=self._linear(state, p + "self_attn.k_proj", self.dp),
            v=self._linear(state, p + "self_attn.v_proj", self.dp),
            o=self._linear(state, p + "self_attn.o_proj", qdp),
            q_norm=_ptr(self._f32(state.get(p + "self_attn.q_norm.weight"))),
            k_norm=_ptr(self._f32(state.get(p + "self_attn.k_norm.weight"))),
            sinks=_ptr(self._f32(state.get(p + "self_attn.sinks"))),
            window=c.window(i),
        )
        if block.is_moe:
            self.ffns[i] = CpuDeaMoE.of_twin(block.mlp, self.twin, threads=self.pool.threads)
            desc.ffn = ctypes.addressof(self.ffns[i].desc)
        else:
            desc.ffn = ctypes.addressof(self._dense(state, p + "mlp."))
            desc.dense = 1
        return desc

    def _dense(self, state: dict, prefix: str) -> _LayerDesc:
        """A dense SwiGLU MLP as a layer of one always-on part (the kernel's shared experts)."""
        if f"{prefix}down_proj.weight.qweight" in state:
            return self._dense_quantized(state, prefix)
        c = self.config
        gate, up, down = (state[f"{prefix}{name}_proj.weight"] for name in ("gate", "up", "down"))
        gate_up = torch.cat((gate, up)).to(self.dtype).contiguous()
        down = down.to(self.dtype).contiguous()
        width = down.shape[1]
        nb = int(self.lib.dm_neurons_per_group())
        groups = -(-width // nb)
        esize = gate_up.element_size()
        buf = _Buffer(groups * 3 * nb * self.dp * esize)
        code = self.lib.dm_pack(gate_up.data_ptr(), down.data_ptr(), 1, width, c.hidden_size, self.dp, esize, buf.ptr)
        if code != 0:
            raise DeaMoEError(f"CPU kernel: packing the dense MLP {prefix} failed (code {code})")
        self.nbytes += buf.nbytes
        desc = _LayerDesc(
            dtype=1 if self.dtype == torch.float16 else 0,
            d=c.hidden_size,
            dp=self.dp,
            num_departments=1,
            experts_per_department=1,
            top_k=1,
            top_departments=1,
            shared=buf.ptr,
            groups_sh=groups,
        )
        self._keep += [buf, desc]
        return desc

    def _dense_quantized(self, state: dict, prefix: str) -> _LayerDesc:
        """A quantized dense MLP in the kernel's quantized layout (dm_pack_q), codes unpacked."""
        c, q = self.config, self.quant
        assert q is not None
        parts = {name: state[f"{prefix}{name}_proj.weight.qweight"] for name in ("gate", "up", "down")}
        codes = {name: unpack(t, q.bits) for name, t in parts.items()}
        stored = {name: state[f"{prefix}{name}_proj.weight.scales"] for name in parts}
        dtypes = {t.dtype for t in stored.values()}
        sd = SCALE_DTYPES.get(dtypes.pop(), 0) if len(dtypes) == 1 else 0
        scales = {name: t.float() for name, t in stored.items()}
        gu_codes = torch.cat((codes["gate"], codes["up"])).contiguous()
        gu_scales = torch.cat((scales["gate"], scales["up"])).contiguous()
        dn_codes, dn_scales = codes["down"].contiguous(), scales["down"].contiguous()
        width = dn_codes.shape[1]
        buf = _Buffer(int(self.lib.dm_pack_q_bytes(1, width, c.hidden_size, q.group_size, q.bits, sd)))
        pointers = (gu_codes.data_ptr(), gu_scales.data_ptr(), dn_codes.data_ptr(), dn_scales.data_ptr())
        code = self.lib.dm_pack_q(*pointers, 1, width, c.hidden_size, q.group_size, q.bits, sd, buf.ptr)
        if code != 0 or self.dp != c.hidden_size:
            raise DeaMoEError(f"CPU kernel: packing the quantized dense MLP {prefix} failed (code {code})")
        self.nbytes += buf.nbytes
        desc = _LayerDesc(
            dtype=1 if self.dtype == torch.float16 else 0,
            d=c.hidden_size,
            dp=self.dp,
            num_departments=1,
            experts_per_department=1,
            top_k=1,
            top_departments=1,
            shared=buf.ptr,
            groups_sh=width // int(self.lib.dm_neurons_per_group()),
            weight_bits=q.bits,
            group_size=q.group_size,
            scale_dtype=sd,
        )
        self._keep += [buf, desc]
        return desc


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class NativeDecoder:
    """The Decoder protocol (deamoe_trt.runtimes.base) on the native step: one sequence, its
    KV cache held natively."""

    name = "cpu-native"

    def __init__(self, model: DeaMoELM | NativeModel, *, threads: int | None = None):
        self.model = model if isinstance(model, NativeModel) else NativeModel(model, threads=threads)
        self.lib = self.model.lib
        self.max_context = self.model.config.max_position_embeddings
        self.vocab = self.model.config.vocab_size
        self.handle = self.lib.dm_lm_create(ctypes.byref(self.model.desc), self.model.pool.handle)
        if not self.handle:
            raise DeaMoEError("the native CPU step refused the packed model (its sizes do not match)")
        self._logits = np.empty(self.vocab, dtype=np.float32)

    def fork(self) -> NativeDecoder:
        """A decoder over the same packed weights with a cache of its own (a new sequence)."""
        return NativeDecoder(self.model)

    @property
    def position(self) -> int:
        """Tokens in the cache."""
        return int(self.lib.dm_lm_position(self.handle))

    def _run(self, ids: list[int]) -> np.ndarray:
        arr = np.ascontiguousarray(ids, dtype=np.int64)
        if arr.ndim != 1 or arr.size < 1:
            raise UsageError("a step needs at least one token id")
        self.model.pool.wake()
        code = self.lib.dm_lm_forward(self.handle, arr.ctypes.data, arr.size, self._logits.ctypes.data)
        if code == -2:
            raise UsageError(
                f"{self.position} cached + {arr.size} new tokens exceed the model's context of {self.max_context}"
            )
        if code == -3:
            bad = next(int(i) for i in arr if not 0 <= i < self.vocab)
            raise UsageError(f"token id {bad} is outside the vocabulary of {self.vocab}")
        if code != 0:
            raise DeaMoEError(f"the native CPU step failed (code {code})")
        return self._logits.copy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.lib.dm_lm_reset(self.handle)
        return self._run(list(ids))

    def step(self, token: int) -> np.ndarray:
        return self._run([token])

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self.lib.dm_lm_destroy(handle)
