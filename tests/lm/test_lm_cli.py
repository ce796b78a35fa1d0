import subprocess
import sys

import pytest

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.layer import DeaMoEStack
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.presets import get_preset


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "deamoe_trt", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "the prompt is empty; give at least one character"),
        ("x" * 48, "the prompt is 48 tokens but the model's context (its KV cache) holds 48"),
        ("caf\u00e9", "the prompt has '\u00e9' (U+00E9) at character 4"),
    ],
)
def test_generate_rejects_bad_prompts_in_one_line(micro_checkpoint, capsys, prompt, message):
    assert main(["generate", str(micro_checkpoint), "--prompt", prompt]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("deamoe-trt generate: error:")


def test_missing_and_wrong_model_files(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "a"]) == 2
    assert "no model checkpoint at" in capsys.readouterr().err
    DeaMoEStack.random(get_preset("tiny"), 1).save_pretrained(tmp_path / "layer")
    assert main(["generate", str(tmp_path / "layer"), "--prompt", "a"]) == 2
    assert "is a DeaMoE layer checkpoint, not a language model" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["generate", str(tmp_path / "empty"), "--prompt", "a"]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_bad_input_through_the_real_console_has_no_traceback(micro_checkpoint):
    result = run_cli("generate", str(micro_checkpoint), "--prompt", "it\u2019s")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert '(write "\'" instead)' in result.stderr


@pytest.mark.slow
def test_train_tiny_quick(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["train-tiny", "--quick", "--steps", "12", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "validation, after training" in text and "greedy sample" in text
    training = load_lm(out).training
    assert training["steps"] == 12 and training["val_loss"] < training["initial_val_loss"]


# Quantized language-model checkpoints ----------------------------------------------------


@pytest.fixture(scope="module")
def int4_checkpoint(tmp_path_factory):
    from deamoe_trt.lm import DeaMoELM
    from deamoe_trt.quant import QuantConfig

    model = DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(quantization=QuantConfig(4, 16)), seed=2)
    return model.save_pretrained(tmp_path_factory.mktemp("q") / "micro-int4")


def test_generate_from_a_quantized_checkpoint_agrees_on_every_runtime(int4_checkpoint, capsys):
    args = ["generate", str(int4_checkpoint), "--prompt", "Anne", "--max-new-tokens", "10"]
    texts = {}
    for runtime in ("torch", "ort", "cpu"):
        assert main([*args, "--runtime", runtime]) == 0
        texts[runtime] = capsys.readouterr().out.split("\n")[1]
    assert texts["ort"] == texts["torch"] and texts["cpu"] == texts["torch"]


@pytest.mark.slow
def test_export_lm_of_quantized_checkpoints_validates(int4_checkpoint, tmp_path, capsys):
    from deamoe_trt.lm import load_lm
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.quantize.lm import quantize_lm

    assert (
        main(["export-lm", str(int4_checkpoint), "-o", str(tmp_path / "m4.onnx"), "--form", "onnx", "--validate"]) == 0
    )
    assert "atol 0.0001" in capsys.readouterr().out
    source = load_lm(int4_checkpoint).model.config.replace(quantization=None)
    int8 = quantize_lm(DeaMoELM.random(source, seed=2), QuantConfig(8, 16)).save_pretrained(tmp_path / "q8")
    assert main(["export-lm", str(int8), "-o", str(tmp_path / "m8.onnx"), "--form", "ort", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "atol 0.05" in out and "int8 activations" in out


def test_plugin_export_of_a_quantized_language_model_carries_the_codes(int4_checkpoint, tmp_path, capsys):
    import onnx

    path = tmp_path / "p.onnx"
    assert main(["export-lm", str(int4_checkpoint), "-o", str(path), "--form", "plugin"]) == 0
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "DeaMoE"]
    assert len(nodes) == 2  # blocks 0 and 2; block 1 is dense
    for node in nodes:
        attributes = {a.name: a.i for a in node.attribute if a.name.startswith("weight_")}
        assert attributes == {"weight_bits": 4, "weight_group_size": 16}


def test_generate_without_a_prompt_is_one_line(micro_checkpoint, tmp_path, capsys):
    assert main(["generate", str(micro_checkpoint)]) == 2
    assert main(["generate", str(micro_checkpoint), "--prompts-file", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert "give a prompt: --prompt TEXT" in err and "cannot read the prompts file" in err
