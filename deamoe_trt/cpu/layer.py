"""A DeaMoE layer and stack on the CPU kernel: the weights repacked once, one kernel call per step."""

from __future__ import annotations

import contextlib
import ctypes

import torch

from ..errors import DeaMoEError, UsageError
from ..layer import DeaMoELayer, DeaMoEStack
from ..quant import unpack
from ..routing import Routing, route_logits
from ._build import load
from .runtime import _Buffer, pool

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1}
# The kernel's ScaleDtype: quantization scales are packed in the checkpoint's dtype where it
# has 16 bits (exact, half the bytes of fp32), else as fp32.
SCALE_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@contextlib.contextmanager
def _single_threaded_torch():
    """The routing's tensors are tiny: PyTorch's intra-op threads would only add fork/join
    costs, and compete for the cores with the kernel's workers, which are spinning by then."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return tensor.data_ptr() if tensor is not None else None


class _LayerDesc(ctypes.Structure):
    """Mirror of `struct dm_layer` in deamoe_cpu.cpp."""

    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("score_func", ctypes.c_int32),
        ("department_score", ctypes.c_int32),
        ("norm_topk_prob", ctypes.c_int32),
        ("d", ctypes.c_int64),
        ("dp", ctypes.c_int64),
        ("num_departments", ctypes.c_int64),
        ("experts_per_department", ctypes.c_int64),
        ("top_k", ctypes.c_int64),
        ("top_departments", ctypes.c_int64),
        ("routed_scaling_factor", ctypes.c_float),
        ("router_dtype", ctypes.c_int32),
        ("router", ctypes.c_void_p),
        ("router_bias", ctypes.c_void_p),
        ("departments", ctypes.c_void_p),
        ("groups_s", ctypes.c_int64),
        ("experts", ctypes.c_void_p),
        ("groups_p", ctypes.c_int64),
        ("shared", ctypes.c_void_p),
        ("groups_sh", ctypes.c_int64),
        ("shared_gate", ctypes.c_void_p),
        ("weight_bits", ctypes.c_int32),
        ("group_size", ctypes.c_int32),
        ("activation", ctypes.c_int32),
        ("swiglu_alpha", ctypes.c_float),
        ("swiglu_limit", ctypes.c_float),
        ("router_logit_bias", ctypes.c_void_p),
        ("departments_bias", ctypes.c_void_p),
        ("experts_bias", ctypes.c_void_p),
        ("shared_bias", ctypes.c_void_p),
        ("experts_down_bias", ctypes.c_void_p),
        ("shared_down_bias", ctypes.c_void_p),
        ("scale_dtype", ctypes.c_int32),
    ]


ROUTINGS = ("native", "torch")


class CpuDeaMoE:
    """A DeaMoELayer on the fast CPU path: fp32 or fp16 weights, fp32 math, fp32 outputs
    cast back to the input's dtype (as DeaMoELayer.forward does).

    A quantized layer (int8/int4, deamoe_trt.quant) keeps its FFN weights packed and
    dequantizes them in registers; its scales stay in their 16-bit dtype (fp16, bf16), other
    scales are held as fp32; its router in the layer's dtype.

    Biases (config.ffn_bias) are held as fp32 (widened exactly), gate/up biases in the
    kernel's neuron-group order beside their blocks, down biases padded to dp; the router's
    logit bias is added to the logits before routing; the activation is the layer's.

    routing="native" (default) routes in the kernel, one call per step, with the CUDA
    kernels' routing (deamoeRouting.cuh) that tests/cpu holds to deamoe_trt.routing's decisions. routing="torch" calls
    deamoe_trt.routing.route_logits itself on the kernel's logits (a few hundred
    microseconds of PyTorch dispatch per step when caches are cold)."""

    def __init__(self, layer: DeaMoELayer, *, threads: int | None = None, routing: str = "native"):
        if layer.dtype not in _DTYPE_CODES:
            raise UsageError(
                f"the CPU path runs float32 or float16 weights, not {layer.dtype}; convert the layer first"
            )
        if layer.router_dtype not in _DTYPE_CODES:
            raise UsageError(f"the CPU path runs a float32 or float16 router, not {layer.router_dtype}")
        if layer.router.weight.device.type != "cpu":
            raise UsageError("the CPU path needs the layer's weights on the CPU")
        if routing not in ROUTINGS:
            raise UsageError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        self.lib = load()
        self.pool = pool(threads)
        self.routing = routing
        self.config = c = layer.config
        self.dtype = layer.dtype
        self.esize = 2 if layer.dtype == torch.float16 else 4
        self.d = c.hidden_size
        self.dp = _round_up(self.d, int(self.lib.dm_row_pad()))
        self.nb = int(self.lib.dm_neurons_per_group())
        self.nbytes = 0
        self.quant = layer.quant
        # One ScaleDtype for the whole layer: 16-bit where every scale is (the usual case).
        scale_dtypes = {m.scales.dtype for m in layer.modules() if hasattr(m, "scales")}
        self.scale_dtype = SCALE_DTYPES.get(scale_dtypes.pop(), 0) if len(scale_dtypes) == 1 else 0

        with torch.no_grad():
            self.router = self._pad_rows(layer.router.weight)  # in its own dtype (float32 or the layer's)
            self.router_bias = (
                layer.router.bias.detach().float().contiguous() if layer.router.bias is not None else None
            )
            self.departments, groups_s = self._pack(layer.departments, c.num_departments)
            self.experts, groups_p = self._pack(layer.experts, c.num_experts)
            shared = layer.shared_experts
            self.shared, groups_sh = self._pack(shared, 1)
            self.shared_gate = None
            if shared is not None and shared.gate is not None:
                self.shared_gate = torch.zeros(self.dp, dtype=torch.float32)
                self.shared_gate[: self.d] = shared.gate.detach().float().reshape(-1)
            logit_bias = layer.router.logit_bias
            self.logit_bias = logit_bias.detach().float().contiguous() if logit_bias is not None else None
            parts: dict[str, tuple[torch.nn.Module | None, int]] = {
                "departments": (layer.departments, c.num_departments),
                "experts": (layer.experts, c.num_experts),
                "shared": (shared, 1),
            }
            self.biases = {
                name: self._pack_biases(part, count)
                for name, (part, count) in parts.items()
                if part is not None and part.gate_up_bias is not None
            }
        self.desc = _LayerDesc(
            dtype=_DTYPE_CODES[layer.dtype],
            score_func=("softmax", "sigmoid").index(c.score_func),
            department_score=("max", "sum_top2", "sum").index(c.department_score),
            norm_topk_prob=int(c.norm_topk_prob),
            d=self.d,
            dp=self.dp,
            num_departments=c.num_departments,
            experts_per_department=c.experts_per_department,
            top_k=c.top_k,
            top_departments=c.top_departments,
            routed_scaling_factor=c.routed_scaling_factor,
            router_dtype=_DTYPE_CODES[layer.router_dtype],
            router=self.router.ptr,
            router_bias=_ptr(self.router_bias),
            departments=self.departments.ptr if self.departments else None,
            groups_s=groups_s,
            experts=self.experts.ptr if self.experts else None,
            groups_p=groups_p,
            shared=self.shared.ptr if self.shared else None,
            groups_sh=groups_sh,
            shared_gate=_ptr(self.shared_gate),
            weight_bits=self.quant.bits if self.quant else 0,
            group_size=self.quant.group_size if self.quant else 0,
            scale_dtype=self.scale_dtype,
            activation=("swiglu", "swiglu_clamped").index(c.activation),
            swiglu_alpha=c.swiglu_alpha,
            swiglu_limit=c.swiglu_limit,
            router_logit_bias=_ptr(self.logit_bias),
            departments_bias=_ptr(self._bias("departments", 0)),
            experts_bias=_ptr(self._bias("experts", 0)),
            shared_bias=_ptr(self._bias("shared", 0)),
            experts_down_bias=_ptr(self._bias("experts", 1)),
            shared_down_bias=_ptr(self._bias("shared", 1)),
        )
        self._desc_ref = ctypes.byref(self.desc)
        self._buffers: dict[int, tuple[torch.Tensor, ...]] = {}
        self._buffer_ptrs: dict[int, tuple[int, ...]] = {}

    # Packing -------------------------------------------------------------------------------

    @classmethod
    def of_twin(cls, layer: DeaMoELayer, twin: str, *, threads: int | None = None) -> CpuDeaMoE:
        """layer's twin ("deamoe": layer itself; "expanded", "vanilla": DeaMoELayer's) packed for
        the kernel; a bfloat16 layer runs as float16 (another rounding of the same weights)."""
        if twin != "deamoe":
            layer = getattr(layer, twin)()
        if layer.dtype == torch.bfloat16:
            layer = layer.to(torch.float16)
        return cls(layer, threads=threads)

    def _pad_rows(self, weight: torch.Tensor) -> _Buffer:
        w = weight.detach().contiguous()
        rows, esize = w.shape[0], w.element_size()
        buf = _Buffer(rows * self.dp * esize)
        self._check(self.lib.dm_pad_rows(w.data_ptr(), rows, self.d, self.dp, esize, buf.ptr), "pad router")
        self.nbytes += buf.nbytes
        return buf

    def _pack(self, part, count: int) -> tuple[_Buffer | None, int]:
        """Blocks of a GroupedSwiGLU (or the shared experts, count 1) in the kernel's group layout."""
        if part is None:
            return None, 0
        if self.quant is not None:
            return self._pack_quantized(part, count)
        gate_up = part.gate_up.detach().contiguous()
        down = part.down.detach().contiguous()
        width = down.shape[-1]
        groups = -(-width // self.nb)
        buf = _Buffer(count * groups * 3 * self.nb * self.dp * self.esize)
        self._check(
            self.lib.dm_pack(gate_up.data_ptr(), down.data_ptr(), count, width, self.d, self.dp, self.esize, buf.ptr),
            "pack weights",
        )
        self.nbytes += buf.nbytes
        return buf, groups

    def _pack_quantized(self, part, count: int) -> tuple[_Buffer, int]:
        """A quantized part in the kernel's quantized group layout (dm_pack_q): codes stay
        codes (int4 two per byte), scales keep a 16-bit dtype (SCALE_DTYPES), else fp32."""
        q = self.quant
        if self.dp != self.d:
            raise UsageError(f"the CPU path runs quantized layers whose hidden size is a multiple of 16, not {self.d}")
        if q.group_size % self.nb or q.group_size % 16:
            raise UsageError(f"the CPU path runs group sizes that are multiples of 16, not {q.group_size}")

        def codes(weight) -> torch.Tensor:
            # One code per byte for the packer; 2-D shared experts as a stack of one.
            return unpack(weight.qweight.detach(), q.bits).reshape(count, *weight.shape[-2:]).contiguous()

        def scales(weight) -> torch.Tensor:
            return weight.scales.detach().float().reshape(count, weight.shape[-2], -1).contiguous()

        width = part.down.shape[-1]
        gu_codes, gu_scales = codes(part.gate_up), scales(part.gate_up)
        dn_codes, dn_scales = codes(part.down), scales(part.down)
        sd = self.scale_dtype
        nbytes = int(self.lib.dm_pack_q_bytes(count, width, self.d, q.group_size, q.bits, sd))
        buf = _Buffer(nbytes)
        pointers = (gu_codes.data_ptr(), gu_scales.data_ptr(), dn_codes.data_ptr(), dn_scales.data_ptr())
        code = self.lib.dm_pack_q(*pointers, count, width, self.d, q.group_size, q.bits, sd, buf.ptr)
        self._check(code, "pack quantized weights")
        self.nbytes += buf.nbytes
        return buf, width // self.nb

    def _pack_biases(self, part, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A part's biases as the kernel reads them, fp32: gate/up [count, groups, R] with
        neuron n's gate and up biases at rows 2(n % NB) and 2(n % NB) + 1 of group n // NB
        (the packed rows' order; padding neurons 0), down [count, dp] (None: no down bias)."""
        width = part.down.shape[-1]
        groups = -(-width // self.nb)
        gate, up = part.gate_up_bias.detach().float().reshape(count, 2, width).unbind(1)
        pairs = torch.zeros(count, groups * self.nb, 2)
        pairs[:, :width, 0], pairs[:, :width, 1] = gate, up
        gate_up = pairs.reshape(count, groups, 2 * self.nb).contiguous()
        if part.down_bias is None:
            return gate_up, None
        down = torch.zeros(count, self.dp)
        down[:, : self.d] = part.down_bias.detach().float().reshape(count, self.d)
        return gate_up, down

    def _bias(self, name: str, which: int) -> torch.Tensor | None:
        packed = self.biases.get(name)
        return None if packed is None else packed[which]

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise DeaMoEError(f"CPU kernel: {what} failed (code {code})")

    # Forward ---------------------------------------------------------------------------------

    def _step_buffers(self, tokens: int) -> tuple[torch.Tensor, ...]:
        """Per token count, reused: scratch (partial outputs), logits, ids, weights."""
        bufs = self._buffers.get(tokens)
        if bufs is None:
            c = self.config
            bufs = self._buffers[tokens] = (
                torch.empty(self.lib.dm_step_slices(self.pool.handle) * tokens * self.dp, dtype=torch.float32),
                torch.empty(tokens, c.num_experts, dtype=torch.float32),
                torch.empty(tokens, c.top_k, dtype=torch.int64),
                torch.empty(tokens, c.top_k, dtype=torch.float32),
            )
        return bufs

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        if self.dp == self.d and x.dtype == torch.float32 and x.dim() == 2 and x.is_contiguous():
            return x
        x = x.reshape(-1, self.d)
        if self.dp == self.d:
            return x.to(torch.float32).contiguous()
        out = torch.zeros(x.shape[0], self.dp, dtype=torch.float32)
        out[:, : self.d] = x
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Router logits [T, N] in float32 for tokens x [T, d]."""
        xp = self._padded(x)
        tokens = xp.shape[0]
        out = torch.empty(tokens, self.config.num_experts, dtype=torch.float32)
        # On this thread (pool None): the router is small, and a layer call's workers are
        # waking up meanwhile.
        code = self.lib.dm_router(
            None, self.desc.router_dtype, self.router.ptr, self.config.num_experts, self.dp, xp.data_ptr(), tokens,
            out.data_ptr(),
        )  # fmt: skip
        self._check(code, "router")
        if self.logit_bias is not None:  # as dm_layer_forward adds it: z = x Wr^T + b_z, fp32
            out += self.logit_bias
        return out

    def route(self, x: torch.Tensor) -> Routing:
        """The routing this path runs for tokens x [T, d] (native or deamoe_trt.routing's)."""
        logits = self.logits(x)
        if self.routing == "torch":
            return route_logits(logits, self.router_bias, self.config)
        return self.native_route(logits)

    def native_route(self, logits: torch.Tensor) -> Routing:
        """The kernel's routing of logits [T, N], as a deamoe_trt.routing.Routing."""
        c = self.config
        tokens = logits.shape[0]
        logits = logits.float().contiguous()
        ids = torch.empty(tokens, c.top_k, dtype=torch.int64)
        weights = torch.empty(tokens, c.top_k, dtype=torch.float32)
        kept = torch.empty(tokens, c.top_departments, dtype=torch.int64)
        scores = torch.empty(tokens, c.num_experts, dtype=torch.float32)
        code = self.lib.dm_route(
            self._desc_ref, logits.data_ptr(), tokens, ids.data_ptr(), weights.data_ptr(), kept.data_ptr(),
            scores.data_ptr(),
        )  # fmt: skip
        self._check(code, "route")
        return Routing(ids, weights, ids // c.experts_per_department, kept, scores)

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.shape[-1] != self.d:
            raise UsageError(f"hidden_states must have shape [..., {self.d}], got {list(hidden_states.shape)}")
        # Wake the workers first thing: a futex wake-up takes tens of microseconds in a VM,
        # which the preparation below and the router (on this thread) then hide.
        self.pool.wake()
        if self.routing == "torch":
            with _single_threaded_torch(), torch.inference_mode():
                xp = self._padded(hidden_states)
                y = torch.empty(xp.shape[0], self.d, dtype=torch.float32)
                routing = route_logits(self.logits(hidden_states), self.router_bias, self.config)
                self._run(xp, routing, y, self._step_buffers(xp.shape[0])[0])
                return y.to(hidden_states.dtype).reshape(hidden_states.shape)
        # Native routing: one call, and as little Python around it as possible (each PyTorch
        # call costs microseconds, tens when the caches are cold after streaming the weights).
        xp = self._padded(hidden_states)
        tokens = xp.shape[0]
        y = torch.empty(tokens, self.d, dtype=torch.float32)
        ptrs = self._buffer_ptrs.get(tokens) or self._make_buffers(tokens)
        code = self.lib.dm_layer_forward(self.pool.handle, self._desc_ref, xp.data_ptr(), tokens, y.data_ptr(), *ptrs)
        if code != 0:
            self._check(code, "forward")
        if hidden_states.dtype != torch.float32 or hidden_states.dim() != 2:
            y = y.to(hidden_states.dtype).reshape(hidden_states.shape)
        return y

    def _make_buffers(self, tokens: int) -> tuple[int, ...]:
        """dm_layer_forward's scratch, logits, ids and weights buffers for `tokens` tokens."""
        self._buffer_ptrs[tokens] = tuple(t.data_ptr() for t in self._step_buffers(tokens))
        return self._buffer_ptrs[tokens]

    def forward_routed(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """y [T, d] float32 for tokens x [T, d] given their routing (as DeaMoELayer.forward_routed)."""
        xp = self._padded(x)
        y = torch.empty(xp.shape[0], self.d, dtype=torch.float32)
        self._run(xp, routing, y, self._step_buffers(xp.shape[0])[0])
        return y

    def _run(self, xp: torch.Tensor, routing: Routing, y: torch.Tensor, scratch: torch.Tensor) -> None:
        ids = routing.expert_ids.to(torch.int64).contiguous()
        weights = routing.weights.to(torch.float32).contiguous()
        if ids.shape != (xp.shape[0], self.config.top_k):
            raise UsageError(f"routing has expert_ids of shape {list(ids.shape)}, expected [{xp.shape[0]}, top_k]")
        shared_w = None
        if self.shared_gate is not None:
            shared_w = torch.sigmoid(xp @ self.shared_gate).contiguous()
        code = self.lib.dm_moe_forward(
            self.pool.handle, self._desc_ref, xp.data_ptr(), xp.shape[0], ids.data_ptr(), weights.data_ptr(),
            _ptr(shared_w), y.data_ptr(), scratch.data_ptr(),
        )  # fmt: skip
        self._check(code, "forward")


class CpuDeaMoEStack:
    """A DeaMoEStack on the fast CPU path: x <- x + layer(x) for each layer in turn."""

    def __init__(self, stack: DeaMoEStack, *, threads: int | None = None, routing: str = "native"):
        self.layers = [CpuDeaMoE(layer, threads=threads, routing=routing) for layer in stack.layers]
        self.nbytes = sum(layer.nbytes for layer in self.layers)

    @classmethod
    def from_layers(cls, layers: list[CpuDeaMoE]) -> CpuDeaMoEStack:
        """A stack of layers already on the CPU path (packed one at a time, say, to keep the
        PyTorch copies from piling up)."""
        stack = cls.__new__(cls)
        stack.layers = list(layers)
        stack.nbytes = sum(layer.nbytes for layer in stack.layers)
        return stack

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        for layer in self.layers:
            x = x + layer(x)
        return x
