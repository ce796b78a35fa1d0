"""`deamoe-trt quantize` and the quantized parts of `info` and `export`, as users run them."""

import pytest

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt import DeaMoEStack
from deamoe_trt.cli.main import main
from deamoe_trt.quant import QuantConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("q") / "tiny"
    assert main(["init", "--layers", "2", "-o", str(path)]) == 0
    return path


def test_quantize_writes_a_checkpoint_and_reports_the_error(tiny, tmp_path, capsys):
    capsys.readouterr()
    out_dir = tmp_path / "q4"
    assert main(["quantize", str(tiny), "-o", str(out_dir), "--bits", "4", "--group-size", "16", "--tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "relative error" in out and "tokens with other experts" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert len(rows) == 2 and all(row[-1] == "0" for row in rows)  # the router is not quantized
    assert all(0.01 < float(row[1]) < 0.3 for row in rows)
    stack = DeaMoEStack.from_pretrained(out_dir)
    assert stack.quant == QuantConfig(4, 16) and len(stack.layers) == 2


def test_info_counts_packed_bytes_and_prints_bit_widths(tiny, tmp_path, capsys):
    main(["quantize", str(tiny), "-o", str(tmp_path / "q8"), "--bits", "8", "--group-size", "16"])
    capsys.readouterr()
    assert main(["info", str(tmp_path / "q8"), "--tokens", "1", "--samples", "2", "--fit"]) == 0
    out = capsys.readouterr().out
    assert "int8 FFN weights" in out and "by bit width" in out and "Orin Nano 8 GB" in out
    # 2 layers, int8 + fp32 scales every 16: experts 2 x 16 x 3*64*16 x (1 + 4/16) B = 122.88 KB
    experts = next(line for line in out.splitlines() if line.split()[:1] == ["experts"])
    assert experts.split()[-2:] == ["122.88", "KB"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bits", "3"], "invalid choice: 3"),
        (["--bits", "4", "--group-size", "48"], "invalid choice: 48"),
        (["--bits", "4", "--group-size", "32"], "is 16, not divisible by the group size 32"),
    ],
)
def test_bad_settings_are_one_line_and_write_nothing(tiny, tmp_path, capsys, args, message):
    out_dir = tmp_path / "bad"
    with pytest.raises(SystemExit) if "invalid" in message else _no_raise():
        code = main(["quantize", str(tiny), "-o", str(out_dir), *args])
        assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


def test_already_quantized_input_is_refused(tiny, tmp_path, capsys):
    main(["quantize", str(tiny), "-o", str(tmp_path / "q"), "--bits", "4", "--group-size", "16"])
    capsys.readouterr()
    assert main(["quantize", str(tmp_path / "q"), "-o", str(tmp_path / "qq"), "--bits", "8", "--group-size", "16"]) == 2
    assert "already quantized" in capsys.readouterr().err
    assert not (tmp_path / "qq").exists()


def test_plugin_export_of_a_quantized_checkpoint_validates(tiny, tmp_path, capsys):
    main(["quantize", str(tiny), "-o", str(tmp_path / "q"), "--bits", "8", "--group-size", "16"])
    model = tmp_path / "m.onnx"
    assert main(["export", str(tmp_path / "q"), "-o", str(model), "--form", "plugin"]) == 0
    assert main(["validate", str(model), "--against", str(tmp_path / "q")]) == 0
    capsys.readouterr()


def _no_raise():
    import contextlib

    return contextlib.nullcontext()


# Whole language models --------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_lm(tmp_path_factory):
    from deamoe_trt.lm import DeaMoELM

    return DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=7).save_pretrained(tmp_path_factory.mktemp("lm") / "micro-lm")


@pytest.mark.slow  # four held-out evaluations; the quantized model's dequantize on the fly is most of it
def test_quantize_a_language_model_reports_error_and_perplexity_beside_the_input(micro_lm, tmp_path, capsys):
    import math

    from deamoe_trt.lm import load_lm
    from deamoe_trt.lm.quantize import held_out_loss

    capsys.readouterr()
    out_dir = tmp_path / "lm-int4"
    assert main(["quantize", str(micro_lm), "-o", str(out_dir), "--bits", "4", "--group-size", "16"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("block ")}
    assert set(rows) == {"0", "2"}  # block 1 is dense: nothing to quantize
    assert all(row[-1] == "0" and 0.01 < float(row[2]) < 0.3 for row in rows.values())
    source, quantized = load_lm(micro_lm), load_lm(out_dir)
    assert quantized.model.config.quantization == QuantConfig(4, 16)
    # Both perplexities are the held-out measurement of each checkpoint, in one table.
    table = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("input", "int4,"))}
    assert table["input"][3] == f"{math.exp(held_out_loss(source.model, source.tokenizer)):.3f}"
    assert table["int4,"][4] == f"{math.exp(held_out_loss(quantized.model, quantized.tokenizer)):.3f}"
    assert quantized.training["quantization"]["source"] == str(micro_lm)
    assert "wrote 2 DeaMoE FFN(s) of 3 block(s), int4, group size 16" in out


def test_language_model_bad_input_is_one_line_and_writes_nothing(micro_lm, tmp_path, capsys):
    from deamoe_trt.lm import load_lm
    from deamoe_trt.lm.quantize import quantize_lm

    quantized = quantize_lm(load_lm(micro_lm).model, QuantConfig(8, 16)).save_pretrained(tmp_path / "q8")
    out_dir = tmp_path / "out"
    cases = [
        ([str(quantized), "--bits", "4", "--group-size", "16"], "already quantized (int8, group size 16)"),
        ([str(micro_lm), "--bits", "4", "--group-size", "32"], "the shared part (f_s) is 16, not divisible by"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert main(["quantize", args[0], "-o", str(out_dir), *args[1:]]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not out_dir.exists()
    assert main(["quantize", str(micro_lm), "-o", str(micro_lm), "--bits", "4", "--group-size", "16"]) == 2
    assert "--output must differ from the input" in capsys.readouterr().err
