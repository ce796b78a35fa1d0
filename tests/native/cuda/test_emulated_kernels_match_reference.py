"""The CUDA kernels, executed on the CPU by the SIMT emulator, against the PyTorch reference.

The emulated library is the real kernel source (native/cuda/*.cu) behind the real C
ABI, driven through deamoe_trt.cuda's own marshalling (_ops) with CPU tensors: launch
geometry, the plan's consumption, warp reductions, the fused ordered down reduction and
the tile loop all run. Timing and memory behaviour are not modelled (see
deamoe_trt/cuda/simt_emulator/simt_emulator.h); `deamoe-trt check-gpu` (deamoe_trt/checks/gpu/) covers the GPU.
"""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

from configs import QWEN2_STYLE_GATED_SHARED, deepseek_style
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.cuda import _abi, _ops
from deamoe_trt.cuda._ops import KernelError
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.presets import PRESETS
from deamoe_trt.routing import route_logits
from native.cuda.emulated_variants import hidden, reference_fp32, relative_error

pytestmark = pytest.mark.slow  # compiles the kernel library for the SIMT emulator, then emulates it

CONFIGS = {
    "tiny": PRESETS["tiny"],
    # DeepSeek-V3's routing and shared expert at toy size.
    "deepseek-like": deepseek_style(hidden_size=64, experts_per_department=8, shared_expert_intermediate_size=32),
    "qwen2-moe-like": QWEN2_STYLE_GATED_SHARED,
    # Departments only (f_p = 0), `sum` department scores, k > g.
    "shared-only": DeaMoEConfig(
        hidden_size=48,
        num_departments=3,
        experts_per_department=2,
        shared_intermediate_size=40,
        private_intermediate_size=0,
        top_k=3,
        top_departments=2,
        department_score="sum",
    ),
}

# Small enough that a full 16-token tile emulates in a few seconds.
SMALL = DeaMoEConfig(
    hidden_size=32,
    num_departments=2,
    experts_per_department=4,
    shared_intermediate_size=16,
    private_intermediate_size=8,
    top_k=2,
    top_departments=1,
)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_forward_fp32_matches_reference(emulated_lib, name, num_tokens):
    c = CONFIGS[name]
    layer = DeaMoELayer.random(c, seed=1)
    x = hidden(c, num_tokens, seed=num_tokens)
    y = _ops.forward_with(emulated_lib, layer, x)
    torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny", "deepseek-like", "qwen2-moe-like"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_forward_half_precision_matches_reference(emulated_lib, name, dtype, tolerance):
    c = CONFIGS[name]
    layer = DeaMoELayer.random(c, seed=2, dtype=dtype)
    x = hidden(c, 2, seed=5, dtype=dtype)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert y.dtype == dtype and y.shape == x.shape
    # float32 math on the same rounded weights; the kernels round only the output.
    assert relative_error(y, reference_fp32(layer, x)) < tolerance
    # PyTorch's own half-precision forward rounds every intermediate: a looser match.
    with torch.no_grad():
        assert relative_error(y, layer(x)) < 4 * tolerance


@pytest.mark.parametrize("num_tokens", [16, 17])
def test_forward_over_a_full_tile_and_into_the_next(emulated_lib, num_tokens):
    layer = DeaMoELayer.random(SMALL, seed=3)
    x = hidden(SMALL, num_tokens, seed=7)
    torch.testing.assert_close(_ops.forward_with(emulated_lib, layer, x), layer(x), rtol=1e-5, atol=1e-5)


def test_forward_keeps_leading_dimensions(emulated_lib):
    c = CONFIGS["tiny"]
    layer = DeaMoELayer.random(c, seed=4)
    x = torch.randn(2, 1, c.hidden_size)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-5)


def test_forward_is_bitwise_deterministic(emulated_lib):
    c = CONFIGS["deepseek-like"]
    layer = DeaMoELayer.random(c, seed=5)
    x = hidden(c, 2, seed=6)
    first = _ops.forward_with(emulated_lib, layer, x)
    assert torch.equal(first, _ops.forward_with(emulated_lib, layer, x))


