import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs import deepseek_style
from deamoe_trt import PRESETS, CheckpointError, DeaMoELayer, DeaMoEStack, UsageError
from deamoe_trt.checkpoint import read_header
from deamoe_trt.inputs import random_hidden

DEEPSEEK_STYLE = deepseek_style(hidden_size=64, routed_scaling_factor=1.0, shared_expert_intermediate_size=16)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_round_trips_through_save_and_load(tmp_path, dtype):
    layer = DeaMoELayer.random(DEEPSEEK_STYLE, seed=1, dtype=dtype)
    layer.save_pretrained(tmp_path / "ckpt")
    loaded = DeaMoELayer.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == layer.config and loaded.dtype == dtype
    for name, tensor in layer.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    x = random_hidden(3, 64, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(loaded(x), layer(x))


def test_stack_round_trips_and_single_layer_load_needs_an_index(tmp_path):
    stack = DeaMoEStack.random(PRESETS["tiny"], 3, seed=2)
    stack.save_pretrained(tmp_path)
    assert read_header(tmp_path)["num_layers"] == 3
    assert set(load_file(tmp_path / "model.safetensors")) == {
        f"layers.{i}.{name}" for i in range(3) for name in stack.layers[0].state_dict()
    }
    with pytest.raises(UsageError, match="holds 3 layers"):
        DeaMoELayer.from_pretrained(tmp_path)
    second = DeaMoELayer.from_pretrained(tmp_path, layer=1)
    assert torch.equal(second.router.weight, stack.layers[1].router.weight)


@pytest.fixture
def checkpoint(tmp_path):
    DeaMoELayer.random(PRESETS["tiny"]).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _rewrite_config(path, **changes):
    header = json.loads((path / "config.json").read_text())
    header.update(changes)
    (path / "config.json").write_text(json.dumps(header))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda p: (p / "config.json").unlink(), "no config.json"),
        (lambda p: (p / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda p: (p / "config.json").write_text("{"), "not valid JSON"),
        (lambda p: _rewrite_config(p, format="other"), "not a deamoe-trt checkpoint"),
        (lambda p: _rewrite_config(p, num_layers=2), "lacks"),
        (lambda p: _rewrite_config(p, dtype="float16"), "is float32 but config.json says float16"),
        (lambda p: _rewrite_config(p, config={**PRESETS["tiny"].to_dict(), "top_k": 99}), "top_k"),
        (lambda p: _rewrite_config(p, config={**PRESETS["tiny"].to_dict(), "hidden_size": 32}), "has shape"),
        (
            lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:5000]),
            "truncated or corrupt",
        ),
        (lambda p: (p / "model.safetensors").write_bytes(b"\x00" * 64), "truncated or corrupt"),
    ],
)
def test_broken_checkpoints_get_one_clear_error(checkpoint, corrupt, message):
    corrupt(checkpoint)
    with pytest.raises(CheckpointError, match=message) as info:
        DeaMoEStack.from_pretrained(checkpoint)
    assert "\n" not in str(info.value)


def test_nan_weights_are_rejected(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["layers.0.experts.down"][0, 0, 0] = float("nan")
    save_file(tensors, checkpoint / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers\.0\.experts\.down contains NaN"):
        DeaMoEStack.from_pretrained(checkpoint)


def test_extra_tensors_are_rejected(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["layers.0.router.bias"] = torch.zeros(16)
    save_file(tensors, checkpoint / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"does not describe, first layers\.0\.router\.bias"):
        DeaMoEStack.from_pretrained(checkpoint)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        DeaMoEStack.from_pretrained(tmp_path / "nope")


def test_failed_save_leaves_no_partial_files(tmp_path, monkeypatch):
    import deamoe_trt.checkpoint as checkpoint_module

    def broken_save(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        DeaMoELayer.random(PRESETS["tiny"]).save_pretrained(tmp_path / "ckpt")
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_router_precision_round_trips_and_old_checkpoints_load(tmp_path):
    """A bf16 layer with a float32 router saves "router_dtype" and loads it back bit-exact; a
    checkpoint written before (bias in the layer dtype, no router_dtype) still loads."""
    config = PRESETS["tiny"].replace(score_func="sigmoid", router_bias=True)
    layer = DeaMoELayer.random(config, seed=2).to(torch.bfloat16)
    layer.save_pretrained(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "config.json").read_text())["router_dtype"] == "float32"
    loaded = DeaMoELayer.from_pretrained(tmp_path / "new")
    assert loaded.router_dtype == torch.float32 and loaded.dtype == torch.bfloat16
    assert torch.equal(loaded.router.weight, layer.router.weight)
    assert torch.equal(loaded.router.bias, layer.router.bias)

    # The format before: every tensor, the bias too, in the header's dtype.
    old = DeaMoELayer.random(config, seed=3, dtype=torch.bfloat16)
    old.save_pretrained(tmp_path / "old")
    weights = tmp_path / "old" / "model.safetensors"
    tensors = load_file(weights)
    tensors["layers.0.router.bias"] = tensors["layers.0.router.bias"].bfloat16()
    save_file(tensors, weights)
    header = json.loads((tmp_path / "old" / "config.json").read_text())
    assert "router_dtype" not in header
    back = DeaMoELayer.from_pretrained(tmp_path / "old")
    assert back.router.bias.dtype == torch.float32
    assert torch.equal(back.router.bias, old.router.bias.bfloat16().float())


def test_biased_clamped_layer_round_trips_and_old_configs_read_unchanged(tmp_path):
    from configs import GPT_OSS_STYLE

    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=4, dtype=torch.float16)
    layer.save_pretrained(tmp_path / "ckpt")
    loaded = DeaMoELayer.from_pretrained(tmp_path / "ckpt")
    assert loaded.config == GPT_OSS_STYLE
    for name, tensor in layer.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
