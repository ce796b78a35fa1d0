"""A whole DeaMoE language model decoding on one CUDA device: the batch decoder of the CUDA
runtime (runtimes.cuda), for 1 to max_sequences sequences per step.

Where each part runs:
- every DeaMoE FFN on the kernel library (`deamoe_forward_variant`, the variant this GPU's
  tuned table picks, deamoe_trt.cuda.tuning: one call per block and step for
  all the step's sequences, so each used weight row is read once for all of them; float
  and the int8/int4 weights of `quantize`), and every dense MLP block as the one-part layer
  (`dense_as_layer`; int8/int4 codes when `quantize --linears dense` stored them);
- embedding, RMS norms, q/k/v/o, rotary, decode attention over the KV cache (grouped-query
  heads, sliding windows, sinks, q/k norms, clipping; multi-head latent attention in its
  absorbed form) and the head on PyTorch ops on the same device. Projections
  stored int8/int4 (`quantize --linears`) are dequantized once when the decoder is made and
  run as dense matrices in the model's dtype, as the PyTorch reference runs them;
- prefill on the PyTorch model, with the FFNs on the kernels on a GPU and on PyTorch under
  the emulator (which runs one host thread per CUDA thread: a prompt's FFNs would take
  seconds); its keys and values are then copied into the decoder's cache.

The KV cache lives in device memory as one static tensor per block and cache part,
[max_sequences, heads, max_context, width]: a sequence owns one slot, and a step writes
each sequence's new key at its own position and attends over its positions only (a
sliding block hides the keys outside its window; the cache itself keeps every key).

On a GPU, a step of B sequences is captured as a CUDA graph the second time B sequences
step together, and replayed from then on (graph_error says why, if a capture failed and the
step stays eager): a step is one host-to-device copy of the tokens,
positions and slots, one graph launch and one copy of the logits back, with no host
synchronisation inside. Under the SIMT emulator (`CudaRuntime.emulated`, CPU tensors) the
same step runs eagerly.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from ..errors import UsageError
from ..lm.attention import apply_rope
from ..lm.model import DeaMoELM, check_twin
from .base import Slots

# The context a decoder holds unless told otherwise (max_context=): every step attends over
# all of it (the positions after a sequence's own masked), and the cache is allocated whole,
# so a model's full context (40960 for Qwen3) would cost gigabytes and a slower step.
DEFAULT_MAX_CONTEXT = 4096

# Where q/k/v/o and the head run: "torch" (PyTorch's matrix products) or "kernels" (the
# kernel library's GEMV, KernelLinear; float weights).
PROJECTIONS = ("torch", "kernels")


def runnable(model: DeaMoELM, twin: str, device: torch.device, *, own_modules: bool = False) -> DeaMoELM:
    """model's twin on device, its int8/int4 projections (quantized_linears) dense in the
    model's dtype; the DeaMoE FFNs stay as stored (the kernels read int8/int4 codes).
    own_modules: modules of its own (sharing the tensors), so that the caller may swap some."""
    check_twin(twin)
    source = model.twin(twin)
    c = source.config
    if own_modules and not c.quantized_linears:
        copy = DeaMoELM(c, dtype=source.dtype, device="meta")
        copy.load_state_dict(source.state_dict(), assign=True)
        copy.tie_weights()
        source = copy.materialize_rope()
    if c.quantized_linears:
        from ..lm.qlinear import dequantized_state

        assert c.quantization is not None  # LMConfig checks
        moe = tuple(f"layers.{i}.mlp." for i in source.moe_layers())
        state = source.state_dict()
        outside = dequantized_state({k: v for k, v in state.items() if not k.startswith(moe)}, c.quantization)
        outside.update({k: v for k, v in state.items() if k.startswith(moe)})
        dense = DeaMoELM(c.replace(quantized_linears=()), dtype=source.dtype, device="meta")
        dense.load_state_dict(outside, assign=True)
        dense.tie_weights()
        source = dense.materialize_rope()
    source = source.to(device).eval()
    for i in source.moe_layers():
        # The kernels read 16-byte vectors: fresh allocations are aligned, a checkpoint's
        # memory-mapped tensors need not be.
        source.layers[i].mlp._apply(lambda t: t if t.data_ptr() % 16 == 0 else t.clone())
    return source


def dense_as_layer(source: DeaMoELM, block: int, device: torch.device):
    """Block `block`'s dense SwiGLU MLP as the one-part DeaMoE layer the kernels run: one
    department of one expert whose shared part is the MLP (gate rows then up rows, the
    canonical gate_up), no private part and a zero router, so its one expert weighs
    softmax([0]) = 1. Stored int8/int4 (`quantize --linears dense`) it keeps its codes."""
    from ..config import DeaMoEConfig
    from ..layer import DeaMoELayer
    from ..quant import QuantizedWeight

    c, mlp = source.config, source.layers[block].mlp
    width = mlp.down_proj.in_features
    config = DeaMoEConfig(
        hidden_size=c.hidden_size,
        num_departments=1,
        experts_per_department=1,
        shared_intermediate_size=width,
        private_intermediate_size=0,
        top_k=1,
        top_departments=1,
    )
    quantized = isinstance(mlp.down_proj.weight, QuantizedWeight)
    layer = DeaMoELayer(config, dtype=source.dtype, device="meta", quant=c.quantization if quantized else None)
    state = {"router.weight": torch.zeros((1, c.hidden_size), dtype=source.dtype)}
    gate, up, down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    for suffix in (".qweight", ".scales") if quantized else ("",):

        def part(weight, suffix=suffix):
            return getattr(weight, suffix[1:]) if suffix else weight

        state["departments.gate_up" + suffix] = torch.cat((part(gate), part(up)))[None]
        state["departments.down" + suffix] = part(down)[None]
    layer.load_state_dict({k: v.detach().to(device).contiguous() for k, v in state.items()}, assign=True)
    return layer.eval()


class KernelLinear:
    """y = x W^T (+ b) with W [out, in] streamed by the kernel library's router-logits GEMV
    (`deamoe_router_logits`: W as the router of a one-department layer of `out` experts,
    float32 accumulation, every row read once for all the step's tokens), rounded to x's
    dtype as F.linear rounds its float32 sums. Float weights only."""

    def __init__(self, lib: ctypes.CDLL, linear, stream: Callable[[], int | None]):
        from ..config import DeaMoEConfig
        from ..cuda._abi import DTYPES, layer_params

        out, width = linear.weight.shape
        config = DeaMoEConfig(
            hidden_size=width,
            num_departments=1,
            experts_per_department=out,
            shared_intermediate_size=0,
            private_intermediate_size=16,
            top_k=1,
            top_departments=1,
        )
        weight = linear.weight.detach()
        self.weight = weight if weight.data_ptr() % 16 == 0 and weight.is_contiguous() else weight.contiguous().clone()
        self.bias = linear.bias
        self.params = layer_params(config)
        self.lib, self.stream, self.out, self.code = lib, stream, out, DTYPES[weight.dtype]

    def valid(self) -> bool:
        from ..cuda._abi import SUCCESS

        return self.lib.deamoe_validate(ctypes.byref(self.params)) == SUCCESS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from ..cuda._ops import check

        tokens = x.reshape(-1, x.shape[-1]).to(self.weight.dtype).contiguous()
        logits = torch.empty((tokens.shape[0], self.out), dtype=torch.float32, device=tokens.device)
        status = self.lib.deamoe_router_logits(
            ctypes.byref(self.params),
            self.code,
            tokens.data_ptr(),
            self.weight.data_ptr(),
            None,
            tokens.shape[0],
            logits.data_ptr(),
            self.stream(),
        )
        check(self.lib, status, "deamoe_router_logits")
        y = logits if self.bias is None else logits + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], self.out)


def kernel_projections(model: DeaMoELM, lib: ctypes.CDLL, stream: Callable[[], int | None]) -> int:
    """Puts KernelLinear in place of every float nn.Linear of model's attention and head (the
    ones the kernels accept); how many."""
    from torch import nn

    count = 0
    parents = [block.self_attn for block in model.layers] + [model]
    for parent in parents:
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and (parent is not model or name == "lm_head"):
                fast = KernelLinear(lib, child, stream)
                if fast.valid():
                    setattr(parent, name, _Projection(fast))
                    count += 1
    return count


class _Projection(torch.nn.Module):
    """A KernelLinear as a module, so the model's own code (attention, head) calls it."""

    def __init__(self, fast: KernelLinear):
        super().__init__()
        self.fast = fast
        self.weight = fast.weight  # what code reading .weight (MLA's up projections) finds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast(x)


