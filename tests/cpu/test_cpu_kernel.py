"""The fast CPU path against the PyTorch reference (deamoe_trt.layer, deamoe_trt.routing)."""

import ctypes
import time

import pytest
import torch

from configs import QWEN2_STYLE_GATED_SHARED, TINY_SHARED_ONLY, deepseek_style
from deamoe_trt import PRESETS, DeaMoELayer, DeaMoEStack, MissingDependencyError, UsageError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.routing import route_logits

try:
    from deamoe_trt import cpu

    cpu.load()
except MissingDependencyError as exc:  # no compiler or not x86-64 Linux: nothing to test
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)

CONFIGS = {
    "tiny": PRESETS["tiny"],
    # DeepSeek-V3 style: sigmoid scores, selection bias, sum_top2 departments, scaling, an
    # ungated shared expert; widths that are not multiples of the kernel's neuron group and
    # a hidden size that is not a multiple of its row padding.
    "deepseek-style": deepseek_style(
        hidden_size=40, shared_intermediate_size=22, private_intermediate_size=9, shared_expert_intermediate_size=13
    ),
    "qwen2-style-gated-shared": QWEN2_STYLE_GATED_SHARED,
    "shared-only": TINY_SHARED_ONLY,
}
TOKENS = (1, 3, 17)


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    layer = DeaMoELayer.random(CONFIGS[request.param], seed=3)
    return layer, cpu.CpuDeaMoE(layer)


@pytest.mark.slow
@pytest.mark.parametrize("tokens", TOKENS)
def test_forward_matches_reference(pair, tokens):
    layer, fast = pair
    x = random_hidden(tokens, layer.config.hidden_size, seed=tokens)
    with torch.no_grad():
        want = layer(x)
    got = fast(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", TOKENS)
def test_routing_decisions_are_deamoe_trt_routing(pair, tokens):
    """The kernel routes natively; deamoe_trt.routing is the reference for every decision."""
    layer, fast = pair
    x = random_hidden(tokens, layer.config.hidden_size, seed=100 + tokens)
    want, got = layer.route(x), fast.route(x)
    _assert_same_routing(got, want)


def _assert_same_routing(got, want):
    assert torch.equal(got.expert_ids, want.expert_ids)
    assert torch.equal(got.kept_departments, want.kept_departments)
    assert torch.equal(got.department_ids, want.department_ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-6, atol=1e-7)


ROUTING_VARIANTS = {
    "softmax-max-norm": {},
    "softmax-sum-no-norm": {"department_score": "sum", "norm_topk_prob": False},
    "softmax-sum_top2-scaled": {"department_score": "sum_top2", "routed_scaling_factor": 2.5},
    "sigmoid-bias-sum_top2": {"score_func": "sigmoid", "router_bias": True, "department_score": "sum_top2"},
    "sigmoid-max-no-norm": {"score_func": "sigmoid", "norm_topk_prob": False, "top_k": 3, "top_departments": 3},
    "one-department": {"num_departments": 1, "experts_per_department": 16, "top_departments": 1},
}


@pytest.mark.parametrize("variant", list(ROUTING_VARIANTS))
def test_native_routing_over_many_tokens(variant):
    config = PRESETS["tiny"].replace(**ROUTING_VARIANTS[variant])
    layer = DeaMoELayer.random(config, seed=8)
    fast = cpu.CpuDeaMoE(layer)
    logits = 3 * torch.randn(500, config.num_experts, generator=torch.Generator().manual_seed(1))
    bias = layer.router.bias.detach() if layer.router.bias is not None else None
    _assert_same_routing(fast.native_route(logits), route_logits(logits, bias, config))


@pytest.mark.parametrize("variant", ["softmax-max-norm", "softmax-sum_top2-scaled", "sigmoid-bias-sum_top2"])
def test_native_routing_breaks_ties_as_the_reference(variant):
    """Integer logits make many exact ties, at both stages: the lower index wins in both.

    (Not for department_score "sum": whether two departments holding the same scores in a
    different order tie depends on the order of a float sum, in the reference too.)"""
    config = PRESETS["tiny"].replace(**ROUTING_VARIANTS[variant])
    layer = DeaMoELayer.random(config, seed=8)
    if layer.router.bias is not None:
        with torch.no_grad():
            layer.router.bias.zero_()
    fast = cpu.CpuDeaMoE(layer)
    logits = torch.randint(-2, 3, (300, config.num_experts), generator=torch.Generator().manual_seed(2)).float()
    bias = layer.router.bias.detach() if layer.router.bias is not None else None
    _assert_same_routing(fast.native_route(logits), route_logits(logits, bias, config))


def test_torch_routing_mode_matches_reference():
    layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=3)
    x = random_hidden(5, layer.config.hidden_size, seed=5)
    fast = cpu.CpuDeaMoE(layer, routing="torch")
    with torch.no_grad():
        want = layer(x)
    torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-5)
    _assert_same_routing(fast.route(x), layer.route(x))
    with pytest.raises(UsageError, match="routing must be one of"):
        cpu.CpuDeaMoE(layer, routing="magic")


