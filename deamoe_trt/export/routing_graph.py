"""The spec's department-then-expert routing (deamoe_trt.routing) written as standard ONNX ops.

Used by the ort and onnx forms. Everything here runs in float32, as the spec's routing does,
whatever the activation dtype. ONNX TopK returns equal values lower index first (checked
on ONNX Runtime by tests/export/test_routing_graph.py), which is the spec's tie rule, and
its values come best first, as routing.top_indices' do.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto, helper

from ..config import DeaMoEConfig
from ..routing import NORM_EPS
from .graph import GraphBuilder

F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class RoutingValues:
    """Names of the routing's values in the graph (all float32 or int64).

    logits:         [T, N] router logits z.
    expert_ids:     [T, k] int64, kept experts, best first.
    weights:        [T, k] w_e of the kept experts (spec step 5).
    department_weights: [T, D] W_j, the sum of w_e over kept experts of department j.
    kept_departments:   [T, g] int64, stage-1 departments, best first.
    """

    logits: str
    expert_ids: str
    weights: str
    department_weights: str
    kept_departments: str


def router_logits(b: GraphBuilder, x32: str, router_weight: str, logit_bias: str | None = None) -> str:
    """z = x Wr^T (+ b_z) in float32 (x32 already float32; router_weight float32 or the
    model's dtype; logit_bias, router.logit_bias, float32)."""
    bias = [to_float32(b, logit_bias)] if logit_bias is not None else []
    return b.op("Gemm", [x32, to_float32(b, router_weight), *bias], transB=1)


def emit_routing(b: GraphBuilder, x32: str, weights: dict[str, str], config: DeaMoEConfig) -> RoutingValues:
    """Spec steps 1-5 for tokens x32 ([T, d] float32); weights maps canonical names to initializers."""
    c = config
    logits = router_logits(b, x32, weights["router.weight"], weights.get("router.logit_bias"))
    scores = b.op("Softmax", [logits], axis=-1) if c.score_func == "softmax" else b.op("Sigmoid", [logits])
    selection = b.op("Add", [scores, to_float32(b, weights["router.bias"])]) if c.router_bias else scores
    selection = _finite_or_zero(b, selection)

    # Stage 1: one score per department from its experts' selection scores, keep the top g.
    per_department = b.reshape(selection, [-1, c.num_departments, c.experts_per_department])
    if c.department_score == "max":
        department_scores = b.reduce("ReduceMax", per_department, [2])
    elif c.department_score == "sum_top2":
        top2 = b.op("TopK", [per_department, b.i64(2)], outputs=2, axis=2)[0]
        department_scores = b.reduce("ReduceSum", top2, [2])
    else:
        department_scores = b.reduce("ReduceSum", per_department, [2])
    kept_departments = b.op("TopK", [department_scores, b.i64(c.top_departments)], outputs=2, axis=1)[1]

    # Stage 2: experts outside the kept departments drop to -inf, then the top k of the rest.
    if c.top_departments == c.num_departments:
        candidates = selection  # every department is kept: nothing to mask
    else:
        nothing_kept = b.op("ConstantOfShape", [b.op("Shape", [department_scores])], value=_bool_tensor(False))
        everything = b.op("ConstantOfShape", [b.op("Shape", [kept_departments])], value=_bool_tensor(True))
        kept_mask = b.op("ScatterElements", [nothing_kept, kept_departments, everything], axis=1)
        masked = b.op("Where", [b.unsqueeze(kept_mask, [2]), per_department, b.scalar(float("-inf"))])
        candidates = b.reshape(masked, [-1, c.num_experts])
    expert_ids = b.op("TopK", [candidates, b.i64(c.top_k)], outputs=2, axis=1)[1]

    # Weights come from the scores s, not the selection scores c.
    weights_ = b.op("GatherElements", [scores, expert_ids], axis=1)
    if c.norm_topk_prob:
        total = b.op("Add", [b.reduce("ReduceSum", weights_, [1], keepdims=True), b.scalar(NORM_EPS)])
        weights_ = b.op("Div", [weights_, total])
    if c.routed_scaling_factor != 1.0:
        weights_ = b.op("Mul", [weights_, b.scalar(c.routed_scaling_factor)])

    return RoutingValues(
        logits=logits,
        expert_ids=expert_ids,
        weights=weights_,
        department_weights=department_weights(b, expert_ids, weights_, config),
        kept_departments=kept_departments,
    )


def department_weights(b: GraphBuilder, expert_ids: str, weights: str, config: DeaMoEConfig) -> str:
    """[T, D]: W_j = sum of w_e over kept experts e of department j (one-hot of e // m, weighted, summed)."""
    departments = b.op("Div", [expert_ids, b.i64(config.experts_per_department)])  # int64: floor for ids >= 0
    one_hot = b.op("Equal", [b.unsqueeze(departments, [2]), b.i64(*range(config.num_departments))])
    weighted = b.op("Mul", [b.cast(one_hot, F32), b.unsqueeze(weights, [2])])
    return b.reduce("ReduceSum", weighted, [1])


def dense_weights(b: GraphBuilder, ids: str, weights: str, shape: str, fill: float = 0.0) -> str:
    """[T, G] float32: weights scattered to their ids, fill elsewhere; shape is the int64 [2] tensor [T, G]."""
    background = b.op("ConstantOfShape", [shape], value=_float_tensor(fill))
    return b.op("ScatterElements", [background, ids, weights], axis=1)


def to_float32(b: GraphBuilder, name: str) -> str:
    """name as float32: a Cast unless it is float32 already (a float32 model's value, or an
    initializer stored in float32 such as the router's); ONNX Runtime folds it for initializers."""
    stored = b.initializers.get(name)
    is_float32 = stored.data_type == F32 if stored is not None else b.dtype.onnx == F32
    return name if is_float32 else b.cast(name, F32)


def _finite_or_zero(b: GraphBuilder, selection: str) -> str:
    """Selection scores, with the rows of non-finite tokens set to 0 (routing.route_logits):
    all ties, so TopK sends such a token to the lowest-index departments and experts.

    c - c is 0 for a finite c and NaN otherwise, so a row's sum of it is NaN exactly when
    the row holds a NaN or an infinity."""
    row_check = b.reduce("ReduceSum", b.op("Sub", [selection, selection]), [1], keepdims=True)
    return b.op("Where", [b.op("IsNaN", [row_check]), b.scalar(0.0), selection])


def _bool_tensor(value: bool) -> TensorProto:
    return helper.make_tensor("value", TensorProto.BOOL, [1], [value])


def _float_tensor(value: float) -> TensorProto:
    return helper.make_tensor("value", F32, [1], [value])