class KernelFFN:
    """One block's DeaMoE FFN on the kernel library, with its parameters, weight pointers and
    workspace made once (for up to max_tokens tokens a call), so a call allocates nothing but
    its output and can be captured in a CUDA graph."""

    def __init__(self, lib: ctypes.CDLL, layer, max_tokens: int, stream: Callable[[], int | None]):
        from ..cuda._abi import DTYPES, layer_params
        from ..cuda._ops import layer_weights, workspace_bytes

        self.lib, self.layer, self.stream, self.max_tokens = lib, layer, stream, max_tokens
        self.dtype = layer.dtype
        self.code = DTYPES[self.dtype]
        self.params = layer_params(layer.config, layer.router_dtype == torch.float32, layer.quant)
        self.weights, self._keep = layer_weights(layer)
        self.size = workspace_bytes(lib, layer.config, max_tokens, self.dtype)
        self.workspace = torch.empty(self.size, dtype=torch.uint8, device=layer.router.weight.device)
        self._variants: dict[int, int] = {}  # tokens a call -> the kernel variant this GPU's table picks

    def supported(self) -> bool:
        """Whether the kernels run this layer in its dtype (deamoe_check_supported)."""
        from ..cuda._abi import SUCCESS

        return self.lib.deamoe_check_supported(ctypes.byref(self.params), self.code) == SUCCESS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from ..cuda._ops import check, forward_with, variant_id

        tokens = x.reshape(-1, x.shape[-1]).to(self.dtype).contiguous()
        if tokens.shape[0] > self.max_tokens:  # prefill: a workspace of its own
            return forward_with(self.lib, self.layer, tokens, self.stream()).to(x.dtype).view_as(x)
        count = tokens.shape[0]
        if count not in self._variants:  # looked up once, outside any captured step
            self._variants[count] = variant_id(self.lib, self.layer, count, tokens.device, None)
        out = torch.empty_like(tokens)
        status = self.lib.deamoe_forward_variant(
            ctypes.byref(self.params),
            ctypes.byref(self.weights),
            self.code,
            self._variants[count],
            tokens.data_ptr(),
            out.data_ptr(),
            tokens.shape[0],
            self.workspace.data_ptr(),
            self.size,
            self.stream(),
        )
        check(self.lib, status, "deamoe_forward_variant")
        return out.to(x.dtype).view_as(x)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, hd] rotated at each row's own position (cos, sin [B, hd/2])."""
    return apply_rope(x, cos[:, None], sin[:, None])


