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

Needs an ONNX Runtime whose MoE takes weights as [experts, out, in] (1.23 and later) and,
on the CUDA EP, one that honours the SwiGLU attributes below: older CUDA kernels ignore
them and apply GPT-OSS's alpha 1.702 / beta 1 / clamp 7 (microsoft/onnxruntime#28738),
which `deamoe-trt validate --provider cuda` would show as a large error.
"""

from __future__ import annotations

import math

from onnx import TensorProto

from ..config import DeaMoEConfig
from .graph import GraphBuilder
from .routing_graph import dense_weights, emit_routing, router_logits, to_float32
from .swiglu_graph import shared_experts

F32 = TensorProto.FLOAT
MOE_DOMAIN = "com.microsoft"


def moe_attributes(k: int, normalize: bool) -> dict:
    """Every attribute of com.microsoft.MoE that changes the result, set to plain SwiGLU.

    SwiGLU here is silu(gate) * up: alpha 1 (the sigmoid's slope), beta 0 (no +1 on up),
    no clamp (limit +inf), gate/up interleaved per row (the only layout the CPU kernel
    takes: swiglu_fusion=1). Set explicitly because CUDA builds default to GPT-OSS values.
    """
    return {
        "k": k,
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "activation_alpha": 1.0,
        "activation_beta": 0.0,
        "swiglu_limit": math.inf,
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


def emit(b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig) -> str:
    """One layer; x [T, d] in the model's dtype -> output name [T, d] in the same dtype."""
    c = config
    x32 = to_float32(b, x)
    parts = []
    if is_vanilla(c):
        probs = b.cast(router_logits(b, x32, weights["router.weight"]), b.dtype.onnx)
        parts.append(_moe(b, x, probs, weights, "experts", c.private_intermediate_size, c.top_k, c.norm_topk_prob))
    else:
        routing = emit_routing(b, x32, weights, c)
        total = b.reduce("ReduceSum", routing.weights, [1], keepdims=True)  # sum(w) = sum(W)
        if c.shared_intermediate_size:
            values = _log_ratio(b, routing.department_weights)
            out = _moe(b, x, values, weights, "departments", c.shared_intermediate_size, c.top_departments, False)
            parts.append(b.op("Mul", [out, total]))
        if c.private_intermediate_size:
            full = dense_weights(b, routing.expert_ids, routing.weights, b.op("Shape", [routing.logits]))
            out = _moe(b, x, _log_ratio(b, full), weights, "experts", c.private_intermediate_size, c.top_k, False)
            parts.append(b.op("Mul", [out, total]))
    if c.has_shared_experts:
        parts.append(shared_experts(b, x, x32, weights, c))
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
    b: GraphBuilder, x: str, router_values: str, weights: dict[str, str], part: str, width: int, k: int, normalize: bool
) -> str:
    """MoE over one part's stacked SwiGLU blocks -> [T, d] float32."""
    fc1 = _interleave_gate_up(b, weights[f"{part}.gate_up"], width)
    out = b.op(
        "MoE",
        [x, router_values, fc1, "", weights[f"{part}.down"]],
        domain=MOE_DOMAIN,
        name=f"{part}_MoE",
        **moe_attributes(k, normalize),
    )
    return to_float32(b, out)


def _interleave_gate_up(b: GraphBuilder, gate_up: str, width: int) -> str:
    """[G, 2f, d] gate rows then up rows -> rows g0, u0, g1, u1, ... (MoE's swiglu_fusion=1).

    Done by nodes on the canonical initializer (ONNX Runtime folds them into a constant when
    the session starts), so the file keeps the canonical tensors every form shares."""
    split = b.op("Reshape", [gate_up, b.i64(0, 2, width, -1)])  # [G, 2, f, d]
    paired = b.op("Transpose", [split], perm=[0, 2, 1, 3])  # [G, f, 2, d]
    return b.op("Reshape", [paired, b.i64(0, 2 * width, -1)])
