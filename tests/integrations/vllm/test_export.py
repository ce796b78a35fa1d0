"""`deamoe-trt export-vllm`: the directory's config, weights and tokenizer, and the refusals
that leave nothing behind. No vLLM needed."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from deamoe_trt.cli.main import main
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.lm.tokenizer import PRINTABLE_ASCII

from .conftest import CONVERTED_LM, TINY_LM


def cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err.strip().splitlines()


def test_export_vllm_writes_the_config_vllm_reads_and_the_lm_config(tmp_path, capsys):
    code, out, err = cli(capsys, "export-vllm", TINY_LM, "-o", tmp_path / "vllm")
    assert code == 0 and not err and "vllm" in out[0]
    hf = json.loads((tmp_path / "vllm" / "config.json").read_text())
    lm = load_lm(TINY_LM).model.config
    assert hf["architectures"] == ["DeaMoEForCausalLM"] and hf["model_type"] == "deamoe"
    assert (hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]) == (128, 3, 4)
    assert (hf["num_key_value_heads"], hf["head_dim"], hf["max_position_embeddings"]) == (2, 32, 256)
    assert hf["dtype"] == "float32" and "sliding_window" not in hf
    assert hf["deamoe_lm"] == lm.to_dict()


def test_export_vllm_weights_are_the_checkpoints_tensors(tmp_path, capsys):
    assert cli(capsys, "export-vllm", CONVERTED_LM, "-o", tmp_path / "vllm")[0] == 0
    written = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    source = load_file(str(CONVERTED_LM / "model.safetensors"))
    assert written.keys() == source.keys()
    for name, tensor in source.items():
        assert torch.equal(written[name], tensor), name


def test_export_vllm_twins_hold_the_twins_tensors(tmp_path, capsys):
    assert cli(capsys, "export-vllm", TINY_LM, "-o", tmp_path / "vanilla", "--twin", "vanilla")[0] == 0
    hf = json.loads((tmp_path / "vanilla" / "config.json").read_text())
    vanilla = load_lm(TINY_LM).model.vanilla()
    assert hf["deamoe_lm"]["moe"]["num_departments"] == 1 == vanilla.config.moe.num_departments
    written = load_file(str(tmp_path / "vanilla" / "model.safetensors"))
    assert torch.equal(written["layers.0.mlp.experts.gate_up"], vanilla.state_dict()["layers.0.mlp.experts.gate_up"])


def test_export_vllm_byte_tokenizer_splits_text_into_the_byte_ids(tmp_path, capsys):
    from tokenizers import Tokenizer

    assert cli(capsys, "export-vllm", TINY_LM, "-o", tmp_path / "vllm")[0] == 0
    hf = Tokenizer.from_file(str(tmp_path / "vllm" / "tokenizer.json"))
    text = PRINTABLE_ASCII + "  two spaces\n"
    assert hf.encode(text).ids == load_lm(TINY_LM).tokenizer.encode(text)
    settings = json.loads((tmp_path / "vllm" / "tokenizer_config.json").read_text())
    assert "chat_template" in settings


def refused(capsys, tmp_path, checkpoint, needle):
    target = tmp_path / "out"
    code, _, err = cli(capsys, "export-vllm", checkpoint, "-o", target)
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not target.exists() or not any(target.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging left
    return err[0]


def test_export_vllm_of_a_quantize_checkpoint_writes_compressed_tensors(tmp_path, capsys):
    quantize = ("quantize", TINY_LM, "-o", tmp_path / "int8", "--bits", 8, "--group-size", 32, "--no-compare")
    assert cli(capsys, *quantize)[0] == 0
    code, _, err = cli(capsys, "export-vllm", tmp_path / "int8", "-o", tmp_path / "vllm")
    assert code == 0 and not err, err
    hf = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert hf["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 8
    assert hf["deamoe_lm"]["quantization"]["bits"] == 8
    written = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert written["layers.0.mlp.departments.0.gate_proj.weight_packed"].dtype == torch.int32


def test_export_vllm_refuses_a_clamped_swiglu_vllm_does_not_compute_in_one_line(tmp_path, capsys):
    config = load_lm(TINY_LM).model.config
    config = config.replace(moe=config.moe.replace(activation="swiglu_clamped", swiglu_limit=5.0))
    DeaMoELM.random(config).save_pretrained(tmp_path / "clamped")
    refused(capsys, tmp_path, tmp_path / "clamped", "limit 5.0 is not served by the vLLM plugin")


def test_export_vllm_refuses_a_file_in_the_way(tmp_path, capsys):
    (tmp_path / "out").write_text("not a folder")
    code, _, err = cli(capsys, "export-vllm", TINY_LM, "-o", tmp_path / "out")
    assert code == 2 and len(err) == 1 and "out" in err[0]
    assert (tmp_path / "out").read_text() == "not a folder"


def test_export_vllm_over_an_earlier_export_leaves_no_file_of_it(tmp_path, capsys):
    # An earlier export of another model left a second weight shard, which vLLM would load too.
    assert cli(capsys, "export-vllm", TINY_LM, "-o", tmp_path / "vllm")[0] == 0
    (tmp_path / "vllm" / "model-00002-of-00002.safetensors").write_bytes(b"stale")
    code, _, err = cli(capsys, "export-vllm", CONVERTED_LM, "-o", tmp_path / "vllm")
    assert code == 0 and len(err) == 1 and "replaced" in err[0], err
    assert cli(capsys, "export-vllm", CONVERTED_LM, "-o", tmp_path / "fresh")[0] == 0
    names = sorted(p.name for p in (tmp_path / "vllm").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fresh").iterdir())
    for name in names:
        assert (tmp_path / "vllm" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "vllm"]  # no temporary left