@pytest.mark.parametrize("name", ["tiny", "deepseek-like", "qwen2-moe-like"])
def test_routing_kernel_matches_reference(emulated_lib, name):
    c = CONFIGS[name]
    layer = DeaMoELayer.random(c, seed=7)
    x = hidden(c, 20, seed=8)
    got = _ops.route_with(emulated_lib, layer, x)
    ref = layer.route(x)
    assert torch.equal(got.expert_ids, ref.expert_ids)
    assert torch.equal(got.kept_departments, ref.kept_departments)
    assert torch.equal(got.department_ids, ref.department_ids)
    torch.testing.assert_close(got.weights, ref.weights, rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(got.scores, ref.scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("department_score", ["max", "sum_top2", "sum"])
def test_routing_kernel_breaks_ties_like_reference(emulated_lib, department_score):
    # The warp-parallel routing (one lane per candidate, butterfly argmax) on exact ties.
    c = DeaMoEConfig(
        hidden_size=8,
        num_departments=6,
        experts_per_department=40,  # more experts than lanes: several per lane
        shared_intermediate_size=8,
        private_intermediate_size=8,
        top_k=9,
        top_departments=3,
        department_score=department_score,
        router_bias=True,
    )
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(12, c.num_experts, generator=gen)
    logits[:4] = 0.0  # everything ties
    m = c.experts_per_department
    logits[4:, 5 * m : 6 * m] = logits[4:, 1 * m : 2 * m]  # departments 1 and 5 tie
    logits[4:, 7] = logits[4:, 3]
    logits[4:, 2 * m + 33] = logits[4:, 3]
    bias = torch.zeros(c.num_experts)
    got = _ops.route_logits_with(emulated_lib, c, logits, bias)
    ref = route_logits(logits, bias, c)
    assert torch.equal(got.kept_departments, ref.kept_departments)
    assert torch.equal(got.expert_ids, ref.expert_ids)
    torch.testing.assert_close(got.weights, ref.weights, rtol=2e-6, atol=1e-7)


def test_router_logits_match_float32_matmul(emulated_lib):
    c = CONFIGS["deepseek-like"]
    layer = DeaMoELayer.random(c, seed=10, dtype=torch.bfloat16)
    x = hidden(c, 5, seed=11, dtype=torch.bfloat16)
    got = _ops.router_logits_with(emulated_lib, layer, x)
    torch.testing.assert_close(got, x.float() @ layer.router.weight.float().t(), rtol=1e-5, atol=1e-5)


def test_zero_tokens_give_an_empty_output(emulated_lib):
    c = CONFIGS["tiny"]
    layer = DeaMoELayer.random(c, seed=0)
    x = torch.empty(0, c.hidden_size)
    assert _ops.forward_with(emulated_lib, layer, x).shape == (0, c.hidden_size)
    assert _ops.route_with(emulated_lib, layer, x).expert_ids.shape == (0, c.top_k)


def test_invalid_params_are_rejected_with_the_reason(emulated_lib):
    params = _abi.LayerParams.from_buffer_copy(_abi.layer_params(CONFIGS["tiny"]))
    params.topK = 99
    assert emulated_lib.deamoe_validate(ctypes.byref(params)) == 1
    assert b"top_k must be <= top_departments * experts_per_department" in emulated_lib.deamoe_last_error()
    assert emulated_lib.deamoe_workspace_size(ctypes.byref(params), 4, 0) == 0


def test_rows_not_a_multiple_of_16_bytes_are_unsupported(emulated_lib):
    c = CONFIGS["tiny"].replace(hidden_size=36)
    layer = DeaMoELayer.random(c, seed=0, dtype=torch.bfloat16)
    with pytest.raises(KernelError, match="hidden_size 36 must be a multiple of 8 for bfloat16"):
        _ops.forward_with(emulated_lib, layer, hidden(c, 1, 0, torch.bfloat16))


def test_a_too_small_workspace_is_an_invalid_argument(emulated_lib):
    c = CONFIGS["tiny"]
    layer = DeaMoELayer.random(c, seed=0)
    x = hidden(c, 2, 0)
    out = torch.empty_like(x)
    params = _abi.layer_params(c)
    weights, keep = _ops.layer_weights(layer)
    needed = _ops.workspace_bytes(emulated_lib, c, 2, torch.float32)
    workspace = torch.empty(needed, dtype=torch.uint8)
    status = emulated_lib.deamoe_forward(
        ctypes.byref(params), ctypes.byref(weights), 0, x.data_ptr(), out.data_ptr(), 2,
        workspace.data_ptr(), needed - 1, None,
    )  # fmt: skip
    assert status == 2
    assert b"needs a workspace of" in emulated_lib.deamoe_last_error()
    del keep


def test_workspace_size_grows_with_tokens_up_to_one_tile(emulated_lib):
    c = PRESETS["deepseek-v3-layer"]
    sizes = [_ops.workspace_bytes(emulated_lib, c, t, torch.bfloat16) for t in (1, 2, 16, 17, 4096)]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert sizes[2] == sizes[3] == sizes[4]  # the batch runs in tiles of 16 tokens
    # About 1 MiB: float32 intermediates h and the shared experts' [16][7168] output; no
    # per-part output partials (16 tokens x 11 slots x 7168 floats would be 5 MiB).
    assert sizes[2] < 2 * 2**20


# More used parts than a down block stages at once (kDownPartsPerGroup = 32): 16 tokens x
# top-8 over 64 experts, plus departments and a gated shared expert, so K2 runs all three
# roles (4 routing blocks, shared down, routed gate/up) and K3 several part groups.
MANY_PARTS = DeaMoEConfig(
    hidden_size=32,
    num_departments=4,
    experts_per_department=16,
    shared_intermediate_size=16,
    private_intermediate_size=8,
    top_k=8,
    top_departments=2,
    shared_expert_intermediate_size=16,
    shared_expert_gate=True,
)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_every_token_tile_and_dtype_matches_reference(emulated_lib, dtype, tolerance):
    layer = DeaMoELayer.random(MANY_PARTS, seed=11, dtype=dtype)
    x = hidden(MANY_PARTS, 16, seed=12, dtype=dtype)
    assert layer.route(x).used_experts().numel() > 32  # more than one part group
    for n in (1, 2, 3, 5, 16):  # every token tile: 1, 2, 4, 8, 16
        y = _ops.forward_with(emulated_lib, layer, x[:n])
        assert y.dtype == dtype and torch.isfinite(y).all()
        assert relative_error(y, reference_fp32(layer, x[:n])) < tolerance, n


def test_programmatic_launch_is_on_by_default(emulated_lib):
    # On unless DEAMOE_PROGRAMMATIC_LAUNCH=0 at load; it takes effect on sm_90+ only.
    assert emulated_lib.deamoe_programmatic_launch() == int(os.environ.get("DEAMOE_PROGRAMMATIC_LAUNCH", "1") != "0")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("deepseek-like", torch.bfloat16),
        pytest.param("deepseek-like", torch.float16, marks=pytest.mark.slow),
        pytest.param("qwen2-moe-like", torch.float16, marks=pytest.mark.slow),
        pytest.param("qwen2-moe-like", torch.bfloat16, marks=pytest.mark.slow),
    ],
)
def test_float32_router_in_a_half_precision_layer(emulated_lib, name, dtype):
    """Spec "Router precision": router weight kept in float32 (and bias float32) inside a
    half-precision layer; the kernels' logits are the float32 matmul of those weights and
    their routing the reference's (the router rows a bf16 router would round away count)."""
    c = CONFIGS[name]
    layer = DeaMoELayer.random(c, seed=8).to(dtype)  # a float32 router stays float32
    assert layer.router_dtype == torch.float32 and layer.dtype == dtype
    x = hidden(c, 3, seed=9, dtype=dtype)
    logits = _ops.router_logits_with(emulated_lib, layer, x)
    torch.testing.assert_close(logits, x.float() @ layer.router.weight.t(), rtol=1e-5, atol=1e-5)
    routing = _ops.route_with(emulated_lib, layer, x)
    assert torch.equal(routing.expert_ids, layer.route(x).expert_ids)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert relative_error(y, reference_fp32(layer, x)) < (2e-3 if dtype == torch.float16 else 1e-2)