def test_forward_routed_takes_the_given_routing(pair):
    layer, fast = pair
    x = random_hidden(5, layer.config.hidden_size, seed=7)
    routing = layer.route(x)
    with torch.no_grad():
        want = layer.forward_routed(x, routing)
    torch.testing.assert_close(fast.forward_routed(x, routing), want, rtol=1e-5, atol=1e-5)


def test_deterministic(pair):
    layer, fast = pair
    x = random_hidden(17, layer.config.hidden_size, seed=11)
    assert torch.equal(fast(x), fast(x))


@pytest.mark.parametrize("tokens", (1, 17))
def test_one_and_two_threads_give_the_same_bits(tokens):
    layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=5)
    x = random_hidden(tokens, layer.config.hidden_size, seed=1)
    one, two = cpu.CpuDeaMoE(layer, threads=1)(x), cpu.CpuDeaMoE(layer, threads=2)(x)
    assert torch.equal(one, two)
    with torch.no_grad():
        torch.testing.assert_close(two, layer(x), rtol=1e-5, atol=1e-5)


def test_sliced_steps_and_per_thread_jobs_alternate_on_one_pool():
    """Layer steps (slices claimed from a counter: a worker may wake after the caller has done
    them all) and per-thread jobs (the roof probe's read) back to back on one pool: every
    result stays right, nothing hangs."""
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=4)
    fast = cpu.CpuDeaMoE(layer, threads=2)
    xs = [random_hidden(1 + i % 3, layer.config.hidden_size, seed=i) for i in range(6)]
    with torch.no_grad():
        want = [fast(x) for x in xs]
    buf = torch.ones(64 * 2 * 16)
    for i in range(300):
        if i % 7 == 0:
            time.sleep(0.0002)  # let the worker fall asleep now and then
        assert torch.equal(fast(xs[i % 6]), want[i % 6])
        assert fast.pool.lib.dm_stream_read(fast.pool.handle, buf.data_ptr(), buf.numel()) == buf.numel()


def test_thread_counts_agree():
    layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=5)
    x = random_hidden(9, layer.config.hidden_size, seed=1)
    one, three = cpu.CpuDeaMoE(layer, threads=1)(x), cpu.CpuDeaMoE(layer, threads=3)(x)
    torch.testing.assert_close(one, three, rtol=1e-5, atol=1e-6)


def test_expanded_twin_gives_the_same_outputs():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=2)
    x = random_hidden(6, layer.config.hidden_size, seed=2)
    torch.testing.assert_close(cpu.CpuDeaMoE(layer.expanded())(x), cpu.CpuDeaMoE(layer)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny", "deepseek-style"])
def test_fp16_weights(name):
    """fp16 weights are widened to fp32 in the kernel: compare with the fp32 math on the same weights."""
    layer = DeaMoELayer.random(CONFIGS[name], seed=4, dtype=torch.float16)
    x = random_hidden(3, layer.config.hidden_size, seed=4)
    reference = DeaMoELayer(layer.config)
    reference.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    with torch.no_grad():
        want = reference(x)
    got = cpu.CpuDeaMoE(layer)(x)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    half = cpu.CpuDeaMoE(layer)(x.half())
    assert half.dtype == torch.float16


def test_stack_matches_reference():
    stack = DeaMoEStack.random(PRESETS["tiny"], 3, seed=1)
    x = random_hidden(4, 64, seed=9)
    with torch.no_grad():
        want = stack(x)
    torch.testing.assert_close(cpu.CpuDeaMoEStack(stack)(x), want, rtol=1e-5, atol=1e-5)


def test_leading_dimensions_are_kept():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0)
    x = random_hidden(6, 64, seed=0).reshape(2, 3, 64)
    with torch.no_grad():
        want = layer(x)
    torch.testing.assert_close(cpu.CpuDeaMoE(layer)(x), want, rtol=1e-5, atol=1e-5)


def test_bf16_is_refused_in_one_line():
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0, dtype=torch.bfloat16)
    with pytest.raises(UsageError, match="float32 or float16"):
        cpu.CpuDeaMoE(layer)


def test_wrong_hidden_size_is_a_usage_error():
    fast = cpu.CpuDeaMoE(DeaMoELayer.random(PRESETS["tiny"], seed=0))
    with pytest.raises(UsageError, match=r"\[\.\.\., 64\]"):
        fast(torch.zeros(2, 63))


