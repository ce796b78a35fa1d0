"""ctypes mirror of plugins/deamoe/deamoeKernels.h: structs, status codes, prototypes."""

from __future__ import annotations

import ctypes
import functools

import torch

from ..config import DeaMoEConfig

# deamoe::Status
SUCCESS = 0
STATUS_NAMES = {
    0: "success",
    1: "invalid layer parameters",
    2: "invalid argument",
    3: "unsupported by this build",
    4: "CUDA error",
}

# deamoe::DataType
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

SCORE_FUNCS = {"softmax": 0, "sigmoid": 1}
DEPARTMENT_SCORES = {"max": 0, "sum_top2": 1, "sum": 2}


class LayerParams(ctypes.Structure):
    """deamoe::LayerParams, field for field (all 4-byte members, no padding)."""

    _fields_ = [
        ("hidden", ctypes.c_int32),
        ("numDepartments", ctypes.c_int32),
        ("expertsPerDepartment", ctypes.c_int32),
        ("sharedWidth", ctypes.c_int32),
        ("privateWidth", ctypes.c_int32),
        ("topK", ctypes.c_int32),
        ("topDepartments", ctypes.c_int32),
        ("scoreFunc", ctypes.c_int32),
        ("departmentScore", ctypes.c_int32),
        ("normTopkProb", ctypes.c_int32),
        ("routedScalingFactor", ctypes.c_float),
        ("hasRouterBias", ctypes.c_int32),
        ("sharedExpertWidth", ctypes.c_int32),
        ("sharedExpertGate", ctypes.c_int32),
        ("routerWeightFloat32", ctypes.c_int32),
    ]


class LayerWeights(ctypes.Structure):
    """deamoe::LayerWeights: device pointers, None for absent parts."""

    _fields_ = [
        ("routerWeight", ctypes.c_void_p),
        ("routerBias", ctypes.c_void_p),
        ("departmentGateUp", ctypes.c_void_p),
        ("departmentDown", ctypes.c_void_p),
        ("expertGateUp", ctypes.c_void_p),
        ("expertDown", ctypes.c_void_p),
        ("sharedGateUp", ctypes.c_void_p),
        ("sharedDown", ctypes.c_void_p),
        ("sharedGate", ctypes.c_void_p),
    ]


@functools.lru_cache(maxsize=64)
def layer_params(config: DeaMoEConfig, router_weight_float32: bool = False) -> LayerParams:
    """The config as LayerParams (cached per config; callers must not modify the result).

    router_weight_float32: the router weight is float32 (else in the activation dtype)."""
    c = config
    return LayerParams(
        hidden=c.hidden_size,
        numDepartments=c.num_departments,
        expertsPerDepartment=c.experts_per_department,
        sharedWidth=c.shared_intermediate_size,
        privateWidth=c.private_intermediate_size,
        topK=c.top_k,
        topDepartments=c.top_departments,
        scoreFunc=SCORE_FUNCS[c.score_func],
        departmentScore=DEPARTMENT_SCORES[c.department_score],
        normTopkProb=int(c.norm_topk_prob),
        routedScalingFactor=c.routed_scaling_factor,
        hasRouterBias=int(c.router_bias),
        sharedExpertWidth=c.shared_expert_intermediate_size,
        sharedExpertGate=int(c.shared_expert_gate),
        routerWeightFloat32=int(router_weight_float32),
    )


_P = ctypes.POINTER
_VOID = ctypes.c_void_p
_I32 = ctypes.c_int32

PROTOTYPES = {
    "deamoe_validate": (_I32, [_P(LayerParams)]),
    "deamoe_workspace_size": (ctypes.c_size_t, [_P(LayerParams), _I32, _I32]),
    "deamoe_route": (
        _I32,
        [_P(LayerParams), _I32, _VOID, _VOID, _VOID, _I32, _VOID, _VOID, _VOID, _VOID, _VOID, ctypes.c_size_t, _VOID],
    ),
    "deamoe_forward": (
        _I32,
        [_P(LayerParams), _P(LayerWeights), _I32, _VOID, _VOID, _I32, _VOID, ctypes.c_size_t, _VOID],
    ),
    "deamoe_status_string": (ctypes.c_char_p, [_I32]),
    "deamoe_max_tile_tokens": (_I32, []),
    "deamoe_last_error": (ctypes.c_char_p, []),
    "deamoe_check_supported": (_I32, [_P(LayerParams), _I32]),
    "deamoe_router_logits": (_I32, [_P(LayerParams), _I32, _VOID, _VOID, _I32, _VOID, _VOID]),
    "deamoe_route_logits": (_I32, [_P(LayerParams), _I32, _VOID, _VOID, _I32, _VOID, _VOID, _VOID, _VOID, _VOID]),
    "deamoe_set_programmatic_launch": (None, [_I32]),
    "deamoe_programmatic_launch": (_I32, []),
}


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declares every C ABI function's signature on lib (missing ones raise AttributeError)."""
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib
