"""The spec's math written a second time, plainly, for tests: per-token loops in float64 numpy.

It shares no code with deamoe_trt.routing or deamoe_trt.layer, so agreement between the
two is evidence, not tautology. Slow; for small shapes only.
"""

from __future__ import annotations

import math

import numpy as np


def spec_route(logits_row, bias, cfg):
    """One token's routing: (kept departments, kept experts, weights), each best first."""
    n, m = cfg.num_experts, cfg.experts_per_department
    z = [float(v) for v in logits_row]
    if cfg.score_func == "softmax":
        top = max(z)
        e = [math.exp(v - top) for v in z]
        total = sum(e)
        s = [v / total for v in e]
    else:
        s = [1.0 / (1.0 + math.exp(-v)) for v in z]
    c = [s[i] + (float(bias[i]) if bias is not None else 0.0) for i in range(n)]

    department_scores = []
    for j in range(cfg.num_departments):
        members = c[j * m : (j + 1) * m]
        if cfg.department_score == "max":
            department_scores.append(max(members))
        elif cfg.department_score == "sum_top2":
            ordered = sorted(members, reverse=True)
            department_scores.append(ordered[0] + ordered[1])
        else:
            department_scores.append(sum(members))
    # Ties to the lower index: sort by (-score, index).
    departments = sorted(range(cfg.num_departments), key=lambda j: (-department_scores[j], j))
    departments = departments[: cfg.top_departments]

    candidates = [e for e in range(n) if e // m in departments]
    experts = sorted(candidates, key=lambda e: (-c[e], e))[: cfg.top_k]
    weights = [s[e] for e in experts]
    if cfg.norm_topk_prob:
        total = sum(weights) + 1e-20
        weights = [w / total for w in weights]
    weights = [w * cfg.routed_scaling_factor for w in weights]
    return departments, experts, weights


def _swiglu(x, gate_up, down, cfg=None, gate_up_bias=None, down_bias=None):
    width = gate_up.shape[0] // 2
    gate = gate_up[:width] @ x
    up = gate_up[width:] @ x
    if gate_up_bias is not None:
        gate = gate + gate_up_bias[:width]
        up = up + gate_up_bias[width:]
    if cfg is not None and getattr(cfg, "activation", "swiglu") == "swiglu_clamped":
        limit, alpha = cfg.swiglu_limit, cfg.swiglu_alpha
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
        hidden = (up + 1.0) * gate / (1.0 + np.exp(-alpha * gate))
    else:
        hidden = gate / (1.0 + np.exp(-gate)) * up
    out = down @ hidden
    return out if down_bias is None else out + down_bias


def spec_forward(x, tensors, cfg):
    """y for tokens x [T, d] from canonical tensors (name -> array), float64."""
    t = {name: np.asarray(v, dtype=np.float64) for name, v in tensors.items()}
    x = np.asarray(x, dtype=np.float64)
    bias = t.get("router.bias")
    logit_bias = t.get("router.logit_bias", 0.0)
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        _, experts, weights = spec_route(t["router.weight"] @ row + logit_bias, bias, cfg)
        y = np.zeros_like(row)
        department_weight: dict[int, float] = {}
        for e, w in zip(experts, weights, strict=True):
            department_weight[e // cfg.experts_per_department] = (
                department_weight.get(e // cfg.experts_per_department, 0.0) + w
            )
            if cfg.private_intermediate_size:
                y += w * _swiglu(row, t["experts.gate_up"][e], t["experts.down"][e], cfg, *_biases(t, "experts", e))
        if cfg.shared_intermediate_size:
            for j, w in department_weight.items():
                y += w * _swiglu(
                    row, t["departments.gate_up"][j], t["departments.down"][j], cfg, *_biases(t, "departments", j)
                )
        if cfg.shared_expert_intermediate_size:
            shared = _swiglu(
                row, t["shared_experts.gate_up"], t["shared_experts.down"], cfg, *_biases(t, "shared_experts")
            )
            if cfg.shared_expert_gate:
                shared = shared / (1.0 + np.exp(-(t["shared_experts.gate"][0] @ row)))
            y += shared
        out[i] = y
    return out


def _biases(t, part, index=None):
    """(gate_up_bias, down_bias) of one group of a part, None where absent."""
    found = []
    for name in ("gate_up_bias", "down_bias"):
        value = t.get(f"{part}.{name}")
        found.append(value if value is None or index is None else value[index])
    return found


def spec_bytes(cfg, expert_sets, bytes_per_weight, router_bytes_per_weight=None):
    """The spec's formula for one step, from the kept experts of each token (plus the
    selection bias, float32 per "Router precision", and shared-expert gate vectors, which
    deamoe-trt counts too). The router weight counts at router_bytes_per_weight (default b)."""
    d, b = cfg.hidden_size, bytes_per_weight
    rb = b if router_bytes_per_weight is None else router_bytes_per_weight
    experts = set().union(*expert_sets)
    departments = {e // cfg.experts_per_department for e in experts}
    total = len(departments) * 3 * d * cfg.shared_intermediate_size * b
    total += len(experts) * 3 * d * cfg.private_intermediate_size * b
    total += cfg.num_experts * d * rb + 3 * d * cfg.shared_expert_intermediate_size * b
    total += cfg.num_experts * 4 if cfg.router_bias else 0
    total += d * b if cfg.shared_expert_gate else 0
    return total + _spec_bias_bytes(cfg, departments, experts, b)


def _spec_bias_bytes(cfg, departments, experts, b):
    """ "Bytes per step count the biases of the parts a step loads": each loaded department's
    2*f_s gate/up biases, each loaded expert's 2*f_p gate/up and d down biases, the shared
    experts' 2*f_sh + d, at b bytes (the activation dtype); the logit bias N*4 (float32)."""
    d = cfg.hidden_size
    total = cfg.num_experts * 4 if getattr(cfg, "router_logit_bias", False) else 0
    if getattr(cfg, "ffn_bias", False):
        total += len(departments) * 2 * cfg.shared_intermediate_size * b
        total += len(experts) * (2 * cfg.private_intermediate_size + d) * b
        if cfg.shared_expert_intermediate_size:
            total += (2 * cfg.shared_expert_intermediate_size + d) * b
    return total


def spec_dequantize(qweight, scales, bits, group_size):
    """The spec's w = scale * (q - zero) for a quantized [..., rows, cols] weight, reading ONNX
    Runtime QMoE's packing: int4 two per byte, the even column in the low nibble; zero point
    2^(bits-1). float64."""
    qweight = np.asarray(qweight, dtype=np.uint8).astype(np.int64)
    scales = np.asarray(scales, dtype=np.float64)
    if bits == 8:
        codes = qweight
    else:
        codes = np.empty((*qweight.shape[:-1], qweight.shape[-1] * 2), dtype=np.int64)
        codes[..., 0::2] = qweight % 16
        codes[..., 1::2] = qweight // 16
    return np.repeat(scales, group_size, axis=-1) * (codes - 2 ** (bits - 1))


def spec_dequantized_tensors(state, bits, group_size):
    """A quantized layer's state dict (torch tensors) as the spec's canonical float tensors
    (numpy): each "<weight>.qweight" with its "<weight>.scales" through spec_dequantize."""
    tensors = {}
    for name, tensor in state.items():
        if name.endswith(".qweight"):
            base = name.removesuffix(".qweight")
            tensors[base] = spec_dequantize(tensor.numpy(), state[f"{base}.scales"].numpy(), bits, group_size)
        elif not name.endswith(".scales"):
            tensors[name] = tensor.numpy()
    return tensors


def spec_quantized_bytes(cfg, expert_sets, bytes_per_weight, bits, group_size):
    """spec_bytes with the FFN weights stored as `bits`-bit codes plus one scale of
    bytes_per_weight bytes per group of group_size (the router stays at bytes_per_weight)."""
    d, b = cfg.hidden_size, bytes_per_weight

    def ffn(numel):
        return numel * bits // 8 + numel // group_size * b

    experts = set().union(*expert_sets)
    departments = {e // cfg.experts_per_department for e in experts}
    total = len(departments) * ffn(3 * d * cfg.shared_intermediate_size)
    total += len(experts) * ffn(3 * d * cfg.private_intermediate_size)
    total += cfg.num_experts * d * b + ffn(3 * d * cfg.shared_expert_intermediate_size)
    total += cfg.num_experts * 4 if cfg.router_bias else 0  # the selection bias is float32
    total += d * b if cfg.shared_expert_gate else 0
    return total + _spec_bias_bytes(cfg, departments, experts, b)
