"""deamoe_trt.runtimes: the registry lists every runtime, on any machine, and each one that
cannot run here says why in one line, and refuses to prepare with that reason."""

import pytest
import torch

from deamoe_trt import PRESETS, DeaMoELayer, MissingDependencyError, UsageError, runtimes


def test_names_lists_every_runtime_and_get_returns_it():
    assert runtimes.names() == ("torch", "cpu", "cuda", "cuda-emulated", "ort", "tensorrt")
    for name in runtimes.names():
        runtime = runtimes.get(name)
        assert runtime.name == name and runtime.label and runtime.dtypes


def test_an_unknown_name_is_one_line_naming_the_choices():
    choices = "torch, cpu, cuda, cuda-emulated, ort, tensorrt"
    with pytest.raises(UsageError, match=f"unknown runtime 'nope'; choose one of: {choices}"):
        runtimes.get("nope")


@pytest.mark.parametrize("name", runtimes.names())
def test_availability_is_none_or_one_line_and_an_unavailable_runtime_refuses_to_prepare(name):
    runtime = runtimes.get(name)
    reason = runtime.available()
    if reason is None:
        return
    assert isinstance(reason, str) and reason.strip() and "\n" not in reason
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0, dtype=torch.float16)
    with pytest.raises(MissingDependencyError) as caught:
        runtime.prepare(layer)
    assert reason in str(caught.value)


def test_the_gpu_runtimes_say_what_is_missing_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert "CUDA GPU" in runtimes.get("cuda").available()
    assert runtimes.get("tensorrt").available() is not None


@pytest.mark.parametrize("name", ["cpu", "ort"])
def test_a_dtype_the_runtime_does_not_run_is_one_line(name):
    runtime = runtimes.get(name)
    if reason := runtime.available():
        pytest.skip(reason)
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=0, dtype=torch.bfloat16)
    with pytest.raises(UsageError, match="not bf16"):
        runtime.prepare(layer)


def test_a_runtime_without_a_decoder_says_so():
    from deamoe_trt.runtimes.base import RuntimeBase

    class LayersOnly(RuntimeBase):
        label = "layers only"

    with pytest.raises(UsageError, match="layers only does not decode language models"):
        LayersOnly().decoder(None)


def test_the_cuda_runtime_refuses_to_decode_without_a_gpu_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(MissingDependencyError, match="needs a CUDA GPU") as caught:
        runtimes.get("cuda").decoder(None)
    assert "\n" not in str(caught.value)


# ---- capabilities: what each runtime declares, and the choices derived from them ------------


def _overrides(runtime, method: str) -> bool:
    from deamoe_trt.runtimes.base import RuntimeBase

    return getattr(type(runtime), method) is not getattr(RuntimeBase, method)


@pytest.mark.parametrize("name", runtimes.names())
def test_each_runtime_declares_what_it_implements(name):
    """decoding: it has its own decoder (RuntimeBase's refuses); batched: its own batch_decoder
    (RuntimeBase's steps pooled decoders in turn); dtypes: the ones check_dtype accepts."""
    runtime = runtimes.get(name)
    c = runtime.capabilities
    assert c.decoding == _overrides(runtime, "decoder")
    assert c.batched == _overrides(runtime, "batch_decoder")
    assert runtime.dtypes == c.dtypes and set(c.bits) <= {0, 4, 8} and 0 in c.bits
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        if dtype in c.dtypes:
            runtime.check_dtype(dtype)
        else:
            with pytest.raises(UsageError):
                runtime.check_dtype(dtype)


def test_names_filter_by_capability_in_the_registry_order():
    every = runtimes.names()
    for ability in ("layers", "decoding", "batched"):
        chosen = runtimes.names(can=ability)
        assert chosen == tuple(n for n in every if getattr(runtimes.get(n).capabilities, ability))
    assert runtimes.names(can="batched") == ("cpu", "cuda", "cuda-emulated")
    assert runtimes.names(gpu=True) == ("cuda", "tensorrt")
    assert runtimes.names(can="decoding", gpu=False, reference=False, emulated=False) == ("cpu", "ort")
    with pytest.raises(UsageError, match="unknown ability 'flying'"):
        runtimes.names(can="flying")


def test_an_older_name_reaches_the_same_runtime():
    assert runtimes.get("trt") is runtimes.get("tensorrt")


def test_the_commands_offer_the_runtimes_the_registry_lists():
    from deamoe_trt.bench import lm_bench
    from deamoe_trt.cli.main import build_parser

    parser = build_parser()
    generate = next(a for a in parser._subparsers._group_actions[0].choices["generate"]._actions if a.dest == "runtime")
    assert tuple(generate.choices) == runtimes.names(can="decoding")
    assert lm_bench.RUNTIMES == ("cpu", "cpu-native", "ort")
    assert lm_bench.BATCH_RUNTIMES == ("cpu-native", "cuda", "cuda-emulated")


def test_the_layer_benchmarks_contenders_run_layers_on_the_cpu_at_speed():
    from deamoe_trt.bench.options import PRIORITY

    used = {name.split("/")[1] for name in PRIORITY}
    assert used == set(runtimes.names(can="layers", gpu=False, emulated=False))
