import json

import pytest
import torch

from deamoe_trt.errors import CheckpointError
from deamoe_trt.layer import DeaMoEStack
from deamoe_trt.lm import ByteTokenizer, load_lm, save_lm
from deamoe_trt.presets import get_preset


def test_round_trip_keeps_weights_tokenizer_and_training_notes(tmp_path, micro_model):
    tok = ByteTokenizer(alphabet="abc\n")
    save_lm(micro_model, tmp_path / "m", tokenizer=tok, training={"steps": 3})
    loaded = load_lm(tmp_path / "m")
    assert loaded.tokenizer == tok
    assert loaded.training == {"steps": 3}
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, micro_model(ids).logits, atol=0, rtol=0)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_lm(tmp_path / "nowhere")


def test_missing_weights(micro_checkpoint):
    (micro_checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has config\.json but no model\.safetensors"):
        load_lm(micro_checkpoint)


def test_truncated_weights(micro_checkpoint):
    path = micro_checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_lm(micro_checkpoint)


def test_bad_json_and_wrong_format(micro_checkpoint, tmp_path):
    config = micro_checkpoint / "config.json"
    config.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_lm(micro_checkpoint)
    config.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not a deamoe-trt model checkpoint"):
        load_lm(micro_checkpoint)
    DeaMoEStack.random(get_preset("tiny"), 1).save_pretrained(tmp_path / "layer")
    with pytest.raises(CheckpointError, match="is a DeaMoE layer checkpoint, not a language model"):
        load_lm(tmp_path / "layer")


def test_config_that_does_not_match_the_weights(micro_checkpoint):
    config = micro_checkpoint / "config.json"
    header = json.loads(config.read_text())
    header["config"]["num_layers"] = 3
    config.write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match=r"lacks .* tensor"):
        load_lm(micro_checkpoint)
    header["config"]["num_layers"] = 2
    header["config"]["vocab_size"] = 300
    config.write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match="tokenizer vocab_size 256 differs"):
        load_lm(micro_checkpoint)


def test_read_tells_each_artifact_apart_and_loads_weights_only_when_asked(tmp_path, micro_checkpoint):
    from safetensors.torch import load_file

    from deamoe_trt.lm.checkpoint import read

    layer = DeaMoEStack.random(get_preset("tiny"), 1, seed=1)
    layer.save_pretrained(tmp_path / "layer")
    stack = DeaMoEStack.random(get_preset("tiny"), 3, seed=2)
    stack.save_pretrained(tmp_path / "stack")
    found = {name: read(path) for name, path in [("layer", tmp_path / "layer"), ("stack", tmp_path / "stack")]}
    found["lm"] = read(micro_checkpoint)
    assert {name: c.artifact for name, c in found.items()} == {"layer": "layer", "stack": "stack", "lm": "lm"}
    assert found["stack"].num_layers == 3 and found["stack"].config == get_preset("tiny")
    assert found["lm"].config == load_lm(micro_checkpoint).model.config
    # Weights are read only when asked: a checkpoint whose weights are gone still reads.
    weights = found["stack"].tensors()
    assert weights.keys() == load_file(tmp_path / "stack" / "model.safetensors").keys()
    (tmp_path / "stack" / "model.safetensors").rename(tmp_path / "kept")
    assert read(tmp_path / "stack").artifact == "stack"
    (tmp_path / "kept").rename(tmp_path / "stack" / "model.safetensors")
    torch.testing.assert_close(found["stack"].stack().layers[2].router.weight, stack.layers[2].router.weight)
    ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        torch.testing.assert_close(
            found["lm"].lm().model(ids).logits, load_lm(micro_checkpoint).model(ids).logits, atol=0, rtol=0
        )


def test_read_refuses_the_other_artifact_in_one_line(tmp_path, micro_checkpoint):
    from deamoe_trt.lm.checkpoint import read

    DeaMoEStack.random(get_preset("tiny"), 2, seed=3).save_pretrained(tmp_path / "stack")
    with pytest.raises(CheckpointError, match=r"holds a stack of layers; `deamoe-trt generate` takes a language model"):
        read(tmp_path / "stack").expect("lm", command="generate")
    with pytest.raises(CheckpointError, match="holds a language model; this needs a layer or stack"):
        read(micro_checkpoint).stack()
    with pytest.raises(CheckpointError, match="is a DeaMoE layer checkpoint, not a language model"):
        load_lm(tmp_path / "stack")
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        read(tmp_path)
