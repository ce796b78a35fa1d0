"""`generate --onnx FILE`: decoding with a model already exported by export-lm, checked
against the checkpoint, gives the tokens of exporting in memory; bad input is one line."""

import pytest

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.quant import QuantConfig

ARGS = ["--prompt", "Anne", "--max-new-tokens", "10"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An int4 checkpoint and its ort-form export, with its weights in external data."""
    from deamoe_trt.export.lm import export_lm

    folder = tmp_path_factory.mktemp("gen")
    model = DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(quantization=QuantConfig(4, 16)), seed=2)
    checkpoint = model.save_pretrained(folder / "q4")
    onnx = export_lm(model, folder / "q4.onnx", "ort", external_data_threshold=0)
    assert onnx.with_name("q4.onnx.data").is_file()
    return checkpoint, onnx


def text(capsys) -> str:
    out = capsys.readouterr().out
    return out.split("\n")[1]


def test_the_file_decodes_the_tokens_of_the_in_memory_export(exported, capsys):
    checkpoint, onnx = exported
    assert main(["generate", str(checkpoint), *ARGS, "--runtime", "ort"]) == 0
    in_memory = text(capsys)
    assert main(["generate", str(checkpoint), *ARGS, "--onnx", str(onnx)]) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[1] == in_memory
    assert "--- deamoe on ort, greedy" in out and "\nort " in out
    assert main(["generate", str(checkpoint), *ARGS, "--runtime", "torch"]) == 0
    assert text(capsys) == in_memory  # and both are the reference's


def test_an_expanded_export_runs_as_the_expanded_twin(exported, tmp_path, capsys):
    from deamoe_trt.export.lm import export_lm
    from deamoe_trt.lm import load_lm

    checkpoint, _ = exported
    onnx = export_lm(load_lm(checkpoint).model.expanded(), tmp_path / "x.onnx", "ort", twin="expanded")
    assert main(["generate", str(checkpoint), *ARGS, "--onnx", str(onnx), "--twin", "expanded"]) == 0
    assert "--- expanded on ort" in capsys.readouterr().out
    assert main(["generate", str(checkpoint), *ARGS, "--onnx", str(onnx)]) == 2
    assert "holds the expanded model; --twin deamoe needs its own export" in capsys.readouterr().err


def test_bad_input_is_one_line(exported, tmp_path, capsys):
    checkpoint, onnx = exported

    def refused(args, message):
        assert main(["generate", *args, *ARGS]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and err.startswith("deamoe-trt generate: error:"), err

    refused([str(checkpoint), "--onnx", str(tmp_path / "nope.onnx")], "no model file at")
    refused([str(checkpoint), "--onnx", str(onnx), "--runtime", "cpu"], "--onnx runs the file on ONNX Runtime")
    other = DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(quantization=QuantConfig(8, 16)), seed=2)
    other_checkpoint = other.save_pretrained(tmp_path / "q8")
    refused([str(other_checkpoint), "--onnx", str(onnx)], f"{onnx} is not an export of {other_checkpoint}")
    refused([str(checkpoint), "--onnx", str(checkpoint / "config.json")], "is not an ONNX model")
    refused([str(tmp_path / "missing"), "--onnx", str(onnx)], "no model checkpoint at")
