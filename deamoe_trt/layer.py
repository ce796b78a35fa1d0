"""The PyTorch reference of the DeaMoE layer: the source of truth for every other runtime."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TypeVar, cast

import torch
from torch import nn

from .activation import swiglu
from .checkpoint import (
    CONFIG_FILE,
    DTYPES,
    WEIGHTS_FILE,
    check_tensors,
    layer_tensors,
    read_header,
    read_tensors,
    stack_header,
    write_files,
)
from .config import DeaMoEConfig
from .dtypes import TORCH_DTYPES
from .errors import CheckpointError, UsageError
from .quant import QuantConfig, QuantizedWeight, dense
from .routing import Routing, route_logits, router_logits

SUPPORTED_DTYPES = TORCH_DTYPES
M = TypeVar("M", bound=nn.Module)


def unwrapped(module: M) -> M:
    """module, or the module a wrapper holds (PEFT's adapters wrap the router and the experts
    and do not pass their attributes through)."""
    base = getattr(module, "get_base_layer", None)
    return module if base is None else cast(M, base())


class Router(nn.Module):
    """Router weight [N, d] and optional selection bias [N], with their own precision
    (spec, "Router precision"): the bias is always float32; a float32 weight stays float32
    when the layer is converted to another dtype (as transformers' _keep_in_fp32_modules
    keeps DeepSeek-V3's gate), any other weight follows the layer."""

    def __init__(self, config: DeaMoEConfig, *, dtype: torch.dtype, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, dtype=dtype, device=device))
        # Selection-only bias (DeepSeek-V3's e_score_correction_bias): it picks, never weighs.
        self.bias = (
            nn.Parameter(torch.empty(config.num_experts, dtype=torch.float32, device=device))
            if config.router_bias
            else None
        )
        # Logit bias (gpt-oss's router bias): z = x Wr^T + b_z, so it weighs as well as picks.
        self.logit_bias = (
            nn.Parameter(torch.empty(config.num_experts, dtype=torch.float32, device=device))
            if config.router_logit_bias
            else None
        )

    def _apply(self, fn, recurse=True):
        kept = {
            name: p.data
            for name, p in self.named_parameters()
            if p.dtype == torch.float32 or name in ("bias", "logit_bias")
        }
        super()._apply(fn, recurse)
        for name, before in kept.items():
            param = getattr(self, name)
            if param.dtype != before.dtype:  # a dtype conversion: keep the original values, moved
                param.data = before.to(device=param.device, dtype=torch.float32)
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The router logits of hidden [..., d] (what DeaMoELayer.route routes)."""
        return router_logits(hidden, self.weight, self.logit_bias)

    def cast_weight(self, dtype: torch.dtype) -> None:
        """Store the weight in dtype (the one way to narrow a float32 router)."""
        self.weight.data = self.weight.data.to(dtype)


def _ffn_weight(shape, quant: QuantConfig | None, **factory):
    """A float Parameter, or a QuantizedWeight (the spec's weight-only quantization)."""
    if quant is None:
        return nn.Parameter(torch.empty(shape, **factory))
    return QuantizedWeight(shape, quant, **factory)


def _bias(shape, wanted: bool, **factory) -> nn.Parameter | None:
    """An optional bias in the layer's dtype; biases are never quantized (spec, "Biased experts")."""
    return nn.Parameter(torch.empty(shape, **factory)) if wanted else None


class GroupedSwiGLU(nn.Module):
    """Stacked SwiGLU weights: gate_up [G, 2*f, d] (gate rows, then up rows), down [G, d, f];
    optional gate_up_bias [G, 2*f] and down_bias [G, d].

    Quantized (quant given), each weight is a QuantizedWeight: indexing a group dequantizes it."""

    def __init__(
        self,
        config: DeaMoEConfig,
        groups: int,
        width: int,
        *,
        down_bias: bool = False,
        quant: QuantConfig | None = None,
        **factory,
    ):
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.gate_up = _ffn_weight((groups, 2 * width, hidden), quant, **factory)
        self.down = _ffn_weight((groups, hidden, width), quant, **factory)
        self.gate_up_bias = _bias((groups, 2 * width), config.ffn_bias, **factory)
        self.down_bias = _bias((groups, hidden), config.ffn_bias and down_bias, **factory)

    def forward_group(self, index: int, x: torch.Tensor, *, with_down_bias: bool = True) -> torch.Tensor:
        return self._group(self.gate_up, self.down, index, x, with_down_bias)

    def forward(self, x: torch.Tensor, groups: list[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        """forward_group of each (group, token rows of x) pair, in one call: a wrapper that adapts
        the weights for the duration of a call (PEFT's target_parameters) then adapts them once
        per layer, not once per group."""
        gate_up, down = self.gate_up, self.down  # read once: an adapted weight is computed at each read
        return [self._group(gate_up, down, index, x[rows], True) for index, rows in groups]

    def _group(self, gate_up, down, index: int, x: torch.Tensor, with_down_bias: bool) -> torch.Tensor:
        return swiglu(
            x,
            gate_up[index],
            down[index],
            self.config,
            gate_up_bias=None if self.gate_up_bias is None else self.gate_up_bias[index],
            down_bias=None if self.down_bias is None or not with_down_bias else self.down_bias[index],
        )


class SharedExperts(nn.Module):
    """Always-on experts: ungated (DeepSeek) or gated by sigmoid(x . gate) (Qwen2-MoE)."""

    def __init__(self, config: DeaMoEConfig, *, quant: QuantConfig | None = None, **factory):
        super().__init__()
        width = config.shared_expert_intermediate_size
        self.gate_up = _ffn_weight((2 * width, config.hidden_size), quant, **factory)
        self.down = _ffn_weight((config.hidden_size, width), quant, **factory)
        # The gate is a routing-like vector of d values: never quantized.
        self.gate = nn.Parameter(torch.empty(1, config.hidden_size, **factory)) if config.shared_expert_gate else None
        self.gate_up_bias = _bias((2 * width,), config.ffn_bias, **factory)
        self.down_bias = _bias((config.hidden_size,), config.ffn_bias, **factory)
        self.config = config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Gated output in float32."""
        out = swiglu(
            x,
            dense(self.gate_up),
            dense(self.down),
            self.config,
            gate_up_bias=self.gate_up_bias,
            down_bias=self.down_bias,
        ).float()
        gate = self.gate_values(x)
        return out if gate is None else out * gate

    def gate_values(self, x: torch.Tensor) -> torch.Tensor | None:
        """a = sigmoid(x . gate) per token, [T, 1] float32; None when ungated (a = 1)."""
        return None if self.gate is None else torch.sigmoid(x.float() @ self.gate.float().t())


def check_quantizable(config: DeaMoEConfig, quant: QuantConfig) -> None:
    """Every quantized weight's input width must be a whole number of groups."""
    quant.check_width("the hidden size d", config.hidden_size)
    for what, width in (
        ("the shared part (f_s)", config.shared_intermediate_size),
        ("the private part (f_p)", config.private_intermediate_size),
        ("the shared experts (f_sh)", config.shared_expert_intermediate_size),
    ):
        if width:
            quant.check_width(what, width)


class DeaMoELayer(nn.Module):
    """One DeaMoE layer. Its state_dict holds exactly the spec's canonical tensors.

    Parts of width 0 are absent (departments when f_s = 0, experts when f_p = 0,
    shared_experts when f_sh = 0) rather than stored as empty tensors.

    With `quant`, the FFN weights (departments, experts, shared experts) are stored
    quantized (deamoe_trt.quant) and dequantized exactly when run; the router and the
    shared-expert gate stay in `dtype`.
    """

    def __init__(
        self,
        config: DeaMoEConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device=None,
        router_dtype: torch.dtype | None = None,
        quant: QuantConfig | None = None,
    ):
        super().__init__()
        if dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        router_dtype = dtype if router_dtype is None else router_dtype
        if router_dtype not in (dtype, torch.float32):
            raise UsageError(f"router_dtype must be float32 or the layer's dtype ({dtype}), got {router_dtype}")
        factory = {"dtype": dtype, "device": device}
        self.config = config
        self.quant = quant
        c = config
        if quant is not None:
            check_quantizable(c, quant)
        self.router = Router(c, dtype=router_dtype, device=device)
        # Departments have no down bias: each expert keeps its own (spec, "Biased experts").
        self.departments = (
            GroupedSwiGLU(c, c.num_departments, c.shared_intermediate_size, quant=quant, **factory)
            if c.shared_intermediate_size
            else None
        )
        self.experts = (
            GroupedSwiGLU(c, c.num_experts, c.private_intermediate_size, down_bias=True, quant=quant, **factory)
            if c.private_intermediate_size
            else None
        )
        self.shared_experts = SharedExperts(c, quant=quant, **factory) if c.has_shared_experts else None

    # Construction ----------------------------------------------------------------------

    @classmethod
    def random(
        cls,
        config: DeaMoEConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device=None,
        low_memory: bool = False,
    ) -> DeaMoELayer:
        """A randomly initialised layer whose routing is spread and outputs well-conditioned.

        The weights are drawn in float32 and converted; low_memory draws them straight into
        dtype one [rows, cols] slice at a time instead (same distribution, other values), for
        layers whose float32 copy would not fit in memory beside them. The router weight is
        in dtype too (the selection bias, as always, float32).
        """
        if low_memory:
            layer = cls(config, dtype=dtype, device=device)
            layer.reset_parameters(seed, sliced=True)
            return layer
        layer = cls(config, dtype=torch.float32, device=device)
        layer.reset_parameters(seed)
        layer.router.cast_weight(dtype)
        return layer.to(dtype)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0, *, sliced: bool = False) -> None:
        """Scaled normal init: unit-variance inputs give logits and outputs of order one.

        Router rows of norm ~1 keep softmax scores spread over experts instead of
        collapsing on one; down projections scaled by 1/sqrt(width) keep each expert's
        output at the input's scale. sliced: draw each [rows, cols] slice separately (no
        float32 copy of a whole tensor).
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        device_gens: dict[torch.device, torch.Generator] = {}
        c = self.config

        def normal_(param: torch.Tensor, fan_in: int) -> None:
            if param.device.type != "cpu":
                # Drawn in place on the accelerator: a multi-GB layer (deepseek-v3-layer) would
                # take minutes through the CPU. Same distribution, other values.
                if param.device not in device_gens:
                    device_gens[param.device] = torch.Generator(device=param.device).manual_seed(seed)
                param.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=device_gens[param.device])
                return
            parts = param.view(-1, *param.shape[-2:]) if sliced and param.dim() >= 2 else [param]
            for part in parts:
                part.copy_(torch.randn(part.shape, generator=gen) / math.sqrt(fan_in))

        normal_(self.router.weight, c.hidden_size)
        if self.router.bias is not None:
            self.router.bias.copy_(0.02 * torch.randn(self.router.bias.shape, generator=gen))
        if self.router.logit_bias is not None:
            self.router.logit_bias.copy_(0.5 * torch.randn(self.router.logit_bias.shape, generator=gen))
        for part, width in (
            (self.departments, c.shared_intermediate_size),
            (self.experts, c.private_intermediate_size),
            (self.shared_experts, c.shared_expert_intermediate_size),
        ):
            if part is None:
                continue
            normal_(part.gate_up, c.hidden_size)
            # Shared and private parts add up to one expert: scale by the expert's width.
            normal_(part.down, c.expert_intermediate_size if part is not self.shared_experts else width)
            if getattr(part, "gate", None) is not None:
                normal_(part.gate, c.hidden_size)
            # Biases of order 0.1 of a pre-activation: large enough that every backend's
            # handling of them is visible in its outputs.
            for bias in (part.gate_up_bias, part.down_bias):
                if bias is not None:
                    bias.copy_(0.1 * torch.randn(bias.shape, generator=gen).to(bias.dtype))

    @property
    def dtype(self) -> torch.dtype:
        """The FFN weights' dtype (the router keeps its own: router_dtype)."""
        part = self.departments if self.departments is not None else self.experts
        return unwrapped(cast(GroupedSwiGLU, part)).gate_up.dtype

    @property
    def router_dtype(self) -> torch.dtype:
        return unwrapped(self.router).weight.dtype

    # Forward --------------------------------------------------------------------------

    def route(self, hidden_states: torch.Tensor) -> Routing:
        # route() is route_logits(router_logits(...)); the logits come from the router's forward
        # so that a wrapper of the router (PEFT's target_parameters) adapts them.
        return route_logits(self.router(hidden_states), unwrapped(self.router).bias, self.config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = self._check_input(hidden_states)
        x = hidden_states.reshape(-1, self.config.hidden_size)
        out = self.forward_routed(x, self.route(x))
        return out.to(hidden_states.dtype).reshape(shape)

    def forward_routed(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """y for tokens x [T, d] given their routing, float32.

        Each department's shared part and each expert's private part runs once, on the
        tokens that use it, as the load-once kernels do.
        """
        c = self.config
        xw = x.to(self.dtype)
        out = torch.zeros(x.shape[0], c.hidden_size, dtype=torch.float32, device=x.device)
        if self.departments is not None:
            department_weights = routing.department_weights(c.num_departments)
            used = [(j, *routing.department_tokens(j, department_weights)) for j in routing.used_departments().tolist()]
            ys = self.departments(xw, [(j, tokens) for j, tokens, _ in used])
            for (_, tokens, weights), y in zip(used, ys, strict=True):
                out.index_add_(0, tokens, y.float() * weights[:, None])
        if self.experts is not None:
            used = [(e, *routing.expert_tokens(e)) for e in routing.used_experts().tolist()]
            ys = self.experts(xw, [(e, tokens) for e, tokens, _ in used])
            for (_, tokens, weights), y in zip(used, ys, strict=True):
                out.index_add_(0, tokens, y.float() * weights[:, None])
        if self.shared_experts is not None:
            out += self.shared_experts(xw)
        return out

    def _check_input(self, hidden_states: torch.Tensor) -> torch.Size:
        d = self.config.hidden_size
        if hidden_states.dim() < 1 or hidden_states.shape[-1] != d:
            raise UsageError(f"hidden_states must have shape [..., {d}], got {list(hidden_states.shape)}")
        if hidden_states.dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"hidden_states must be float32, float16 or bfloat16, got {hidden_states.dtype}")
        if not bool(torch.isfinite(hidden_states).all()):
            raise UsageError("hidden_states contains NaN or Inf")
        return hidden_states.shape

    # Related layers ---------------------------------------------------------------------

    @torch.no_grad()
    def expanded(self) -> DeaMoELayer:
        """Same routing and outputs, every department's shared neurons copied into each of
        its experts (f_s = 0): the layer without sharing, to show what sharing saves."""
        c = self.config
        twin = DeaMoELayer(
            c.expanded(),
            dtype=self.dtype,
            device=self.router.weight.device,
            router_dtype=self.router_dtype,
            quant=self.quant,
        )
        twin.router.load_state_dict(self.router.state_dict())
        if self.quant is None:
            gate_up, down = self._expert_weights(lambda w: w)
            twin.experts.gate_up.copy_(gate_up)
            twin.experts.down.copy_(down)
        else:
            # Rows are quantized independently along their inputs and every width is a whole
            # number of groups, so the twin's codes and scales are the parts' laid side by side.
            for field in ("qweight", "scales"):
                gate_up, down = self._expert_weights(lambda w, field=field: getattr(w, field))
                getattr(twin.experts.gate_up, field).copy_(gate_up)
                getattr(twin.experts.down, field).copy_(down)
        if c.ffn_bias:
            twin.experts.gate_up_bias.copy_(self._expert_gate_up_bias())
            twin.experts.down_bias.copy_(self.experts.down_bias)
        if self.shared_experts is not None:
            twin.shared_experts.load_state_dict(self.shared_experts.state_dict())
        return twin

    def _expert_gate_up_bias(self) -> torch.Tensor:
        """Every expert's gate/up biases as one block of width f_s + f_p ([N, 2f]), laid out as
        _expert_weights lays out its rows: gate (shared, private), then up (shared, private)."""
        c = self.config
        gates, ups = [], []
        if self.departments is not None:
            gate, up = self.departments.gate_up_bias.repeat_interleave(c.experts_per_department, dim=0).chunk(2, dim=1)
            gates.append(gate)
            ups.append(up)
        gate, up = self.experts.gate_up_bias.chunk(2, dim=1)
        return torch.cat([*gates, gate, *ups, up], dim=1)

    @torch.no_grad()
    def vanilla(self) -> DeaMoELayer:
        """The one-stage top-k MoE of the same experts and router (what users run today).

        Its routing differs from this layer's, so its outputs do too."""
        twin = self.expanded()
        vanilla = DeaMoELayer(
            self.config.vanilla(),
            dtype=self.dtype,
            device=self.router.weight.device,
            router_dtype=self.router_dtype,
            quant=self.quant,
        )
        vanilla.load_state_dict(twin.state_dict())
        return vanilla

    def _expert_weights(self, tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert as one SwiGLU block of width f_s + f_p: gate_up [N, 2f, d], down [N, d, f].

        tensor(weight) picks what is laid out: the weight itself, or a quantized weight's
        codes or scales (their last dimension is the input's, packed or grouped)."""
        c = self.config
        gates, ups, downs = [], [], []
        if self.departments is not None:
            per_expert = tensor(self.departments.gate_up).repeat_interleave(c.experts_per_department, dim=0)
            gate, up = per_expert.chunk(2, dim=1)
            gates.append(gate)
            ups.append(up)
            downs.append(tensor(self.departments.down).repeat_interleave(c.experts_per_department, dim=0))
        if self.experts is not None:
            gate, up = tensor(self.experts.gate_up).chunk(2, dim=1)
            gates.append(gate)
            ups.append(up)
            downs.append(tensor(self.experts.down))
        return torch.cat(gates + ups, dim=1), torch.cat(downs, dim=2)

    @torch.no_grad()
    def quantized(self, quant: QuantConfig, *, clip: dict[str, torch.Tensor] | None = None) -> DeaMoELayer:
        """This layer with its FFN weights quantized (round to nearest); router and gate kept.

        clip: per weight name ("experts.down", ...) the per-(row, group) ratios of max|w| its
        scales cover (deamoe_trt.quantize.awq's clipping search); absent names are plain round to
        nearest. Method "awq" is deamoe_trt.quantize.awq.quantize_awq, which calls this with them."""
        if self.quant is not None:
            raise UsageError(
                f"the layer is already quantized ({self.quant.bits}-bit, group size {self.quant.group_size}); "
                "quantize the floating-point checkpoint instead"
            )
        if quant.method != "rtn" and clip is None:
            raise UsageError(
                f"method {quant.method!r} needs calibration tokens: use deamoe_trt.quantize.awq.quantize_awq "
                "(deamoe-trt quantize --method awq --calibration FILE)"
            )
        clip = clip or {}
        out = DeaMoELayer(
            self.config, dtype=self.dtype, device=self.router.weight.device, router_dtype=self.router_dtype, quant=quant
        )
        out.router.load_state_dict(self.router.state_dict())
        for name in ("departments", "experts", "shared_experts"):
            source, target = getattr(self, name), getattr(out, name)
            if source is None:
                continue
            target.gate_up.set_from(source.gate_up, clip.get(f"{name}.gate_up"))
            target.down.set_from(source.down, clip.get(f"{name}.down"))
            for kept in ("gate", "gate_up_bias", "down_bias"):  # never quantized
                if getattr(source, kept, None) is not None:
                    getattr(target, kept).copy_(getattr(source, kept))
        return out

    # Checkpoints --------------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path) -> Path:
        return DeaMoEStack.from_layers([self]).save_pretrained(directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, layer: int | None = None, device=None) -> DeaMoELayer:
        stack = DeaMoEStack.from_pretrained(directory, device=device)
        if layer is None:
            if len(stack.layers) != 1:
                raise UsageError(
                    f"{directory} holds {len(stack.layers)} layers; pass layer=<index> or load it as DeaMoEStack"
                )
            layer = 0
        if not 0 <= layer < len(stack.layers):
            raise UsageError(f"layer {layer} is out of range: {directory} holds {len(stack.layers)} layers")
        return cast(DeaMoELayer, stack.layers[layer])


class DeaMoEStack(nn.Module):
    """Layers of one config applied in turn with a residual connection: x <- x + layer(x).

    The FFN part of a decoder, without attention: what a multi-layer checkpoint holds and
    what multi-layer exports and benchmarks run."""

    source: dict  # where an imported stack came from (importers.hf sets it)

    def __init__(
        self,
        config: DeaMoEConfig,
        num_layers: int,
        *,
        dtype: torch.dtype = torch.float32,
        device=None,
        router_dtype: torch.dtype | None = None,
        quant: QuantConfig | None = None,
    ):
        super().__init__()
        if num_layers < 1:
            raise UsageError(f"num_layers must be >= 1, got {num_layers}")
        self.config = config
        self.layers = nn.ModuleList(
            DeaMoELayer(config, dtype=dtype, device=device, router_dtype=router_dtype, quant=quant)
            for _ in range(num_layers)
        )

    @classmethod
    def from_layers(cls, layers: list[DeaMoELayer]) -> DeaMoEStack:
        configs = {(layer.config, layer.quant) for layer in layers}
        if len(configs) != 1:
            raise UsageError("all layers of a stack must share one config (and quantization)")
        stack = cls.__new__(cls)
        nn.Module.__init__(stack)
        stack.config = layers[0].config
        stack.layers = nn.ModuleList(layers)
        return stack

    @classmethod
    def random(
        cls, config: DeaMoEConfig, num_layers: int, *, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> DeaMoEStack:
        return cls.from_layers([DeaMoELayer.random(config, seed=seed + i, dtype=dtype) for i in range(num_layers)])

    @property
    def dtype(self) -> torch.dtype:
        return cast(DeaMoELayer, self.layers[0]).dtype

    @property
    def quant(self) -> QuantConfig | None:
        return cast(DeaMoELayer, self.layers[0]).quant

    def quantized(self, quant: QuantConfig) -> DeaMoEStack:
        return DeaMoEStack.from_layers([layer.quantized(quant) for layer in self.layers])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        for layer in self.layers:
            x = x + layer(x)
        return x

    def expanded(self) -> DeaMoEStack:
        return DeaMoEStack.from_layers([layer.expanded() for layer in self.layers])

    def vanilla(self) -> DeaMoEStack:
        return DeaMoEStack.from_layers([layer.vanilla() for layer in self.layers])

    def save_pretrained(self, directory: str | Path, *, source: dict | None = None) -> Path:
        """Write the checkpoint (checkpoint.py's format); each file appears whole or not at all.

        source defaults to where the stack came from (importers.hf sets .source)."""
        tensors = {
            f"layers.{i}.{name}": tensor.detach().to("cpu").contiguous()
            for i, layer in enumerate(self.layers)
            for name, tensor in layer.state_dict().items()
        }
        router_dtypes = {layer.router_dtype for layer in self.layers}
        if len(router_dtypes) != 1:
            raise UsageError("all layers of a stack must keep their router weights in one dtype")
        if source is None:
            source = getattr(self, "source", None)
        header = stack_header(self.config, len(self.layers), self.dtype, router_dtypes.pop(), self.quant, source)
        return write_files(directory, tensors, header)

    @classmethod
    def from_pretrained(cls, directory: str | Path, *, device=None) -> DeaMoEStack:
        """Read a checkpoint written by save_pretrained, checking every tensor against its config."""
        directory = Path(directory)
        header = read_header(directory)
        config: DeaMoEConfig = header["config"]
        dtype, router_dtype = DTYPES[header["dtype"]], DTYPES[header["router_dtype"]]
        quant = header["quantization"]
        try:
            stack = cls(
                config, header["num_layers"], dtype=dtype, device="meta", router_dtype=router_dtype, quant=quant
            )
        except UsageError as exc:
            raise CheckpointError(f"{directory / CONFIG_FILE}: {exc}") from None
        expected = {
            f"layers.{i}.{name}": tensor
            for i, layer in enumerate(stack.layers)
            for name, tensor in layer.state_dict().items()
        }
        tensors = read_tensors(directory / WEIGHTS_FILE)
        check_tensors(tensors, expected, header["dtype"], directory / WEIGHTS_FILE)
        layers = []
        for i in range(header["num_layers"]):
            layer = DeaMoELayer(config, dtype=dtype, device="meta", router_dtype=router_dtype, quant=quant)
            layer.load_state_dict(layer_tensors(tensors, i), assign=True)
            layers.append(layer.to(device) if device is not None else layer)
        return cls.from_layers(layers)
