"""ctypes mirror of native/cuda/deamoeKernels.h: structs, status codes, prototypes."""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

from .. import contract, dtypes
from ..config import DeaMoEConfig

if TYPE_CHECKING:
    from ..quant import QuantConfig

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
DTYPES = {d.torch: d.kernel for d in dtypes.DTYPES}

# deamoe::ScoreFunc, deamoe::DepartmentScore and deamoe::Activation: a value's position is its code.
SCORE_FUNCS = {name: code for code, name in enumerate(contract.ENUMS["score_func"])}
DEPARTMENT_SCORES = {name: code for code, name in enumerate(contract.ENUMS["department_score"])}
ACTIVATIONS = {name: code for code, name in enumerate(contract.ENUMS["activation"])}

# Every LayerParams member is 4 bytes: int32 (enums included), or a float for the float attributes.
_CTYPES: dict[str, type[ctypes.c_int32 | ctypes.c_float]] = {
    "int": ctypes.c_int32,
    "bool": ctypes.c_int32,
    "str": ctypes.c_int32,
    "float": ctypes.c_float,
}


class LayerParams(ctypes.Structure):
    """deamoe::LayerParams, field for field (all 4-byte members, no padding), from the contract:
    one member per attribute, then the inputs' dtype flags."""

    _fields_ = [(a.param, _CTYPES[a.kind]) for a in contract.ATTRIBUTES] + [
        (name, ctypes.c_int32) for name in contract.DTYPE_PARAMS
    ]


class LayerWeights(ctypes.Structure):
    """deamoe::LayerWeights: device pointers, None for absent parts; one per weight input."""

    _fields_ = [(item.weights_field, ctypes.c_void_p) for item in contract.WEIGHT_INPUTS]


def _param_value(attribute: contract.Attribute, value):
    if attribute.kind == "str":
        return contract.enum_code(attribute.name, value)
    return int(value) if attribute.kind == "bool" else value


@functools.lru_cache(maxsize=64)
def layer_params(
    config: DeaMoEConfig, router_weight_float32: bool = False, quant: QuantConfig | None = None
) -> LayerParams:
    """The config as LayerParams (cached; callers must not modify the result).

    router_weight_float32: the router weight is float32 (else in the activation dtype).
    quant: the checkpoint's QuantConfig (weightBits/weightGroupSize), None for float weights."""
    values = contract.attribute_values(config, quant)
    attributes = {a.param: _param_value(a, values[a.name]) for a in contract.ATTRIBUTES}
    return LayerParams(**attributes, routerWeightFloat32=int(router_weight_float32))


_P = ctypes.POINTER
_VOID = ctypes.c_void_p
_I32 = ctypes.c_int32

PROTOTYPES = {
    "deamoe_validate": (_I32, [_P(LayerParams)]),
    "deamoe_workspace_size": (ctypes.c_size_t, [_P(LayerParams), _I32, _I32]),
    "deamoe_route": (
        _I32,
        # params, dtype, hidden, router weight, bias, logit bias, tokens, 4 outputs, workspace, size, stream
        [_P(LayerParams), _I32, _VOID, _VOID, _VOID, _VOID, _I32, *[_VOID] * 5, ctypes.c_size_t, _VOID],
    ),
    "deamoe_forward": (
        _I32,
        [_P(LayerParams), _P(LayerWeights), _I32, _VOID, _VOID, _I32, _VOID, ctypes.c_size_t, _VOID],
    ),
    "deamoe_status_string": (ctypes.c_char_p, [_I32]),
    "deamoe_max_tile_tokens": (_I32, []),
    "deamoe_last_error": (ctypes.c_char_p, []),
    "deamoe_check_supported": (_I32, [_P(LayerParams), _I32]),
    "deamoe_router_logits": (_I32, [_P(LayerParams), _I32, _VOID, _VOID, _VOID, _I32, _VOID, _VOID]),
    "deamoe_route_logits": (_I32, [_P(LayerParams), _I32, _VOID, _VOID, _I32, _VOID, _VOID, _VOID, _VOID, _VOID]),
    "deamoe_set_programmatic_launch": (None, [_I32]),
    "deamoe_programmatic_launch": (_I32, []),
    "deamoe_num_variants": (_I32, []),
    "deamoe_variant_name": (ctypes.c_char_p, [_I32]),
    "deamoe_forward_variant": (
        _I32,
        # params, weights, dtype, variant, hidden, output, tokens, workspace, size, stream
        [_P(LayerParams), _P(LayerWeights), _I32, _I32, _VOID, _VOID, _I32, _VOID, ctypes.c_size_t, _VOID],
    ),
}


@functools.lru_cache(maxsize=8)
def variant_names(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The library's kernel variants (deamoeKernels.h, forwardVariant), index = variant id."""
    return tuple(lib.deamoe_variant_name(i).decode() for i in range(lib.deamoe_num_variants()))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declares every C ABI function's signature on lib (missing ones raise AttributeError)."""
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib
