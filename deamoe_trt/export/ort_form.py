"""The `ort` form: stock ONNX Runtime (CPU and CUDA EP), experts run by com.microsoft.MoE.

Routing is the spec's (routing_graph) in standard ops. The experts then run as two MoE ops:
the departments' shared parts (num experts = D, k = g) and the experts' private parts
(num experts = N, k = k). MoE takes router values, not weights, and applies its own softmax
and top-k to them; so each op gets log(w / max w) for the chosen entries and -inf for the
rest: its softmax returns w / sum(w), its top-k finds exactly the chosen entries (an entry
of weight 0 gets -inf and contributes 0 whichever way ties fall), and scaling its output
by sum(w) restores the spec's weights. Shared experts are plain Gemms.

A plain vanilla MoE (one department, no shared part, softmax, no bias, no scaling) uses
the op's own routing instead: router logits straight into MoE with k = top_k and
normalize_routing_weights = norm_topk_prob. That is "the MoE users run today on ONNX
Runtime", the benchmark's anchor. Its softmax runs on logits in the model's dtype and its
top-k breaks ties towards the higher index (the spec: lower), so it can differ from the
reference on exact ties or fp16 near-ties; validation measures it like any other model.

A quantized checkpoint (deamoe_trt.quant) runs through com.microsoft.QMoE instead, with the
same routing values: its codes and scales go in as the checkpoint stores them (QMoE's
packing: [experts, rows, cols * bits / 8] uint8, implicit zero point 2^(bits-1), one scale
per block_size columns), gate/up rows interleaved like the float weights. The shared
experts become a QMoE of one expert whose router value is 0 (weight exactly 1), so their
int4/int8 weights stay packed too. ONNX Runtime 1.32's CPU QMoE keeps float activations for
4-bit blocks but quantizes activations to int8 for 8-bit blocks (its documented behaviour),
so int8 models differ from the dequantized reference by about 1% of the output's scale
there; validation checks them at that tolerance and says so.

Biased experts and the clamped SwiGLU (gpt-oss) run in the same ops, exactly: the gate/up
biases are their fc1 biases (interleaved like the rows), the experts' down biases their fc2
biases (added before the routing weight, the spec's w_e * b_e), and the activation their
SwiGLU attributes (moe_attributes). The router logit bias is the router Gemm's C input.

Needs an ONNX Runtime whose MoE takes weights as [experts, out, in] (1.23 and later) and,
on the CUDA EP, one that honours the SwiGLU attributes below: older CUDA kernels ignore
them and apply GPT-OSS's alpha 1.702 / beta 1 / clamp 7 (microsoft/onnxruntime#28738),
which `deamoe-trt validate --provider cuda` would show as a large error.
"""

from __future__ import annotations

import math

import torch
from onnx import TensorProto

from ..config import DeaMoEConfig
from ..quant import QuantConfig
from .graph import GraphBuilder
from .routing_graph import dense_weights, emit_routing, router_logits, to_float32
from .swiglu_graph import gate_shared_experts, shared_experts

F32 = TensorProto.FLOAT
MOE_DOMAIN = "com.microsoft"


def moe_attributes(k: int, normalize: bool, config: DeaMoEConfig | None = None) -> dict:
    """Every attribute of com.microsoft.MoE that changes the result, set to the layer's SwiGLU.

    The op computes min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, -limit, limit)
    + beta) per neuron, after its fc1 bias: exactly the spec's activations. Plain SwiGLU
    (silu(gate) * up) is alpha 1 (the sigmoid's slope), beta 0 (no +1 on up), no clamp
    (limit +inf); the clamped SwiGLU is the config's alpha and limit with beta 1 (gpt-oss).
    Gate/up are interleaved per row (the only layout the CPU kernel takes: swiglu_fusion=1).
    Set explicitly because CUDA builds default to GPT-OSS values.
    """
    clamped = config is not None and config.activation == "swiglu_clamped"
    return {
        "k": k,
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "activation_alpha": config.swiglu_alpha if clamped else 1.0,
        "activation_beta": 1.0 if clamped else 0.0,
        "swiglu_limit": config.swiglu_limit if clamped else math.inf,
        "normalize_routing_weights": int(normalize),
        "use_sparse_mixer": 0,
    }


def is_vanilla(config: DeaMoEConfig) -> bool:
    """A one-stage top-k MoE that MoE's own routing reproduces (up to ties)."""
    c = config
    return (
        c.num_departments == 1
        and c.shared_intermediate_size == 0
        and c.score_func == "softmax"
        and not c.router_bias
        and c.routed_scaling_factor == 1.0
    )


def emit(
    b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig, quant: QuantConfig | None = None
) -> str:
    """One layer; x [T, d] in the model's dtype -> output name [T, d] in the same dtype."""
    c = config
    x32 = to_float32(b, x)
    parts = []
    if is_vanilla(c):
        logits = router_logits(b, x32, weights["router.weight"], weights.get("router.logit_bias"))
        probs = b.cast(logits, b.dtype.onnx)
        parts.append(_moe(b, x, probs, weights, "experts", c.top_k, c.norm_topk_prob, quant, c))
        # MoE gives 0 for a token whose router values hold NaN; the spec's math gives NaN
        # (deamoe_trt.routing, "Non-finite tokens"). z - z is 0 for finite logits, NaN
        # otherwise: adding its row sum passes a non-finite token on and changes no other.
        parts.append(b.reduce("ReduceSum", b.op("Sub", [logits, logits]), [1], keepdims=True))
    else:
        routing = emit_routing(b, x32, weights, c)
        total = b.reduce("ReduceSum", routing.weights, [1], keepdims=True)  # sum(w) = sum(W)
        if c.shared_intermediate_size:
            values = _log_ratio(b, routing.department_weights)
            out = _moe(b, x, values, weights, "departments", c.top_departments, False, quant, c)
            parts.append(b.op("Mul", [out, total]))
        if c.private_intermediate_size:
            full = dense_weights(b, routing.expert_ids, routing.weights, b.op("Shape", [routing.logits]))
            out = _moe(b, x, _log_ratio(b, full), weights, "experts", c.top_k, False, quant, c)
            parts.append(b.op("Mul", [out, total]))
    if c.has_shared_experts and quant is None:
        parts.append(shared_experts(b, x, x32, weights, c))
    elif c.has_shared_experts:
        # One expert, router value 0: QMoE's softmax gives it weight exactly 1.
        zeros = b.op("Mul", [b.slice(x, 1, 0, 1), b.const([0.0], b.dtype.onnx)])
        out = _moe(b, x, zeros, weights, "shared_experts", 1, False, quant, c)
        parts.append(gate_shared_experts(b, out, x32, weights, c))
    y = parts[0]
    for part in parts[1:]:
        y = b.op("Add", [y, part])
    return b.cast(y, b.dtype.onnx) if b.dtype.onnx != F32 else y


def _log_ratio(b: GraphBuilder, dense: str) -> str:
    """log(w / max w) per row of a [T, G] float32 weight matrix, in the model's dtype: 0 -> -inf.

    Dividing by the row's max keeps the values near 0, where fp16 is most precise; a row of
    all zeros (every weight underflowed) divides by a tiny floor instead of 0."""
    row_max = b.op("Max", [b.reduce("ReduceMax", dense, [1], keepdims=True), b.scalar(1e-30)])
    return b.cast(b.op("Log", [b.op("Div", [dense, row_max])]), b.dtype.onnx)


def _moe(
    b: GraphBuilder,
    x: str,
    router_values: str,
    weights: dict[str, str],
    part: str,
    k: int,
    normalize: bool,
    quant: QuantConfig | None = None,
    config: DeaMoEConfig | None = None,
) -> str:
    """MoE (QMoE when quantized) over one part's stacked SwiGLU blocks -> [T, d] float32.

    Biases go in as the op's fc1 bias (gate/up, interleaved like the rows) and fc2 bias
    (down, added to each expert's output before its routing weight, as the spec's w_e * b_e)."""
    fc1_bias, fc2_bias = _biases(b, weights, part)
    attributes = moe_attributes(k, normalize, config)
    if quant is not None:
        out = b.op(
            "QMoE",
            [
                x,
                router_values,
                weights[f"{part}.gate_up.qweight"],
                weights[f"{part}.gate_up.scales"],
                fc1_bias,
                weights[f"{part}.down.qweight"],
                weights[f"{part}.down.scales"],
                *([fc2_bias] if fc2_bias else []),
            ],
            domain=MOE_DOMAIN,
            name=f"{part}_QMoE",
            expert_weight_bits=quant.bits,
            block_size=quant.group_size,
            **attributes,
        )
        return to_float32(b, out)
    inputs = [x, router_values, weights[f"{part}.gate_up"], fc1_bias, weights[f"{part}.down"]]
    out = b.op(
        "MoE",
        inputs + ([fc2_bias] if fc2_bias else []),
        domain=MOE_DOMAIN,
        name=f"{part}_MoE",
        **attributes,
    )
    return to_float32(b, out)