def _vma_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding address (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_weight_memory_is_aligned_fresh_and_advised_as_huge_pages():
    from deamoe_trt.cpu.runtime import _Buffer

    libc = ctypes.CDLL(None, use_errno=True)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # What a model build does before packing: big temporary tensors freed (glibc then serves
    # blocks of that size from its heap), heap memory written and freed.
    libc.free(libc.malloc(16 << 20))
    scratch = libc.malloc(12 << 20)
    ctypes.memset(scratch, 1, 12 << 20)
    libc.free(scratch)
    buf = _Buffer((3 << 20) + 5)
    assert buf.ptr % (2 << 20) == 0
    # Fresh: not one page resident before the packer writes it (pages of the C heap that an
    # earlier allocation had faulted in would stay 4 KiB pages whatever the advice).
    pages = ((3 << 20) + 5 + 4095) // 4096
    resident = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(buf.ptr), ctypes.c_size_t(pages * 4096), resident) == 0
    assert not any(b & 1 for b in resident)
    assert "hg" in _vma_flags(buf.ptr)  # advised as huge pages
    ctypes.memset(buf.ptr, 7, buf.nbytes)  # every byte is ours to write
    assert ctypes.string_at(buf.ptr + buf.nbytes - 1, 1) == b"\x07"
    del buf  # unmapped with its size: no crash, no leak of the 2 MiB rounding


def test_stream_read_measures_a_rate():
    rates = cpu.stream_read(8 << 20, 2)
    assert len(rates) == 2 and all(r > 0 for r in rates)


def test_missing_compiler_is_one_clear_line(monkeypatch, tmp_path):
    from deamoe_trt import native
    from deamoe_trt.cpu import _build

    monkeypatch.setenv("DEAMOE_TRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match="needs a C\\+\\+ compiler") as info:
        _build.build(force=True)
    assert "\n" not in str(info.value)


def test_build_is_cached_by_source_and_flags(monkeypatch, tmp_path):
    from deamoe_trt.cpu import _build

    monkeypatch.setenv("DEAMOE_TRT_CACHE_DIR", str(tmp_path))
    cxx = _build.compiler()
    path = _build.library_path(cxx)
    assert path.is_relative_to(tmp_path)
    monkeypatch.setattr(_build, "FLAGS", (*_build.FLAGS, "-DDEAMOE_TEST_FLAG"))
    assert _build.library_path(cxx) != path


@pytest.mark.slow
def test_new_pools_never_miss_their_first_job():
    """A job issued before a worker thread has started must still run (it once hung)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from deamoe_trt import cpu\n"
        "buf = torch.ones(64 * 5 * 16)\n"
        "for i in range(200):\n"
        "    p = cpu.Pool(5)\n"
        "    assert p.lib.dm_stream_read(p.handle, buf.data_ptr(), buf.numel()) == buf.numel()\n"
        "    del p\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("variant", list(ROUTING_VARIANTS))
def test_native_routing_of_nonfinite_tokens(variant):
    """Logit rows with NaN and +-Inf route as deamoe_trt.routing says (lowest-index
    departments and experts when a selection score is not finite); finite rows are untouched."""
    config = PRESETS["tiny"].replace(**ROUTING_VARIANTS[variant])
    layer = DeaMoELayer.random(config, seed=8)
    fast = cpu.CpuDeaMoE(layer)
    logits = torch.randn(8, config.num_experts, generator=torch.Generator().manual_seed(3))
    logits[1] = NAN
    logits[2, 5] = NAN
    logits[3, 0] = INF
    logits[4, -1] = -INF
    logits[5] = -INF
    logits[6, 2], logits[6, 7] = INF, -INF
    bias = layer.router.bias.detach() if layer.router.bias is not None else None
    got, want = fast.native_route(logits), route_logits(logits, bias, config)
    assert torch.equal(got.expert_ids, want.expert_ids)
    assert torch.equal(got.kept_departments, want.kept_departments)
    torch.testing.assert_close(got.weights, want.weights, rtol=1e-6, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_nonfinite_tokens_keep_to_themselves(name):
    """A token with NaN/Inf hidden values: non-finite output where the reference's math is,
    every other token's output as without it."""
    layer = DeaMoELayer.random(CONFIGS[name], seed=4)
    fast = cpu.CpuDeaMoE(layer)
    x = random_hidden(5, layer.config.hidden_size, seed=6)
    good = [0, 2, 4]
    alone = fast(x[good])
    for bad in (NAN, INF, -INF):
        x[1, 3], x[3] = bad, bad
        with torch.no_grad():
            reference = layer.forward_routed(x, layer.route(x))
        y = fast(x)
        assert torch.equal(torch.isfinite(y).all(dim=1), torch.isfinite(reference).all(dim=1))
        assert torch.equal(y[good], alone)
        torch.testing.assert_close(y[good], reference[good], rtol=1e-5, atol=1e-5)


def test_float32_router_in_fp16_layer():
    """Spec "Router precision": the router weight stays float32 in an fp16 layer; the kernel
    reads it as float32 (its logits are the float32 ones) and routes as the reference."""
    layer = DeaMoELayer.random(CONFIGS["deepseek-style"], seed=4).to(torch.float16)
    assert layer.router_dtype == torch.float32 and layer.dtype == torch.float16
    fast = cpu.CpuDeaMoE(layer)
    x = random_hidden(9, layer.config.hidden_size, seed=5)
    torch.testing.assert_close(fast.logits(x), x @ layer.router.weight.t(), rtol=1e-5, atol=1e-5)
    _assert_same_routing(fast.route(x), layer.route(x))