NONFINITE_CASES = [
    (name, bad) for name in ("tiny", "deepseek-like", "qwen2-moe-like") for bad in ("nan", "inf", "-inf")
]
FAST_NONFINITE_CASES = {("tiny", "nan"), ("deepseek-like", "inf")}  # softmax all-NaN; sigmoid +-inf


@pytest.mark.parametrize(
    ("name", "bad"),
    [case if case in FAST_NONFINITE_CASES else pytest.param(*case, marks=pytest.mark.slow) for case in NONFINITE_CASES],
)
def test_nonfinite_tokens_follow_the_reference_and_leave_others_alone(emulated_lib, name, bad):
    """A token with a NaN or infinite hidden value routes as the reference says (lowest-index
    departments and experts when its scores are not finite), its output is non-finite where
    the reference's is, and every other token's output is what it is without it."""
    c = CONFIGS[name]
    layer = DeaMoELayer.random(c, seed=10)
    x = hidden(c, 5, seed=11)
    x[1, 3] = float(bad)
    x[3] = float(bad)
    with torch.no_grad():
        ref_routing = layer.route(x)
        ref = layer.forward_routed(x, ref_routing)
    routing = _ops.route_with(emulated_lib, layer, x)
    assert torch.equal(routing.expert_ids, ref_routing.expert_ids)
    assert torch.equal(routing.kept_departments, ref_routing.kept_departments)
    y = _ops.forward_with(emulated_lib, layer, x)
    assert torch.equal(torch.isfinite(y), torch.isfinite(ref))
    good = [0, 2, 4]
    torch.testing.assert_close(y[good], _ops.forward_with(emulated_lib, layer, x[good]), rtol=0, atol=0)
    torch.testing.assert_close(y[good], ref[good], rtol=1e-5, atol=1e-5)


