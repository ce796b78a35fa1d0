"""The `onnx` form: standard ONNX ops only, for any runtime.

Routing as in routing_graph; then the departments' shared parts (per token: its g kept
departments, weighted by W_j) and the experts' private parts (its k experts, weighted by
w_e) each run through swiglu_graph.grouped_swiglu, which gathers the selected weights per
token while that is cheap (decoding) and runs every group densely otherwise, so the graph
is right and bounded in memory for any token count. A kept department that got no expert
has W_j = 0 and adds nothing, as the spec says (it is still computed in this form).
"""

from __future__ import annotations

from onnx import TensorProto

from ..config import DeaMoEConfig
from .graph import GraphBuilder
from .routing_graph import emit_routing, to_float32
from .swiglu_graph import grouped_swiglu, shared_experts

F32 = TensorProto.FLOAT


def emit(b: GraphBuilder, x: str, weights: dict[str, str], config: DeaMoEConfig) -> str:
    """One layer; x [T, d] in the model's dtype -> output name [T, d] in the same dtype."""
    c = config
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
                )
            )
    if c.has_shared_experts:
        parts.append(shared_experts(b, x, x32, weights, c))
    y = parts[0]
    for part in parts[1:]:
        y = b.op("Add", [y, part])
    return b.cast(y, b.dtype.onnx) if b.dtype.onnx != F32 else y
