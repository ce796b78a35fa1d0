"""`deamoe-trt import-hf MODEL_DIR -o LM` (whole model), the tokenizer it keeps, and bad input:
one line on stderr, exit 2, and no output directory left behind."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from deamoe_trt.cli.main import main
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.tokenizer import HFTokenizer

from .hf_lm_models import build_hf_model


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "qwen3"
    build_hf_model("qwen3_moe", path)
    return path


def run(capsys, *argv):
    capsys.readouterr()
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_import_generate_and_export_from_the_command_line(qwen3_dir, tmp_path, capsys):
    code, out, err = run(capsys, "import-hf", qwen3_dir, "-o", tmp_path / "lm")
    assert code == 0, err
    assert "imported qwen3_moe as a language model" in out and "peak RSS" in out
    assert "dense layers 1" in out
    loaded = load_lm(tmp_path / "lm")
    assert isinstance(loaded.tokenizer, HFTokenizer)
    code, out, err = run(capsys, "generate", tmp_path / "lm", "--prompt", "w5 w9 w17", "--max-new-tokens", "4")
    assert code == 0, err
    assert "TPOT" in out
    code, out, err = run(capsys, "export-lm", tmp_path / "lm", "-o", tmp_path / "onnx" / "m.onnx", "--validate")
    assert code == 0, err
    assert (tmp_path / "onnx" / "tokenizer.json").is_file()


def test_tokenizer_and_chat_template_match_transformers(qwen3_dir, tmp_path):
    from transformers import AutoTokenizer

    ours = HFTokenizer(qwen3_dir, 96)
    theirs = AutoTokenizer.from_pretrained(str(qwen3_dir), local_files_only=True)
    text = "w3 w40 w7 w7 w91"
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text))
    messages = [{"role": "user", "content": "w12 w13"}]
    assert ours.chat("w12 w13") == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.eos_ids() == [2]


def _dir(path, config, files=()):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for name in files:
        (path / name).write_text("not opened")
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("llama", r"unsupported architecture 'llama' .*; supported: Qwen3-MoE \(qwen3_moe\), Qwen2-MoE"),
        ("deepseek", r"multi-head latent attention .* --layers-only"),
        ("remote", r"needs trust_remote_code .* never runs code from a model directory"),
        ("pickled", r"has only pickled weights \(pytorch_model\.bin\); deamoe-trt never unpickles"),
        ("missing_shard", r"is missing shard model-00002-of-00002\.safetensors named by model\.safetensors\.index"),
        ("wrong_shape", r"model\.layers\.0\.self_attn\.q_proj\.weight has shape \[8, 32\], but config\.json implies"),
        ("extra_tensor", r"1 tensor\(s\) this import would drop, first model\.layers\.0\.self_attn\.rel_pos"),
        ("lacking_tensor", r"lacks model\.layers\.2\.mlp\.gate\.weight"),
        ("nan_weight", r"model\.layers\.2\.mlp\.experts\.3\.down_proj\.weight holds NaN or infinite values"),
        ("inf_weight", r"model\.embed_tokens\.weight holds NaN or infinite values"),
    ],
)
def test_bad_model_dirs_fail_in_one_line_with_nothing_written(qwen3_dir, tmp_path, capsys, case, message):
    from safetensors.torch import load_file, save_file

    hf_config = json.loads((qwen3_dir / "config.json").read_text())
    src = tmp_path / "m"
    if case == "llama":
        _dir(src, {"model_type": "llama"}, ["model.safetensors"])
    elif case == "deepseek":
        _dir(src, {"model_type": "deepseek_v32", "kv_lora_rank": 512}, ["model.safetensors"])
    elif case == "remote":
        _dir(src, {**hf_config, "auto_map": {"AutoModelForCausalLM": "modeling_x.X"}})
    elif case == "pickled":
        _dir(src, hf_config, ["pytorch_model.bin"])
    else:
        tensors = load_file(qwen3_dir / "model.safetensors")
        if case == "wrong_shape":
            tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 32)
        elif case == "extra_tensor":
            tensors["model.layers.0.self_attn.rel_pos"] = torch.zeros(3)
        elif case == "lacking_tensor":
            del tensors["model.layers.2.mlp.gate.weight"]
        elif case == "nan_weight":
            tensors["model.layers.2.mlp.experts.3.down_proj.weight"][0, 1] = float("nan")
        elif case == "inf_weight":
            tensors["model.embed_tokens.weight"][5, 0] = float("-inf")
        _dir(src, hf_config)
        if case == "missing_shard":
            names = sorted(tensors)
            save_file({n: tensors[n] for n in names[:10]}, src / "model-00001-of-00002.safetensors")
            shard = {
                n: ("model-00001-of-00002.safetensors" if i < 10 else "model-00002-of-00002.safetensors")
                for i, n in enumerate(names)
            }
            (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shard}))
        else:
            save_file(tensors, src / "model.safetensors")
    code, _, err = run(capsys, "import-hf", src, "-o", tmp_path / "lm")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("deamoe-trt import-hf: error: "), err
    assert re.search(message, err), err
    assert not (tmp_path / "lm").exists()


def test_an_import_over_an_earlier_import_leaves_no_file_of_it(qwen3_dir, tmp_path, capsys):
    # A model without a tokenizer over one with: the old tokenizer must not stay as this model's.
    other = tmp_path / "other"
    build_hf_model("qwen3_moe", other, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).unlink()
    assert run(capsys, "import-hf", qwen3_dir, "-o", tmp_path / "lm")[0] == 0
    assert (tmp_path / "lm" / "tokenizer.json").is_file()
    code, _, err = run(capsys, "import-hf", other, "-o", tmp_path / "lm")
    assert code == 0 and "replaced" in err, err
    assert run(capsys, "import-hf", other, "-o", tmp_path / "fresh")[0] == 0
    names = sorted(p.name for p in (tmp_path / "lm").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fresh").iterdir())
    for name in names:
        assert (tmp_path / "lm" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "lm", "other"]  # no temporary left
