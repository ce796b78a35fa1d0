"""Runtime.load / load_decoder: a saved artifact (a checkpoint directory, an ONNX export) opened
by the runtime runs as the module it holds does; and the CPU kernel's stack of layers prepared
one at a time runs as the stack."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt import PRESETS, CheckpointError, DeaMoELayer, DeaMoEStack, runtimes
from deamoe_trt.inputs import random_hidden
from deamoe_trt.runtimes.expected import TOLERANCE, relative_error


def _reference(module, x):
    with torch.no_grad():
        return module(x)


def test_a_layer_checkpoint_loads_on_torch_as_the_layer(tmp_path):
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=3)
    DeaMoEStack.from_layers([layer]).save_pretrained(tmp_path / "ckpt")
    loaded = runtimes.get("torch").load(tmp_path / "ckpt")
    x = random_hidden(5, 64, seed=1)
    assert torch.equal(loaded(x), _reference(layer, x))


def test_an_exported_layer_loads_on_onnx_runtime(tmp_path):
    from deamoe_trt.export import export

    ort = runtimes.get("ort")
    if reason := ort.available():
        pytest.skip(reason)
    layer = DeaMoELayer.random(PRESETS["tiny"], seed=4)
    path = export(layer, tmp_path / "layer.onnx", "ort", "fp32")
    loaded = ort.load(path, threads=1)
    x = random_hidden(7, 64, seed=2)
    assert relative_error(loaded(x), _reference(layer, x)) < TOLERANCE[torch.float32]


def test_an_exported_language_model_loads_as_a_decoder_with_the_reference_logits(tmp_path):
    import numpy as np

    from deamoe_trt.export.lm import export_lm
    from deamoe_trt.lm import load_lm
    from deamoe_trt.lm.shipped import TINY_LM

    ort = runtimes.get("ort")
    if reason := ort.available():
        pytest.skip(reason)
    model = load_lm(TINY_LM).model
    path = export_lm(model, tmp_path / "lm.onnx", "ort", "fp32")
    ids = list(b"The tiny model ")
    decoder = ort.load_decoder(path, threads=1)
    batch = ort.load_batch_decoder(path, max_sequences=2, threads=1)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].numpy()
    got = decoder.prefill(ids)
    _, got_batch = batch.open(ids)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale < 1e-4 and np.abs(got_batch - want).max() / scale < 1e-4


def test_a_language_model_checkpoint_is_refused_where_a_layer_is_wanted(tmp_path):
    from deamoe_trt.lm.shipped import TINY_LM

    with pytest.raises(CheckpointError, match="holds a language model; this needs a layer or stack of layers"):
        runtimes.get("torch").load(TINY_LM)


def test_the_cpu_kernels_stack_of_layers_prepared_one_at_a_time_runs_as_the_stack():
    cpu = runtimes.get("cpu")
    if reason := cpu.available():
        pytest.skip(reason)
    stack = DeaMoEStack.random(PRESETS["tiny"], 3, seed=5)
    layers = [cpu.prepare(layer, threads=1) for layer in stack.layers]
    prepared = cpu.stack(layers)
    x = random_hidden(4, 64, seed=3)
    assert relative_error(prepared(x), _reference(stack, x)) < TOLERANCE[torch.float32]
    assert prepared.memory_bytes == sum(layer.memory_bytes for layer in layers) > 0