def test_a_failed_launch_fails_one_call_and_leaves_the_next_clean(emulated_lib):
    """A non-sticky launch failure is reported with the kernel and the CUDA error, and cleared:
    the next call runs (with cudaPeekAtLastError, one failure failed every later call)."""
    c = CONFIGS["tiny"]
    layer = DeaMoELayer.random(c, seed=12)
    x = hidden(c, 2, seed=13)
    emulated_lib.deamoe_emulator_fail_launches.restype = ctypes.c_int32
    out_of_resources = 701  # cudaErrorLaunchOutOfResources
    emulated_lib.deamoe_emulator_fail_launches(1, out_of_resources)
    with pytest.raises(KernelError, match=r"router/shared gate-up kernel: cudaErrorLaunchOutOfResources"):
        _ops.forward_with(emulated_lib, layer, x)
    assert emulated_lib.deamoe_emulator_fail_launches(0, 0) == 0  # nothing left pending
    torch.testing.assert_close(_ops.forward_with(emulated_lib, layer, x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("changes", "dtype", "limit"),
    [
        (dict(hidden_size=36), torch.float16, "hidden_size 36 must be a multiple of 8"),
        (dict(private_intermediate_size=18), torch.float32, "private_intermediate_size 18 must be a multiple of 4"),
        (
            dict(num_departments=64, experts_per_department=128, top_k=8, top_departments=2),
            torch.float32,
            "shared memory",
        ),
    ],
)
def test_check_supported_names_the_limit(emulated_lib, changes, dtype, limit):
    params = _abi.layer_params(PRESETS["tiny"].replace(**changes))
    status = emulated_lib.deamoe_check_supported(ctypes.byref(params), _abi.DTYPES[dtype])
    assert _abi.STATUS_NAMES[status] == "unsupported by this build"
    assert limit in emulated_lib.deamoe_last_error().decode()
    ok = _abi.layer_params(PRESETS["tiny"])
    assert emulated_lib.deamoe_check_supported(ctypes.byref(ok), _abi.DTYPES[dtype]) == 0
