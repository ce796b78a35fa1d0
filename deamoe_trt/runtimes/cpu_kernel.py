"""deamoe-trt's CPU kernel (deamoe_trt.cpu) as a runtime: built with the system C++ compiler at first use.

Language models decode on the native step (deamoe_trt.cpu.model_step: the whole model in
C++, every weight streamed once per step by the kernel's threads), or, for models it does
not run (multi-head latent attention) and with step="torch", on CpuDecoder: attention,
norms, dense layers, embeddings and head in PyTorch, and each DeaMoE block's FFN one kernel
call per step that routes and streams every used weight once. The kernel runs
float32 and float16 weights; a bfloat16 model's FFNs are converted to float16 for it (a
different rounding: tokens may differ from the bf16 model).

The PyTorch part of a half-precision model runs in float32 (its weights copied once):
PyTorch's fp16 and bf16 matrix-vector products on CPUs without native half arithmetic are
several times slower than fp32 ones although they read half the bytes (measured here on a
[4096, 2048] projection, 1 token: fp16 24.8 ms, bf16 28.3 ms, fp32 8.2 ms), and they set
the time of a decode step outside the FFNs.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Sequence

import numpy as np
import torch

from ..cpu.layer import CpuDeaMoE, _single_threaded_torch
from ..cpu.model_step import NativeDecoder, NativeModel, unsupported
from ..errors import DeaMoEError, UsageError, one_line
from ..lm.model import DeaMoELM, KVCache, check_twin
from .base import BatchDecoder, Capabilities, DecoderPool, Prepared, RuntimeBase, Slots


class CpuKernelRuntime(RuntimeBase):
    name = "cpu"
    label = "deamoe-trt CPU kernel"
    # Batched: the native step's (a model it does not run gets the serial fallback). Benchmarks
    # time the native step ("cpu-native") apart from attention in PyTorch ("cpu").
    capabilities = Capabilities(
        decoding=True,
        batched=True,
        dtypes=(torch.float32, torch.float16),
        needs=frozenset({"compiler"}),
        modes=("native",),
    )

    def available(self) -> str | None:
        from ..cpu import load

        try:
            load()  # builds the kernel once (cached), or says why it cannot
        except DeaMoEError as exc:
            return one_line(exc)
        return None

    def prepare(self, module, *, dtype=None, device=None, threads=None, routing: str = "native", **options) -> Prepared:
        from ..cpu import CpuDeaMoE, CpuDeaMoEStack, simd
        from ..layer import DeaMoEStack

        module = self.cast(module, dtype)
        kind = CpuDeaMoEStack if isinstance(module, DeaMoEStack) else CpuDeaMoE
        fast = kind(module, threads=threads, routing=routing)
        return Prepared(self.name, fast, memory_bytes=fast.nbytes, info={"simd": simd(), "threads": threads})

    def stack(self, layers: Sequence[Prepared]) -> Prepared:
        """One Prepared that runs layers (each prepare() of one DeaMoELayer) as a stack,
        x <- x + layer(x): for a caller that packs a large stack a layer at a time, so that the
        PyTorch copies of its layers never pile up."""
        from ..cpu import CpuDeaMoEStack

        packed = []
        for layer in layers:
            if not isinstance(layer.run, CpuDeaMoE):
                raise UsageError(f"{self.label} stacks the layers it prepared, not {layer.runtime}'s")
            packed.append(layer.run)
        if not packed:
            raise UsageError("a stack needs at least one layer")
        fast = CpuDeaMoEStack.from_layers(packed)
        return Prepared(self.name, fast, memory_bytes=fast.nbytes, info=dict(layers[0].info))

    def decoder(self, model, *, threads=None, twin="deamoe", step="native", **options) -> CpuDecoder | NativeDecoder:
        """step "native": the whole model in native code where it can run (falls back to
        "torch" for the others); "torch": attention in PyTorch, the FFNs on the kernel."""
        return cpu_decoder(model, threads=threads, twin=twin, step=step)

    def decoder_pool(self, model, *, threads=None, size=1, twin="deamoe", step="native", **options) -> DecoderPool:
        shared = cpu_decoder(model, threads=threads, twin=twin, step=step)
        return DecoderPool(shared.fork, keep_alive=shared)

    def batch_decoder(
        self, model, *, max_sequences, threads=None, twin="deamoe", step="native", **options
    ) -> BatchDecoder:
        """step "native" and a model the native step runs: NativeBatchDecoder (one C call a
        step for every sequence); otherwise the serial fallback over pooled decoders."""
        if step not in STEPS:
            raise UsageError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
        if step == "native" and unsupported(model.config) is None:
            Slots(max_sequences, model.config.max_position_embeddings)  # refuses a bad size before packing
            return NativeBatchDecoder(NativeModel(model, threads=threads, twin=twin), max_sequences)
        return super().batch_decoder(model, max_sequences=max_sequences, threads=threads, twin=twin, step=step)


STEPS = ("native", "torch")


def cpu_decoder(
    model: DeaMoELM, *, threads: int | None = None, twin: str = "deamoe", step: str = "native"
) -> CpuDecoder | NativeDecoder:
    """A decoder of model (with its twin's FFNs) on the CPU kernel: the native step when
    step is "native" and the model is one it runs, else CpuDecoder."""
    if step not in STEPS:
        raise UsageError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    if step == "native" and unsupported(model.config) is None:
        return NativeDecoder(NativeModel(model, threads=threads, twin=twin))
    return CpuDecoder(model, threads=threads, twin=twin)


class CpuDecoder:
    """A Decoder (runtimes.base) on the CPU kernel: attention in PyTorch, the FFNs on the kernel."""

    name = "cpu"

    def __init__(self, model: DeaMoELM, *, threads: int | None = None, twin: str = "deamoe", ffns: dict | None = None):
        """model's attention with its twin's DeaMoE FFNs ("deamoe": its own; "expanded",
        "vanilla": DeaMoELayer's twins), each packed for the kernel as it is made, so that one
        twin block at a time is in memory; ffns: {block: FFN} to use instead (already packed)."""
        check_twin(twin)
        self.model = _float32_outside_moe(model).eval()
        self.max_context = model.config.max_position_embeddings
        self.ffns = ffns if ffns is not None else {}
        for i in [] if ffns is not None else model.moe_layers():
            self.ffns[i] = CpuDeaMoE.of_twin(model.layers[i].mlp, twin, threads=threads)
        self.cache: KVCache | None = None

    def fork(self) -> CpuDecoder:
        """A decoder over the same weights and packed FFNs with a cache of its own (a new sequence)."""
        other = copy.copy(self)
        other.cache = None
        return other

    @torch.inference_mode()
    def _run(self, ids: list[int]) -> np.ndarray:
        # PyTorch on one thread: the kernel's workers spin between its calls, and PyTorch's
        # intra-op threads competing with them for the cores cost milliseconds per small op
        # (measured on this shared VM, one bench-lm block: a 1-token step went from 178 ms to 82 ms).
        with _single_threaded_torch():
            out = self.model(torch.tensor([ids], dtype=torch.long), self.cache, ffns=self.ffns)
        self.cache = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.cache = None
        return self._run(list(ids))

    def step(self, token: int) -> np.ndarray:
        return self._run([token])


def _float32_outside_moe(model: DeaMoELM) -> DeaMoELM:
    """model with every tensor outside its DeaMoE FFNs in float32 (the FFN tensors are shared,
    not copied: the kernel has its own packed copy)."""
    c = model.config
    if model.dtype == torch.float32 and not c.quantized_linears:
        return model
    moe = tuple(f"layers.{i}.mlp." for i in model.moe_layers())
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(moe)}
    if c.quantized_linears:  # quantized projections run dequantized, as the reference runs them
        from ..lm.qlinear import dequantized_state

        assert c.quantization is not None
        state = dequantized_state(state, c.quantization)
    state = {k: v.float() for k, v in state.items()}
    state.update({k: v for k, v in model.state_dict().items() if k.startswith(moe)})
    twin = DeaMoELM(c.replace(quantized_linears=()), dtype=torch.float32, device="meta")
    twin.load_state_dict(state, assign=True)
    twin.tie_weights()
    return twin.materialize_rope()


class NativeBatchDecoder:
    """The BatchDecoder protocol (deamoe_trt.runtimes.base) on the native step: up to
    max_sequences sequences over one NativeModel, each a native session (its KV cache and
    position), stepped together by dm_lm_forward_batch."""

    name = "cpu-native"

    def __init__(self, model: NativeModel, max_sequences: int):
        self.model = model
        self.lib = model.lib
        self.max_context = model.config.max_position_embeddings
        self.vocab = model.config.vocab_size
        self.slots = Slots(max_sequences, self.max_context)
        self.max_sequences = max_sequences
        self._sessions: dict[int, int] = {}  # slot -> native session, made at its first open
        self._logits = np.empty((max_sequences, self.vocab), dtype=np.float32)
        self._handles = (ctypes.c_void_p * max_sequences)()

    def _session(self, slot: int) -> int:
        if slot not in self._sessions:
            handle = self.lib.dm_lm_create(ctypes.byref(self.model.desc), self.model.pool.handle)
            if not handle:
                raise DeaMoEError("the native CPU step refused the packed model (its sizes do not match)")
            self._sessions[slot] = handle
        return self._sessions[slot]

    def _check_ids(self, ids: Sequence[int]) -> np.ndarray:
        arr = np.ascontiguousarray(ids, dtype=np.int64)
        bad = [int(i) for i in arr if not 0 <= i < self.vocab]
        if bad:
            raise UsageError(f"token id {bad[0]} is outside the vocabulary of {self.vocab}")
        return arr

    def open(self, ids: list[int]) -> tuple[int, np.ndarray]:
        slot = self.slots.check_open(list(ids))
        arr = self._check_ids(ids)
        handle = self._session(slot)
        self.lib.dm_lm_reset(handle)
        self.model.pool.wake()
        code = self.lib.dm_lm_forward(handle, arr.ctypes.data, arr.size, self._logits.ctypes.data)
        if code != 0:
            raise DeaMoEError(f"the native CPU step failed (code {code})")
        self.slots.lengths[slot] = arr.size
        return slot, self._logits[0].copy()

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        self.slots.check_step(seqs, tokens)
        arr = self._check_ids(tokens)
        for i, seq in enumerate(seqs):
            self._handles[i] = self._sessions[seq]
        self.model.pool.wake()
        code = self.lib.dm_lm_forward_batch(self._handles, arr.ctypes.data, len(seqs), self._logits.ctypes.data)
        if code != 0:
            raise DeaMoEError(f"the native CPU batched step failed (code {code})")
        for seq in seqs:
            self.slots.lengths[seq] += 1
        return self._logits[: len(seqs)].copy()

    def close(self, seq: int) -> None:
        self.slots.release(seq)  # the session stays, its memory kept for the next open

    def length(self, seq: int) -> int:
        return self.slots.length(seq)

    def __del__(self):
        sessions, self._sessions = getattr(self, "_sessions", {}), {}
        for handle in sessions.values():
            self.lib.dm_lm_destroy(handle)


RUNTIME = CpuKernelRuntime()
