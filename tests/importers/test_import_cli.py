"""`deamoe-trt import-hf MODEL_DIR -o CKPT --layers-only`: a local HF model's MoE layers to a layer
checkpoint; bad input: one line, exit 2. (The whole-model import: test_hf_lm_cli.py.)"""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from deamoe_trt import DeaMoEStack
from deamoe_trt.checkpoint import read_header
from deamoe_trt.cli.main import main
from deamoe_trt.importers.hf import from_hf_model

from .hf_util import assert_parity, inputs, qwen2_moe_config, randomize_


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A tiny Qwen2-MoE causal LM (layer 0 dense, 1-3 MoE) saved as safetensors; and the model."""
    from transformers import AutoModelForCausalLM

    model = randomize_(AutoModelForCausalLM.from_config(qwen2_moe_config(num_hidden_layers=4, mlp_only_layers=[0])))
    path = tmp_path_factory.mktemp("hf") / "tiny-qwen2-moe"
    model.save_pretrained(path)  # transformers 5 always writes safetensors (4.x: safe_serialization=True)
    assert list(path.glob("*.safetensors")) and not list(path.glob("*.bin"))
    return path, model


def run_cli(capsys, *argv):
    capsys.readouterr()  # drop what came before (e.g. save_pretrained's progress bar)
    code = main(["import-hf", "--layers-only", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_import_hf_writes_a_checkpoint_with_the_models_moe_layers(qwen2_dir, tmp_path, capsys):
    path, model = qwen2_dir
    code, out, err = run_cli(capsys, path, "-o", tmp_path / "ckpt")
    assert code == 0, err
    assert out.startswith("imported 3 MoE layer(s) of qwen2_moe (HF layers 1, 2, 3)") and out.count("\n") == 1
    assert err == ""  # no progress bars or load reports
    header = read_header(tmp_path / "ckpt")
    source = {"hf_model_type": "qwen2_moe", "hf_module": "Qwen2MoeSparseMoeBlock", "layers": [1, 2, 3]}
    assert header["source"] == source
    assert header["dtype"] == "float32"
    stack = DeaMoEStack.from_pretrained(tmp_path / "ckpt")
    direct = from_hf_model(model)
    assert stack.config == direct.config
    for a, b in zip(stack.layers, direct.layers, strict=True):
        for name, tensor in b.state_dict().items():
            torch.testing.assert_close(a.state_dict()[name], tensor, rtol=0, atol=0)
    x = inputs(seed=40)
    with torch.no_grad():
        assert_parity(stack.layers[2](x), model.model.layers[3].mlp(x))


def test_import_hf_layers_and_dtype(qwen2_dir, tmp_path, capsys):
    path, _ = qwen2_dir
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "ckpt", "--layers", "3,1", "--dtype", "bf16")
    assert code == 0, err
    header = read_header(tmp_path / "ckpt")
    assert header["source"]["layers"] == [3, 1] and header["num_layers"] == 2 and header["dtype"] == "bfloat16"


def _write(path, files):
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", r"does not exist"),
        ("file", r"is not a directory"),
        ("no_config", r"has no config\.json"),
        ("bad_json", r"config\.json is not valid JSON"),
        ("llama", r"unsupported Hugging Face model_type 'llama' .*; supported: mixtral, qwen2_moe, qwen3_moe"),
        ("pickle_only", r"has only pickled weights \(pytorch_model\.bin\); deamoe-trt never unpickles"),
        ("no_weights", r"has no \*\.safetensors weights"),
        ("quantized", r"holds quantized weights \(quant_method 'fp8'\); dequantize"),
    ],
)
def test_import_hf_bad_model_dirs_are_one_line_exit_2(tmp_path, capsys, case, message):
    config = json.dumps({"model_type": "qwen2_moe"})
    make = {
        "missing": lambda: tmp_path / "nope",
        "file": lambda: _write(tmp_path, {"model.safetensors": "x"}) / "model.safetensors",
        "no_config": lambda: _write(tmp_path / "m", {"model.safetensors": "x"}),
        "bad_json": lambda: _write(tmp_path / "m", {"config.json": "{"}),
        "llama": lambda: _write(tmp_path / "m", {"config.json": json.dumps({"model_type": "llama"})}),
        "pickle_only": lambda: _write(tmp_path / "m", {"config.json": config, "pytorch_model.bin": "not opened"}),
        "no_weights": lambda: _write(tmp_path / "m", {"config.json": config}),
        "quantized": lambda: _write(
            tmp_path / "m",
            {"config.json": json.dumps({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8"}})},
        ),
    }
    path = make[case]()
    code, out, err = run_cli(capsys, path, "-o", tmp_path / "ckpt")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("deamoe-trt import-hf: error: ")
    assert re.search(message, err), err
    assert not (tmp_path / "ckpt").exists()


def test_import_hf_model_without_moe_layers(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "dense"
    dense = AutoModelForCausalLM.from_config(qwen2_moe_config(num_hidden_layers=2, mlp_only_layers=[0, 1]))
    dense.save_pretrained(path)
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "ckpt")
    assert code == 2 and "has no MoE layers: every layer is dense" in err and err.count("\n") == 1


def test_import_hf_dense_layer_selection_and_bad_layers_flag(qwen2_dir, tmp_path, capsys):
    path, _ = qwen2_dir
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "ckpt", "--layers", "0,2")
    assert code == 2 and "layer 0 is not a MoE layer" in err and "its MoE layers are 1, 2, 3" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["import-hf", str(path), "-o", str(tmp_path / "ckpt"), "--layers", "one"])
    assert exit_info.value.code == 2
    assert "expected 'all' or comma-separated layer indices" in capsys.readouterr().err


def test_import_hf_refuses_to_overwrite_a_non_checkpoint(qwen2_dir, tmp_path, capsys):
    path, _ = qwen2_dir
    code, _, err = run_cli(capsys, path, "-o", path)
    assert code == 2 and "is the input" in err
    _write(tmp_path / "other", {"config.json": "{}"})
    code, _, err = run_cli(capsys, path, "-o", tmp_path / "other")
    assert code == 2 and "refusing to replace" in err and "--force" in err
    assert (tmp_path / "other" / "config.json").read_text() == "{}"


def test_import_hf_refuses_a_model_dir_missing_moe_tensors(qwen2_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    path, _ = qwen2_dir
    broken = _write(tmp_path / "broken", {"config.json": (path / "config.json").read_text()})
    tensors = {k: v for k, v in load_file(path / "model.safetensors").items() if "layers.2.mlp.gate." not in k}
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(capsys, broken, "-o", tmp_path / "ckpt")
    assert code == 2 and "lacks 1 tensor(s) of its MoE layers, first layers.2.mlp.gate.weight" in err


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("truncated", r"model\.safetensors is truncated"),
        ("int32", r"model\.layers\.2\.mlp\.experts\.1\.down_proj\.weight is I32; import float32, float16 or bfloat16"),
        ("nan", r"layers\.2\.mlp\.experts.* holds NaN or infinite values"),
    ],
)
def test_layers_only_refuses_what_the_whole_model_import_refuses(qwen2_dir, tmp_path, capsys, case, message):
    import shutil

    from safetensors.torch import load_file, save_file

    path, _ = qwen2_dir
    src = shutil.copytree(path, tmp_path / "m")
    weights = src / "model.safetensors"
    if case == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        tensors = load_file(weights)
        name = "model.layers.2.mlp.experts.1.down_proj.weight"
        tensors[name] = tensors[name].to(torch.int32) if case == "int32" else tensors[name].fill_(float("nan"))
        save_file(tensors, weights, metadata={"format": "pt"})
    code, _, err = run_cli(capsys, src, "-o", tmp_path / "ckpt", "--layers-only")
    assert code == 2 and re.search(message, err) and err.count("\n") == 1, err
    assert not (tmp_path / "ckpt").exists()