def _scale(scores: torch.Tensor, config) -> torch.Tensor:
    from ..lm.attention import softmax_scale

    return softmax_scale(scores, config)


class CudaBatchDecoder:
    """A BatchDecoder (runtimes.base) of one language model on the CUDA runtime's device; see
    the module docstring."""

    def __init__(
        self,
        runtime,
        model: DeaMoELM,
        *,
        max_sequences: int,
        twin: str = "deamoe",
        max_context: int | None = None,
        graphs: bool = True,
        projections: str = "torch",
    ):
        self.runtime = runtime
        self.name = runtime.name
        self.device = runtime.device
        check_twin(twin)
        source = model.twin(twin)
        dense = [i for i in range(source.config.num_layers) if source.config.is_dense(i)]
        dense_layers = {i: dense_as_layer(source, i, self.device) for i in dense}
        if projections not in PROJECTIONS:
            raise UsageError(f"projections must be one of {', '.join(PROJECTIONS)}, got {projections!r}")
        kernels = projections == "kernels"
        self.model = runnable(source, "deamoe", self.device, own_modules=kernels)  # source is the twin already
        c = self.config = self.model.config
        limit = c.max_position_embeddings
        if max_context is not None and not (isinstance(max_context, int) and 2 <= max_context <= limit):
            raise UsageError(
                f"max_context must be an integer from 2 to the model's context of {limit}, got {max_context!r}"
            )
        self.max_context = max_context or min(limit, DEFAULT_MAX_CONTEXT)
        self.slots = Slots(max_sequences, self.max_context)
        self.max_sequences = max_sequences
        lib = runtime.lib
        self.ffns: dict[int, KernelFFN] = {
            i: KernelFFN(lib, self.model.layers[i].mlp, max_sequences, runtime._stream) for i in self.model.moe_layers()
        }
        self.kernel_projections = kernel_projections(self.model, lib, runtime._stream) if kernels else 0
        for i, layer in dense_layers.items():
            ffn = KernelFFN(lib, layer, max_sequences, runtime._stream)
            if ffn.supported():  # else (a width the kernels cannot tile) PyTorch runs the block
                self.ffns[i] = ffn
        dtype, dev, S, L = self.model.dtype, self.device, max_sequences, self.max_context
        self.cache = [
            tuple(torch.zeros((S, heads, L, width), dtype=dtype, device=dev) for heads, width in c.cache_shapes())
            for _ in range(c.num_layers)
        ]
        self.windows = [0 if c.is_mla else c.window(i) for i in range(c.num_layers)]
        # The step's inputs and output at fixed addresses (what a captured graph reads and writes).
        # Rows: slots, positions, tokens; staged in pinned host memory, one copy in a step.
        self._host = torch.zeros((3, S), dtype=torch.long, pin_memory=dev.type == "cuda")
        self._inputs = torch.zeros((3, S), dtype=torch.long, device=dev)
        self._slots, self._positions, self._tokens = self._inputs
        self._logits = torch.zeros((S, c.vocab_size), dtype=torch.float32, device=dev)
        self._key_index = torch.arange(L, device=dev)
        self.use_graphs = graphs and dev.type == "cuda"
        self._graphs: dict[int, Any] = {}  # batch size -> captured step (None: capture failed, eager)
        self._seen: set[int] = set()
        self.graph_error = ""  # why a capture failed, if one did

    # -- the BatchDecoder interface -----------------------------------------------------------

    @torch.inference_mode()
    def open(self, ids: list[int]) -> tuple[int, np.ndarray]:
        slot = self.slots.check_open(ids)
        ffns = dict(self.ffns) if self.device.type == "cuda" else None
        out = self.model(torch.tensor([list(ids)], dtype=torch.long, device=self.device), ffns=ffns)
        length = len(ids)
        for cache, present in zip(self.cache, out.past_key_values, strict=True):
            for part, stored in zip(cache, present, strict=True):
                kept = stored.shape[2]  # a sliding block's present keeps its newest keys only
                part[slot, :, length - kept : length].copy_(stored[0])
        self.slots.lengths[slot] = length
        return slot, out.logits[0, -1].float().cpu().numpy()

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        self.slots.check_step(seqs, tokens)
        batch = len(seqs)
        # The last step ended reading its logits back, so no copy from _host is still in flight.
        self._host[:, :batch] = torch.tensor(
            [list(seqs), [self.slots.lengths[s] for s in seqs], [int(t) for t in tokens]], dtype=torch.long
        )
        self._inputs[:, :batch].copy_(self._host[:, :batch], non_blocking=True)
        self._run(batch)
        for s in seqs:
            self.slots.lengths[s] += 1
        return self._logits[:batch].cpu().numpy()

    def close(self, seq: int) -> None:
        self.slots.release(seq)

    def length(self, seq: int) -> int:
        return self.slots.length(seq)

    # -- the step ---------------------------------------------------------------------------------

    def _run(self, batch: int) -> None:
        """One step of the first `batch` rows of the step inputs: eagerly the first time B
        sequences step; the second time eagerly on a side stream (the warm-up capture needs)
        and then captured, its writes being the ones a replay makes; replayed after that."""
        graph = self._graphs.get(batch)
        if graph is not None:
            graph.replay()
            return
        if not self.use_graphs or batch in self._graphs or batch not in self._seen:
            self._seen.add(batch)
            self._compute(batch)
            return
        main, side = torch.cuda.current_stream(self.device), torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self._compute(batch)
        main.wait_stream(side)
        try:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured, stream=side):
                self._compute(batch)
            self._graphs[batch] = captured
        except RuntimeError as exc:  # a capture the driver refuses: this batch size stays eager
            self._graphs[batch] = None
            self.graph_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    @torch.inference_mode()
    def _compute(self, batch: int) -> None:
        m, c = self.model, self.config
        slots, positions = self._slots[:batch], self._positions[:batch]
        x = F.embedding(self._tokens[:batch], m.embed_tokens.weight)
        if c.embedding_multiplier != 1:
            x = x * c.embedding_multiplier
        cos, sin = m.rope_cos[positions], m.rope_sin[positions]
        # visible[b, j]: key j is at or before sequence b's position (the window is per block).
        behind = positions[:, None] - self._key_index[None, :]
        for i, block in enumerate(m.layers):
            h = block.input_layernorm(x)
            if c.is_mla:
                attn = self._latent_attention(i, block.self_attn, h, cos, sin, slots, positions, behind)
            else:
                attn = self._attention(i, block.self_attn, h, cos, sin, slots, positions, behind)
            x = x + block._scaled(attn)
            y = block.post_attention_layernorm(x)
            ffn = self.ffns[i](y) if i in self.ffns else block.mlp(y)
            x = x + block._scaled(ffn.to(x.dtype))
        logits = m.lm_head(m.norm(x)).float()
        if c.logits_scaling != 1:
            logits = logits / c.logits_scaling
        self._logits[:batch].copy_(logits)

    def _hidden(self, behind: torch.Tensor, window: int) -> torch.Tensor:
        """[B, 1, 1, L] True where a key is hidden from its sequence's query (lm.attention.hidden_keys)."""
        hidden = behind < 0
        if window:
            hidden |= behind >= window
        return hidden[:, None, None, :]

    def _attention(self, i, attn, h, cos, sin, slots, positions, behind) -> torch.Tensor:
        c = self.config
        batch, hd, kv_heads = h.shape[0], c.head_dim, c.num_key_value_heads
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        if c.qk_norm == "full":
            q, k = attn.q_norm(q), attn.k_norm(k)
        if c.clip_qkv:
            q, k, v = (t.clamp(-c.clip_qkv, c.clip_qkv) for t in (q, k, v))
        q, k, v = q.view(batch, c.num_heads, hd), k.view(batch, kv_heads, hd), v.view(batch, kv_heads, hd)
        if c.qk_norm == "head":
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = self.cache[i]
        keys[slots, :, positions] = k
        values[slots, :, positions] = v
        groups = c.num_heads // kv_heads
        mine_k, mine_v = keys.index_select(0, slots).float(), values.index_select(0, slots).float()
        qg = q.float().view(batch, kv_heads, groups, hd)
        scores = _scale(qg @ mine_k.transpose(-1, -2), c)  # [B, kv_heads, groups, L]
        scores = scores.masked_fill(self._hidden(behind, self.windows[i]), -torch.inf)
        if c.attention_sinks:
            sink = attn.sinks.float().view(1, kv_heads, groups, 1).expand(batch, -1, -1, 1)
            probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out = (probs @ mine_v).to(h.dtype).reshape(batch, -1)
        return attn.o_proj(out)

    def _latent_attention(self, i, attn, h, cos, sin, slots, positions, behind) -> torch.Tensor:
        """lm.mla.LatentAttention.forward for one token per sequence over the slot cache."""
        c = self.config
        batch = h.shape[0]
        q = attn.queries(h).view(batch, c.num_heads, -1)
        q_nope, q_pe = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_pe = attn.kv_a_proj_with_mqa(h).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = attn.kv_a_layernorm(latent)
        q_pe, k_pe = _rope(q_pe, cos, sin), _rope(k_pe[:, None], cos, sin)
        latents, rotated = self.cache[i]
        latents[slots, :, positions] = latent[:, None]
        rotated[slots, :, positions] = k_pe
        w_uk, w_uv = (w.float() for w in attn.up_projections())
        mine = latents.index_select(0, slots)[:, 0].float()  # [B, L, r]
        mine_pe = rotated.index_select(0, slots)[:, 0].float()
        q_latent = (q_nope.float().transpose(0, 1) @ w_uk).transpose(0, 1)  # [B, H, r]
        scores = q_latent @ mine.transpose(-1, -2) + q_pe.float() @ mine_pe.transpose(-1, -2)  # [B, H, L]
        scores = _scale(scores, c).masked_fill(self._hidden(behind, 0)[:, 0], -torch.inf)
        out = torch.softmax(scores, dim=-1) @ mine  # [B, H, r]
        out = (out.transpose(0, 1) @ w_uv.transpose(-1, -2)).transpose(0, 1)  # [B, H, v]
        return attn.o_proj(out.to(h.dtype).reshape(batch, -1))
