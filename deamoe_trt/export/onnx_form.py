"""The `onnx` form: standard ONNX ops only, for any runtime.

Routing as in routing_graph; then the departments' shared parts (per token: its g kept
departments, weighted by W_j) and the experts' private parts (its k experts, weighted by
w_e) each run through swiglu_graph.grouped_swiglu, which gathers the selected weights per
token while that is cheap (decoding) and runs every group densely otherwise, so the graph
is right and bounded in memory for any token count. A kept department that got no expert
has W_j = 0 and adds nothing, as the spec says (it is still computed in this form).
Biases and the clamped SwiGLU are swiglu_graph's; the router logit bias routing_graph's.

A quantized checkpoint's weights are stored as they are in the checkpoint (uint4 or uint8
codes, per-group scales) and dequantized in the graph by DequantizeLinear's blocked form
(opset 21, zero point 2^(bits-1)), which computes deamoe_trt.quant.dequantize exactly; the
rest of the graph is the float one. The language model's quantized projections outside the
FFNs (deamoe_trt.export.lm) go through the same `dequantized` in every form.
"""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from ..config import DeaMoEConfig
from ..errors import UsageError
from ..quant import QuantConfig, pack, zero_point
from .graph import GraphBuilder, check_opset
from .routing_graph import emit_routing, to_float32
from .swiglu_graph import grouped_swiglu, shared_experts

F32 = TensorProto.FLOAT


# DequantizeLinear's blocked quantization (block_size) is opset 21's.
QUANTIZED_MIN_OPSET = 21


def export_opset(form: str, opset: int | None, quant: QuantConfig | None, *, quantized_linears: bool = False) -> int:
    """The opset of an export (checked): a quantized model in the onnx form, and a language
    model with quantized projections outside its FFNs in any form (DequantizeLinear
    dequantizes them), need opset >= 21 and get it by default; everything else the given
    opset or the default one."""
    if quant is not None and (form == "onnx" or quantized_linears):
        what = "quantized attention/dense/head projections" if quantized_linears else "a quantized checkpoint"
        if opset is None:
            opset = QUANTIZED_MIN_OPSET
        elif opset < QUANTIZED_MIN_OPSET:
            raise UsageError(
                f"{what} in the {form} form need{'' if quantized_linears else 's'} opset >= {QUANTIZED_MIN_OPSET} "
                f"(DequantizeLinear with block_size), got {opset}"
            )
    return check_opset(opset)


def code_type(bits: int, signed: bool = False) -> int:
    """The element type of DequantizeLinear's codes: unsigned as the checkpoint's, or signed
    (tensor_codes)."""
    if signed:
        return TensorProto.INT4 if bits == 4 else TensorProto.INT8
    return TensorProto.UINT4 if bits == 4 else TensorProto.UINT8


def tensor_codes(codes: torch.Tensor, bits: int, signed: bool = False) -> np.ndarray:
    """Unsigned codes (uint8, any shape) as the bytes of a code_type(bits, signed) tensor of
    that shape: 4-bit codes packed two a byte over the flattened tensor, low nibble first (an
    odd count leaves the last high nibble 0), as ONNX packs uint4/int4 and the checkpoint
    packs each row.

    signed: codes q - 2^(bits-1) for runtimes whose DequantizeLinear takes no zero point
    (TensorRT's): flipping a code's top bit subtracts 2^(bits-1) modulo 2^bits."""
    flat = codes.reshape(-1).to(torch.uint8)
    if signed:
        flat = flat ^ zero_point(bits)
    if bits == 4 and flat.numel() % 2:
        flat = torch.cat((flat, flat.new_zeros(1)))
    return pack(flat, bits).numpy()


def emit(
    b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig, quant: QuantConfig | None = None
) -> str:
    """One layer; x [T, d] in the model's dtype -> output name [T, d] in the same dtype."""
    c = config
    if quant is not None:
        weights = dequantized(b, weights, quant)
    x32 = to_float32(b, x)
    routing = emit_routing(b, x32, weights, c)
    parts = []
    if c.shared_intermediate_size:
        kept_weights = b.op("GatherElements", [routing.department_weights, routing.kept_departments], axis=1)
        with b.scope("departments."):
            parts.append(
                grouped_swiglu(
                    b,
                    x,
                    weights["departments.gate_up"],
                    weights["departments.down"],
                    routing.kept_departments,
                    kept_weights,
                    groups=c.num_departments,
                    per_token=c.top_departments,
                    width=c.shared_intermediate_size,
                    hidden=c.hidden_size,
                    config=c,
                    gate_up_bias=weights.get("departments.gate_up_bias"),
                )
            )
    if c.private_intermediate_size:
        with b.scope("experts."):
            parts.append(
                grouped_swiglu(
                    b,
                    x,
                    weights["experts.gate_up"],
                    weights["experts.down"],
                    routing.expert_ids,
                    routing.weights,
                    groups=c.num_experts,
                    per_token=c.top_k,
                    width=c.private_intermediate_size,
                    hidden=c.hidden_size,
                    config=c,
                    gate_up_bias=weights.get("experts.gate_up_bias"),
                    down_bias=weights.get("experts.down_bias"),
                )
            )
    if c.has_shared_experts:
        parts.append(shared_experts(b, x, x32, weights, c))
    y = parts[0]
    for part in parts[1:]:
        y = b.op("Add", [y, part])
    return b.cast(y, b.dtype.onnx) if b.dtype.onnx != F32 else y


def dequantized(
    b: GraphBuilder, weights: dict[str, str], quant: QuantConfig, *, signed: bool = False, axis: int = -1
) -> dict[str, str]:
    """weights with every quantized weight's codes and scales replaced by its dequantized value.

    signed: the codes are tensor_codes(..., signed=True) (no zero-point input), else unsigned
    with the zero point 2^(bits-1) as an input. axis: the one along which groups of
    group_size codes share a scale (the input columns: last as the checkpoint stores weights)."""
    out = {name: value for name, value in weights.items() if not name.endswith((".qweight", ".scales"))}
    for name in weights:
        if not name.endswith(".qweight"):
            continue
        base = name.removesuffix(".qweight")
        shape = list(b.initializers[weights[f"{base}.scales"]].dims)
        zero_points = [] if signed else [_zero_points(b, weights[name], shape, quant.bits)]
        out[base] = b.op(
            "DequantizeLinear",
            [weights[name], weights[f"{base}.scales"], *zero_points],
            axis=axis % len(shape),
            block_size=quant.group_size,
        )
    return out


def _zero_points(b: GraphBuilder, codes_name: str, shape: list[int], bits: int) -> str:
    """The implicit zero point 2^(bits-1) as DequantizeLinear's blocked zero-point tensor."""
    codes = torch.full(shape, zero_point(bits), dtype=torch.uint8)
    name = f"{codes_name.removesuffix('.qweight')}.zero_point"
    return b.add_initializer(name, tensor_codes(codes, bits), code_type(bits), shape)
