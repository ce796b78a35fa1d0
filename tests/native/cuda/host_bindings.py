"""ctypes wrappers for the test-only host build of the kernels' routing and plan logic
(tests/native/cuda/deamoeHostTest.cpp), returning torch tensors shaped like deamoe_trt.routing."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import _abi

PLAN_ENTRY = np.dtype([("token", "<i4"), ("slot", "<i4"), ("weight", "<f4")])


class RoutingConfigC(ctypes.Structure):
    _fields_ = [
        ("numExperts", ctypes.c_int32),
        ("numDepartments", ctypes.c_int32),
        ("expertsPerDepartment", ctypes.c_int32),
        ("topK", ctypes.c_int32),
        ("topDepartments", ctypes.c_int32),
        ("scoreFunc", ctypes.c_int32),
        ("departmentScore", ctypes.c_int32),
        ("normTopkProb", ctypes.c_int32),
        ("routedScalingFactor", ctypes.c_float),
    ]


class PlanConfigC(ctypes.Structure):
    _fields_ = [
        ("numExperts", ctypes.c_int32),
        ("numDepartments", ctypes.c_int32),
        ("expertsPerDepartment", ctypes.c_int32),
        ("topK", ctypes.c_int32),
        ("topDepartments", ctypes.c_int32),
    ]


def routing_config(c: DeaMoEConfig) -> RoutingConfigC:
    return RoutingConfigC(
        c.num_experts,
        c.num_departments,
        c.experts_per_department,
        c.top_k,
        c.top_departments,
        _abi.SCORE_FUNCS[c.score_func],
        _abi.DEPARTMENT_SCORES[c.department_score],
        int(c.norm_topk_prob),
        c.routed_scaling_factor,
    )


def plan_config(c: DeaMoEConfig) -> PlanConfigC:
    return PlanConfigC(c.num_experts, c.num_departments, c.experts_per_department, c.top_k, c.top_departments)


def _p(array: np.ndarray | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if array is None else array.ctypes.data)


@dataclass
class HostRouting:
    expert_ids: torch.Tensor  # [T, k] int64
    weights: torch.Tensor  # [T, k] float32
    department_ids: torch.Tensor  # [T, k] int64
    kept_departments: torch.Tensor  # [T, g] int64
    logits: torch.Tensor | None = None  # [T, N] float32, when computed from hidden states


def _outputs(c: DeaMoEConfig, num_tokens: int) -> list[np.ndarray]:
    k, g = c.top_k, c.top_departments
    return [
        np.full((num_tokens, k), -1, np.int32),
        np.full((num_tokens, k), np.nan, np.float32),
        np.full((num_tokens, k), -1, np.int32),
        np.full((num_tokens, g), -1, np.int32),
    ]


def _routing(outputs: list[np.ndarray], logits: np.ndarray | None = None) -> HostRouting:
    ids, weights, departments, kept = outputs
    return HostRouting(
        expert_ids=torch.from_numpy(ids).long(),
        weights=torch.from_numpy(weights),
        department_ids=torch.from_numpy(departments).long(),
        kept_departments=torch.from_numpy(kept).long(),
        logits=None if logits is None else torch.from_numpy(logits),
    )


def route_logits(lib: ctypes.CDLL, c: DeaMoEConfig, logits: torch.Tensor, bias: torch.Tensor | None) -> HostRouting:
    z = np.ascontiguousarray(logits.float().numpy())
    b = None if bias is None else np.ascontiguousarray(bias.float().numpy())
    outputs = _outputs(c, z.shape[0])
    cfg = routing_config(c)
    status = lib.deamoe_host_route_logits(ctypes.byref(cfg), _p(z), _p(b), z.shape[0], *(_p(o) for o in outputs))
    assert status == 0, "deamoe_host_route_logits rejected its arguments"
    return _routing(outputs)


def route(
    lib: ctypes.CDLL, c: DeaMoEConfig, x: torch.Tensor, router_weight: torch.Tensor, bias: torch.Tensor | None
) -> HostRouting:
    xs = np.ascontiguousarray(x.float().numpy())
    w = np.ascontiguousarray(router_weight.float().numpy())
    b = None if bias is None else np.ascontiguousarray(bias.float().numpy())
    logits = np.zeros((xs.shape[0], c.num_experts), np.float32)
    outputs = _outputs(c, xs.shape[0])
    cfg = routing_config(c)
    status = lib.deamoe_host_route(
        ctypes.byref(cfg), c.hidden_size, _p(xs), _p(w), _p(b), xs.shape[0], _p(logits), *(_p(o) for o in outputs)
    )
    assert status == 0, "deamoe_host_route rejected its arguments"
    return _routing(outputs, logits)


@dataclass
class HostPlan:
    departments: list[int]  # used departments, ascending
    experts: list[int]  # used experts, ascending
    department_entries: list[list[tuple[int, int, float]]]  # per used department: (token, slot, W_j)
    expert_entries: list[list[tuple[int, int, float]]]  # per used expert: (token, slot, w_e)
    department_slots: list[int]  # per token: departments holding its experts


def max_tile_tokens(lib: ctypes.CDLL) -> int:
    return int(lib.deamoe_host_max_tile_tokens())


def plan(lib: ctypes.CDLL, c: DeaMoEConfig, expert_ids, weights, kept_departments) -> HostPlan | None:
    """The plan of one tile from its routing; None when the library rejects the arguments."""
    ids = np.ascontiguousarray(np.asarray(expert_ids, dtype=np.int32))
    w = np.ascontiguousarray(np.asarray(weights, dtype=np.float32))
    kept = np.ascontiguousarray(np.asarray(kept_departments, dtype=np.int32))
    num_tokens = ids.shape[0]
    tile = max_tile_tokens(lib)
    D, N = c.num_departments, c.num_experts
    counts = np.full(2, -1, np.int32)
    departments = np.full(D, -1, np.int32)
    experts = np.full(N, -1, np.int32)
    department_counts = np.full(D, -1, np.int32)
    expert_counts = np.full(N, -1, np.int32)
    department_entries = np.zeros((D, tile), PLAN_ENTRY)
    expert_entries = np.zeros((N, tile), PLAN_ENTRY)
    department_slots = np.full(max(num_tokens, 1), -1, np.int32)
    cfg = plan_config(c)
    status = lib.deamoe_host_plan(
        ctypes.byref(cfg),
        num_tokens,
        _p(ids),
        _p(w),
        _p(kept),
        _p(counts),
        _p(departments),
        _p(experts),
        _p(department_counts),
        _p(expert_counts),
        _p(department_entries),
        _p(expert_entries),
        _p(department_slots),
    )
    if status != 0:
        return None
    used_d, used_e = int(counts[0]), int(counts[1])

    def entries(table: np.ndarray, lengths: np.ndarray, used: int) -> list[list[tuple[int, int, float]]]:
        return [
            [(int(e["token"]), int(e["slot"]), float(e["weight"])) for e in table[p, : lengths[p]]] for p in range(used)
        ]

    return HostPlan(
        departments=departments[:used_d].tolist(),
        experts=experts[:used_e].tolist(),
        department_entries=entries(department_entries, department_counts, used_d),
        expert_entries=entries(expert_entries, expert_counts, used_e),
        department_slots=department_slots[:num_tokens].tolist(),
    )
