"""`deamoe-trt export-hf` and `import-hf` of its directory: the Hugging Face layout (config,
shards with their index, tokenizer, generation config, remote code) and a bit-exact round trip.
No transformers needed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from configs import MICRO_LM, QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.export.hf import write_hf_dir
from deamoe_trt.hf.remote_code import AUTO_MAP, remote_code
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.lm.tokenizer import default_tokenizer
from deamoe_trt.quant import QuantConfig


def cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def test_export_hf_then_import_hf_gives_back_every_tensor_bit_for_bit(tmp_path, capsys):
    # bfloat16 with a float32 router: the dtypes travel per tensor
    lm = DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(float32_router=True), seed=4, dtype=torch.bfloat16)
    lm.save_pretrained(tmp_path / "ckpt")
    code, out, err = cli(capsys, "export-hf", tmp_path / "ckpt", "-o", tmp_path / "hf")
    assert code == 0 and not err and "Hugging Face model directory" in out[0], err
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "back")
    assert code == 0 and not err, err
    back = load_lm(tmp_path / "back").model
    assert back.config == lm.config
    want, got = lm.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert want[name].dtype == got[name].dtype and torch.equal(want[name], got[name]), name


def test_the_directory_is_in_hugging_face_layout(tmp_path):
    lm = DeaMoELM.random(MICRO_LM, seed=1)
    directory = write_hf_dir(lm, default_tokenizer(256), tmp_path / "hf", max_shard_bytes=16384)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "deamoe" and config["architectures"] == ["DeaMoEForCausalLM"]
    assert config["auto_map"] == AUTO_MAP and config["deamoe_lm"] == lm.config.to_dict()
    assert (config["hidden_size"], config["num_hidden_layers"], config["dtype"]) == (32, 2, "float32")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted({*index["weight_map"].values()})
    assert len(shards) > 1 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    stored = {}
    for shard in shards:
        stored.update(load_file(str(directory / shard)))
    assert stored.keys() == index["weight_map"].keys()
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in stored.values())
    state = lm.state_dict()
    assert torch.equal(stored["lm_head.weight"], state["lm_head.weight"])
    assert torch.equal(stored["model.layers.1.mlp.router.weight"], state["layers.1.mlp.router.weight"])
    assert len(stored) == len(state)
    for name, text in remote_code().items():
        assert (directory / name).read_text() == text
    assert (directory / "tokenizer.json").is_file() and (directory / "generation_config.json").is_file()


def test_a_quantized_model_is_refused_in_one_line(tmp_path):
    lm = DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=1).quantized(QuantConfig(bits=4, group_size=16))
    with pytest.raises(UsageError, match="export-hf writes floating-point models; this one is quantized"):
        write_hf_dir(lm, default_tokenizer(256), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_import_hf_refuses_tensors_that_do_not_match_the_config_in_one_line(tmp_path, capsys):
    write_hf_dir(DeaMoELM.random(MICRO_LM, seed=1), default_tokenizer(256), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["deamoe_lm"]["moe"]["private_intermediate_size"] = 16  # the tensors hold 8
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "back")
    assert code == 2 and len(err) == 1 and "has shape [4, 16, 32], but config.json implies [4, 32, 32]" in err[0]
    assert not (tmp_path / "back").exists()


def test_an_export_over_an_earlier_one_leaves_no_file_of_it(tmp_path, capsys):
    # A single model.safetensors left beside the new shards' index (as an exporter writing one
    # file leaves it) is what transformers would load first: no file of the earlier export stays.
    for seed, name in ((1, "first"), (2, "second")):
        DeaMoELM.random(MICRO_LM, seed=seed).save_pretrained(tmp_path / name)
    assert cli(capsys, "export-hf", tmp_path / "first", "-o", tmp_path / "hf")[0] == 0
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"stale")
    code, _, err = cli(capsys, "export-hf", tmp_path / "second", "-o", tmp_path / "hf")
    assert code == 0 and len(err) == 1 and "replaced" in err[0], err
    assert cli(capsys, "export-hf", tmp_path / "second", "-o", tmp_path / "fresh")[0] == 0
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fresh").iterdir())
    for name in names:
        if (tmp_path / "hf" / name).is_file():
            assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "fresh", "hf", "second"]  # no temporary left