def _biases(b: GraphBuilder, weights: dict[str, str], part: str) -> tuple[str, str]:
    """(fc1 bias, fc2 bias) of one part's op, "" where absent. The routed parts' gate/up
    biases are stored interleaved (WEIGHT_LAYOUTS); the shared experts', read canonically by
    their float Gemms, are interleaved here for their one-expert QMoE (2*f_sh values)."""
    fc1 = weights.get(f"{part}.gate_up_bias", "")
    fc2 = weights.get(f"{part}.down_bias", "")
    if part == "shared_experts" and fc1:
        pairs = b.op("Transpose", [b.reshape(fc1, [2, -1])])  # [f, 2]: gate i, up i
        fc1 = b.reshape(pairs, [1, -1])
        fc2 = b.unsqueeze(fc2, [0])
    return fc1, fc2


def interleaved_gate_up(gate_up: torch.Tensor) -> tuple[str, torch.Tensor, tuple[int, int, int]]:
    """[G, 2f, d] gate rows then up rows -> rows g0, u0, g1, u1, ... (MoE's swiglu_fusion=1).

    Stored so at export, under "<name>.interleaved" (layer_graph.emit_layer), rather than
    re-laid out by nodes in the graph: ONNX Runtime 1.32 does not constant-fold a Transpose
    of a weight this large (1.6 GB for the qwen3 layer's experts) and would transpose all of
    it on every run (118 ms a step instead of 7). Returned as a [G, f, 2, d] view, written
    in C order when serialised, so no interleaved copy is ever held."""
    groups, rows, hidden = gate_up.shape
    paired = gate_up.view(groups, 2, rows // 2, hidden).transpose(1, 2)
    return "interleaved", paired, (groups, rows, hidden)


def interleaved_gate_up_bias(bias: torch.Tensor) -> tuple[str, torch.Tensor, tuple[int, int]]:
    """[G, 2f] gate entries then up entries -> g0, u0, g1, u1, ... (the interleaved rows' biases)."""
    groups, entries = bias.shape
    return "interleaved", bias.view(groups, 2, entries // 2).transpose(1, 2), (groups, entries)


def one_expert(weight: torch.Tensor) -> tuple[str, torch.Tensor, tuple[int, ...]]:
    """The shared experts' [rows, cols] codes or scales as a stack of one expert [1, rows, cols]."""
    return "stacked", weight, (1, *weight.shape)


def one_expert_interleaved(weight: torch.Tensor) -> tuple[str, torch.Tensor, tuple[int, ...]]:
    """The shared experts' gate/up codes or scales, rows interleaved, as one expert [1, 2f, cols]."""
    suffix, paired, shape = interleaved_gate_up(weight.unsqueeze(0))
    return suffix, paired, shape


def code_type(bits: int) -> int:
    """QMoE reads codes as uint8 bytes whatever the bits (two int4 codes per byte)."""
    return TensorProto.UINT8


# Weights this form's ops read in another layout than the canonical one. Rows of quantized
# weights move with their codes and scales, which stay as stored within each row.
WEIGHT_LAYOUTS = {
    "experts.gate_up": interleaved_gate_up,
    "departments.gate_up": interleaved_gate_up,
    "experts.gate_up_bias": interleaved_gate_up_bias,
    "departments.gate_up_bias": interleaved_gate_up_bias,
    **{
        f"{part}.gate_up.{field}": interleaved_gate_up
        for part in ("experts", "departments")
        for field in ("qweight", "scales")
    },
    "shared_experts.gate_up.qweight": one_expert_interleaved,
    "shared_experts.gate_up.scales": one_expert_interleaved,
    "shared_experts.down.qweight": one_expert,
    "shared_experts.down.scales": one_expert,
}
