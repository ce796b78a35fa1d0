"""deamoe_trt.cuda and the cuda runtime's kernel calls: importable and clear without a GPU; on a
GPU, the kernels against the reference.

The kernels themselves are also exercised without a GPU, through the SIMT emulator
(tests/native/cuda/test_emulated_kernels_match_reference.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from configs import deepseek_style
from deamoe_trt import cuda, runtimes
from deamoe_trt.cuda import _library
from deamoe_trt.errors import MissingDependencyError, UsageError
from deamoe_trt.layer import DeaMoELayer
from deamoe_trt.presets import PRESETS

kernels = runtimes.get("cuda")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


def test_without_a_gpu_every_call_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    x = torch.randn(2, 64)
    calls = (kernels.forward, kernels.route, kernels.router_logits)
    for call in calls:
        with pytest.raises(MissingDependencyError) as info:
            call(layer, x)
        assert str(info.value) == (
            "deamoe-trt CUDA kernels: needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
        )


def test_cpu_tensors_are_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    with pytest.raises(UsageError, match="work on CUDA tensors; got a tensor on cpu"):
        kernels.forward(layer, torch.randn(1, 64))


def test_a_missing_library_path_is_reported(tmp_path):
    with pytest.raises(cuda.KernelBuildError, match="does not exist"):
        cuda.load_library(tmp_path / "libdeamoe_kernels.so")


def test_a_library_without_the_c_abi_is_rejected(tmp_path):
    candidates = [Path(p) for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                                    "/lib/aarch64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6")]  # fmt: skip
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        pytest.skip("no libm at a standard path to load")
    with pytest.raises(cuda.KernelBuildError, match="not a DeaMoE kernel library"):
        cuda.load_library(path)


def test_building_without_a_gpu_asks_for_an_architecture(monkeypatch):
    monkeypatch.delenv(cuda.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(cuda.CudaUnavailableError, match="cuda_architectures="):
        cuda.load_library()


def test_build_cache_key_follows_sources_and_architectures(tmp_path):
    source = tmp_path / "cuda"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("a")
    (source / "deamoeKernels.cu").write_text("b")
    (source / "KERNELS.md").write_text("notes")  # not built from
    key = _library._build_key(source, "/nonexistent/nvcc", "90")
    assert key.endswith("-sm90")
    assert _library._build_key(source, "/nonexistent/nvcc", "90") == key
    assert _library._build_key(source, "/nonexistent/nvcc", "86") != key
    (source / "KERNELS.md").write_text("notes changed")
    assert _library._build_key(source, "/nonexistent/nvcc", "90") == key
    (source / "deamoeKernels.cu").write_text("b changed")
    changed = _library._build_key(source, "/nonexistent/nvcc", "90")
    assert changed != key
    (source / "architectures.cmake").write_text("c")  # the CMake files are sources too
    assert _library._build_key(source, "/nonexistent/nvcc", "90") != changed


# ---- On a GPU -------------------------------------------------------------------------

SMALL_DEEPSEEK = deepseek_style(
    hidden_size=256,
    num_departments=8,
    experts_per_department=8,
    shared_intermediate_size=64,
    private_intermediate_size=32,
    top_k=8,
    shared_expert_intermediate_size=128,
)


def _layer(config, dtype, seed=0):
    return DeaMoELayer.random(config, seed=seed, dtype=dtype).cuda()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 5, 16, 40])
@pytest.mark.parametrize("config", [PRESETS["tiny"], SMALL_DEEPSEEK], ids=["tiny", "small-deepseek"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_forward_matches_reference(config, dtype, tokens):
    layer = _layer(config, dtype)
    x = torch.randn(tokens, config.hidden_size, device="cuda").to(dtype)
    with torch.no_grad():
        got = kernels.forward(layer, x)
        routing = kernels.route(layer, x)
        ref_routing = layer.route(x)
        # float32 math on the same weights, from the kernels' own routing (no near-tie luck).
        want = layer.float().forward_routed(x.float(), routing)
        layer.to(dtype)
    assert torch.equal(routing.expert_ids, ref_routing.expert_ids)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    else:
        err = float((got.float() - want).norm() / want.norm())
        assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.gpu
@needs_cuda
def test_gpu_forward_is_deterministic_and_graph_capturable():
    layer = _layer(SMALL_DEEPSEEK, torch.bfloat16)
    x = torch.randn(4, SMALL_DEEPSEEK.hidden_size, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = kernels.forward(layer, x)
        assert torch.equal(eager, kernels.forward(layer, x))
        static_x = x.clone()
        kernels.forward(layer, static_x)  # warm-up: library loaded, workspace cached
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = kernels.forward(layer, static_x)
        fresh = torch.randn_like(x)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, kernels.forward(layer, fresh))


@pytest.mark.gpu
@needs_cuda
def test_gpu_routing_from_logits_breaks_ties_like_reference():
    from deamoe_trt.routing import route_logits

    c = PRESETS["deepseek-v3-layer"]
    logits = torch.randn(64, c.num_experts, device="cuda")
    logits[:8] = 0.0
    logits[8:, 32:64] = logits[8:, 0:32]
    bias = torch.zeros(c.num_experts, device="cuda")
    got = kernels.route_logits(c, logits, bias)
    want = route_logits(logits.cpu(), bias.cpu(), c)
    assert torch.equal(got.expert_ids.cpu(), want.expert_ids)
    assert torch.equal(got.kept_departments.cpu(), want.kept_departments)


def test_quantized_layers_reach_the_kernels(monkeypatch):
    """No refusal of int4/int8 layers any more: they fail only where a float layer would (no GPU)."""
    from deamoe_trt.quant import QuantConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    layer = DeaMoELayer.random(PRESETS["tiny"]).quantized(QuantConfig(8, 16))
    with pytest.raises(MissingDependencyError, match="needs a CUDA GPU"):
        kernels.forward(layer, torch.zeros(1, 64))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("bits", [4, 8])
def test_gpu_quantized_forward_matches_the_dequantized_reference(bits):
    from deamoe_trt.quant import QuantConfig

    c = deepseek_style(hidden_size=128, private_intermediate_size=64, shared_expert_intermediate_size=64)
    layer = DeaMoELayer.random(c, seed=3, dtype=torch.bfloat16).quantized(QuantConfig(bits, 32)).cuda()
    x = torch.randn(5, c.hidden_size, device="cuda").to(torch.bfloat16)
    y = kernels.forward(layer, x)
    assert torch.equal(y, kernels.forward(layer, x))  # deterministic
    with torch.no_grad():
        ref = copy.deepcopy(layer).float()(x.float())  # the dequantized weights, float32 math
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize("bits", [0, 4, 8])
def test_gpu_every_kernel_variant_matches_the_reference_and_is_graph_capturable(bits, tokens):
    """Each variant (KERNELS.md, "Variants") on the GPU: the release/acquire of the plan, the
    staged down kernel's shared memory and barriers, CUDA-graph capture, which the emulator
    cannot show."""
    from deamoe_trt.cuda._abi import variant_names
    from deamoe_trt.quant import QuantConfig

    c = deepseek_style(hidden_size=512, private_intermediate_size=512, shared_expert_intermediate_size=256)
    layer = DeaMoELayer.random(c, seed=4, dtype=torch.bfloat16)
    if bits:
        layer = layer.quantized(QuantConfig(bits, 32))
    layer = layer.cuda()
    x = torch.randn(tokens, c.hidden_size, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        ref = copy.deepcopy(layer).float()(x.float())
        for variant in variant_names(cuda.load_library()):
            y = kernels.forward(layer, x, variant=variant)
            assert float((y.float() - ref).norm() / ref.norm()) < 1e-2, variant
            graph = torch.cuda.CUDAGraph()
            static_x = x.clone()
            with torch.cuda.graph(graph):
                static_y = kernels.forward(layer, static_x, variant=variant)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, y), variant
