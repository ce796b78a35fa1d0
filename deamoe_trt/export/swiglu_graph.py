"""SwiGLU blocks as ONNX ops: the always-on shared experts, and grouped experts for the onnx form.

Matmuls run in the model's dtype, as the reference's F.linear does; per-token weights and
the sum over parts run in float32, as the reference's accumulator does. Biases (spec,
"Biased experts") are added in the model's dtype where F.linear adds them: gate/up biases
to the gate/up pre-activations, down biases to each group's output before its weight.
"""

from __future__ import annotations

from onnx import TensorProto

from ..config import DeaMoEConfig
from .graph import GraphBuilder
from .routing_graph import dense_weights, to_float32

F32 = TensorProto.FLOAT


def swiglu_activation(b: GraphBuilder, h: str, width: int, axis: int, config: DeaMoEConfig | None = None) -> str:
    """The layer's activation (deamoe_trt.activation.glu) where h holds [gate rows; up rows]
    (width each) along axis: silu(gate) * up, or the clamped SwiGLU
    (up' + 1) * gate' * sigmoid(alpha * gate') with gate' = min(gate, limit),
    up' = clip(up, -limit, limit). config None: plain SwiGLU."""
    gate = b.slice(h, axis, 0, width)
    up = b.slice(h, axis, width, 2 * width)
    if config is None or config.activation == "swiglu":
        return b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
    dtype = b.dtype.onnx
    limit = config.swiglu_limit
    gate = b.op("Min", [gate, b.scalar(limit, dtype)])
    up = b.op("Clip", [up, b.scalar(-limit, dtype), b.scalar(limit, dtype)])
    sigmoid = b.op("Sigmoid", [b.op("Mul", [gate, b.scalar(config.swiglu_alpha, dtype)])])
    return b.op("Mul", [b.op("Mul", [gate, sigmoid]), b.op("Add", [up, b.scalar(1.0, dtype)])])


def shared_experts(b: GraphBuilder, x: str, x32: str, weights: dict[str, str], config: DeaMoEConfig) -> str:
    """[T, d] float32: SharedExperts(x), times sigmoid(x . gate) when gated (Qwen2-MoE)."""
    gate_up_bias = [weights["shared_experts.gate_up_bias"]] if config.ffn_bias else []
    down_bias = [weights["shared_experts.down_bias"]] if config.ffn_bias else []
    h = b.op("Gemm", [x, weights["shared_experts.gate_up"], *gate_up_bias], transB=1)
    a = swiglu_activation(b, h, config.shared_expert_intermediate_size, axis=1, config=config)
    out = b.cast(b.op("Gemm", [a, weights["shared_experts.down"], *down_bias], transB=1), F32)
    return gate_shared_experts(b, out, x32, weights, config)


def gate_shared_experts(b: GraphBuilder, out: str, x32: str, weights: dict[str, str], config: DeaMoEConfig) -> str:
    """The shared experts' float32 output [T, d], times sigmoid(x . gate) when gated (Qwen2-MoE)."""
    if config.shared_expert_gate:
        gate_logit = b.op("Gemm", [x32, to_float32(b, weights["shared_experts.gate"])], transB=1)  # [T, 1]
        out = b.op("Mul", [out, b.op("Sigmoid", [gate_logit])])
    return out


def grouped_swiglu(
    b: GraphBuilder,
    x: str,
    gate_up: str,
    down: str,
    ids: str,
    weights: str,
    *,
    groups: int,
    per_token: int,
    width: int,
    hidden: int,
    config: DeaMoEConfig | None = None,
    gate_up_bias: str | None = None,
    down_bias: str | None = None,
) -> str:
    """[T, d] float32: sum over each token's selected groups of weight * SwiGLU_group(x), standard ops only.

    ids/weights: [T, per_token] selected groups (int64) and their float32 weights.
    gate_up [groups, 2*width, d], down [groups, d, width]: the canonical stacked weights;
    gate_up_bias [groups, 2*width], down_bias [groups, d]: their optional biases; config:
    the activation (None: plain SwiGLU).

    Two ways to compute it, chosen per run by an If on the token count:
    - gather (T * per_token <= groups): gather each token's groups' weights and run batched
      matmuls. Reads only the selected weights, but materialises them per token, so it is
      used only while that copy is no larger than the weights themselves (decoding).
    - dense (otherwise): every group on every token, weighted by a [T, groups] matrix that is
      0 for unselected groups. More arithmetic, but memory bounded by groups * T, whatever T.
    Both give the same sums; the choice only bounds time and memory for any T.
    """
    tokens = b.op("Shape", [x], start=0, end=1)
    use_gather = b.op("LessOrEqual", [b.op("Mul", [tokens, b.i64(per_token)]), b.i64(groups)])

    gather = b.subgraph()
    with gather.scope("gather."):
        gate_up_sel = gather.op("Gather", [gate_up, ids], axis=0)  # [T, k, 2f, d]
        column = gather.reshape(x, [-1, 1, hidden, 1])  # [T, 1, d, 1]
        h = gather.op("MatMul", [gate_up_sel, column])  # [T, k, 2f, 1]
        if gate_up_bias is not None:
            h = gather.op("Add", [h, gather.unsqueeze(gather.op("Gather", [gate_up_bias, ids], axis=0), [3])])
        a = swiglu_activation(gather, h, width, axis=2, config=config)  # [T, k, f, 1]
        y = gather.op("MatMul", [gather.op("Gather", [down, ids], axis=0), a])  # [T, k, d, 1]
        y = gather.reshape(y, [-1, per_token, hidden])
        if down_bias is not None:
            y = gather.op("Add", [y, gather.op("Gather", [down_bias, ids], axis=0)])  # [T, k, d]
        y = gather.cast(y, F32)
        gathered = gather.reduce("ReduceSum", gather.op("Mul", [y, gather.unsqueeze(weights, [2])]), [1])

    dense = b.subgraph()
    with dense.scope("dense."):
        h = dense.op("MatMul", [gate_up, dense.op("Transpose", [x])])  # [G, 2f, T]
        if gate_up_bias is not None:
            h = dense.op("Add", [h, dense.unsqueeze(gate_up_bias, [2])])
        a = swiglu_activation(dense, h, width, axis=1, config=config)  # [G, f, T]
        y = dense.op("MatMul", [down, a])  # [G, d, T]
        if down_bias is not None:
            y = dense.op("Add", [y, dense.unsqueeze(down_bias, [2])])
        y = dense.cast(y, F32)
        shape = dense.op("Concat", [tokens, dense.i64(groups)], axis=0)  # [T, G]
        per_group = dense_weights(dense, ids, weights, shape)
        weighted = dense.op("Mul", [y, dense.unsqueeze(dense.op("Transpose", [per_group]), [1])])  # [G, d, T]
        dense_out = dense.op("Transpose", [dense.reduce("ReduceSum", weighted, [0])])  # [T, d]

    return b.op(
        "If",
        [use_gather],
        then_branch=gather.graph("gather_selected", [(gathered, F32)]),
        else_branch=dense.graph("all_groups_dense", [(dense_out, F32)]),
    )
