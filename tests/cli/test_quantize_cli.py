"""`deamoe-trt quantize` and the quantized parts of `info` and `export`, as users run them."""

import pytest
import torch
from safetensors.torch import save_file

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt import DeaMoEStack
from deamoe_trt.cli.main import main
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # AWQ's searches: many small matmuls


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


def test_no_compare_writes_the_same_layer_checkpoint_without_the_table(tiny, tmp_path, capsys):
    args = ["quantize", str(tiny), "--bits", "4", "--group-size", "16", "--tokens", "16"]
    assert main([*args, "-o", str(tmp_path / "measured")]) == 0
    capsys.readouterr()
    assert main([*args, "-o", str(tmp_path / "quiet"), "--no-compare"]) == 0
    assert "relative error" not in capsys.readouterr().out
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "measured" / name).read_bytes()


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


def outlier_file(path, tokens: int, seed: int, names=("hidden_states",)):
    """Layer inputs with 4 outlier channels (10x), as safetensors under each of names."""
    x = random_hidden(tokens, 64, seed=seed)
    x[:, :4] *= 10
    save_file({name: x.clone() for name in names}, str(path))
    return str(path)


def table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[:1] in (["0"], ["1"])]


def test_awq_prints_rtn_and_awq_on_held_out_tokens_and_writes_an_awq_checkpoint(tiny, tmp_path, capsys):
    calibration = outlier_file(tmp_path / "c.safetensors", 256, seed=1)
    capsys.readouterr()
    out_dir = tmp_path / "awq"
    args = ["quantize", str(tiny), "-o", str(out_dir), "--bits", "4", "--group-size", "16"]
    assert main([*args, "--method", "awq", "--calibration", calibration]) == 0
    captured = capsys.readouterr()
    assert "RTN error" in captured.out and "AWQ error" in captured.out and "last quarter" in captured.out
    assert "awq search" in captured.err  # progress
    rows = table_rows(captured.out)
    assert len(rows) == 2
    for row in rows:
        calibration_tokens, held_out, rtn, awq, ratio, moved = row[1], row[2], *map(float, row[3:6]), row[-1]
        assert (calibration_tokens, held_out, moved) == ("192", "64", "0")
        assert awq < rtn and ratio == pytest.approx(awq / rtn, abs=2e-3)
    stack = DeaMoEStack.from_pretrained(out_dir)
    assert stack.quant == QuantConfig(4, 16, "awq")


def test_awq_takes_per_layer_inputs_and_a_separate_eval_set(tiny, tmp_path, capsys):
    names = ("layers.0.hidden_states", "layers.1.hidden_states")
    calibration = outlier_file(tmp_path / "c.safetensors", 64, seed=1, names=names)
    held_out = outlier_file(tmp_path / "e.safetensors", 16, seed=2, names=names)
    capsys.readouterr()
    args = ["quantize", str(tiny), "-o", str(tmp_path / "awq"), "--bits", "8", "--group-size", "16"]
    assert main([*args, "--method", "awq", "--calibration", calibration, "--eval", held_out]) == 0
    out = capsys.readouterr().out
    assert [row[1:3] for row in table_rows(out)] == [["64", "16"], ["64", "16"]]


def bad_file(tmp_path, case):
    path = tmp_path / "bad.safetensors"
    if case == "not safetensors":
        path.write_text("hello")
    elif case != "missing":
        tensors = {
            "wrong width": {"hidden_states": torch.ones(16, 32)},
            "nan": {"hidden_states": torch.full((16, 64), float("nan"))},
            "integers": {"hidden_states": torch.ones(16, 64, dtype=torch.int32)},
            "unknown name": {"inputs": torch.ones(16, 64)},
            "one layer of two": {"layers.0.hidden_states": torch.ones(16, 64)},
            "too few tokens": {"hidden_states": torch.ones(4, 64)},
        }[case]
        save_file(tensors, str(path))
    return str(path)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not safetensors", "is not a readable safetensors file"),
        ("wrong width", "hidden_states must be [tokens, 64], got [16, 32]"),
        ("nan", "hidden_states contains NaN or Inf"),
        ("integers", "must be floating point, got torch.int32"),
        ("unknown name", "holds ['inputs']; expected 'hidden_states'"),
        ("one layer of two", "for each of the checkpoint's 2 layer(s)"),
        ("too few tokens", "has 4 tokens; at least 8 are needed"),
        ("random:0", "random:N needs a token count N >= 1"),
        ("missing", "bad.safetensors: no such file"),
        (None, "--method awq needs --calibration FILE"),
        ("rtn", "--calibration is for --method awq"),
    ],
)
def test_bad_calibration_is_one_line_and_writes_nothing(tiny, tmp_path, capsys, case, message):
    out_dir = tmp_path / "bad"
    args = ["quantize", str(tiny), "-o", str(out_dir), "--bits", "4", "--group-size", "16", "--method", "awq"]
    if case == "rtn":
        args = [*args[:-1], "rtn", "--calibration", "random:16"]
    elif case == "random:0":
        args += ["--calibration", case]
    elif case is not None:
        args += ["--calibration", bad_file(tmp_path, case)]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


def _no_raise():
    import contextlib

    return contextlib.nullcontext()


def test_an_awq_checkpoint_exports_and_validates_like_any_quantized_one(tiny, tmp_path, capsys):
    awq = tmp_path / "awq"
    args = ["quantize", str(tiny), "-o", str(awq), "--bits", "4", "--group-size", "16", "--method", "awq"]
    assert main([*args, "--calibration", "random:64"]) == 0
    assert main(["export", str(awq), "-o", str(tmp_path / "m.onnx"), "--form", "ort"]) == 0
    capsys.readouterr()
    assert main(["validate", str(tmp_path / "m.onnx"), "--against", str(awq)]) == 0


# Whole language models --------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_lm(tmp_path_factory):
    from deamoe_trt.lm import DeaMoELM

    return DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=7).save_pretrained(tmp_path_factory.mktemp("lm") / "micro-lm")


@pytest.mark.slow  # four held-out evaluations; the quantized model's dequantize on the fly is most of it
def test_quantize_a_language_model_reports_error_and_perplexity_beside_the_input(micro_lm, tmp_path, capsys):
    import math

    from deamoe_trt.lm import load_lm
    from deamoe_trt.quantize.lm import held_out_loss

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
    from deamoe_trt.quantize.lm import quantize_lm

    quantized = quantize_lm(load_lm(micro_lm).model, QuantConfig(8, 16)).save_pretrained(tmp_path / "q8")
    out_dir = tmp_path / "out"
    cases = [
        ([str(quantized), "--bits", "4", "--group-size", "16"], "already quantized (int8, group size 16)"),
        ([str(micro_lm), "--bits", "4", "--group-size", "32"], "the shared part (f_s) is 16, not divisible by"),
        (
            [str(micro_lm), "--bits", "4", "--group-size", "16", "--method", "awq", "--calibration", "random:64"],
            "--calibration random:64: no such file (a language model calibrates on a text file)",
        ),
        ([str(micro_lm), "--bits", "4", "--group-size", "16", "--eval", "x.safetensors"], "--eval takes layer inputs"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert main(["quantize", args[0], "-o", str(out_dir), *args[1:]]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
        assert not out_dir.exists()
    assert main(["quantize", str(micro_lm), "-o", str(micro_lm), "--bits", "4", "--group-size", "16"]) == 2
    assert "is the input" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file (a language model calibrates on a text file)"),
        ("  \n", "is empty"),
        ("Anne Elliot\u00e9", "character"),
        (b"\xff\xfe", "is not a readable UTF-8 text file"),
    ],
    ids=["missing", "empty", "unencodable", "not-utf8"],
)
def test_language_model_awq_bad_calibration_text_is_one_line_and_writes_nothing(
    micro_lm, tmp_path, capsys, content, message
):
    text = tmp_path / "calibration.txt"
    if isinstance(content, bytes):
        text.write_bytes(content)
    elif content is not None:
        text.write_text(content, encoding="utf-8")
    out_dir = tmp_path / "out"
    capsys.readouterr()
    args = ["--bits", "4", "--group-size", "16", "--method", "awq", "--calibration", str(text)]
    assert main(["quantize", str(micro_lm), "-o", str(out_dir), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and str(text) in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


@pytest.mark.slow  # three held-out evaluations (input, RTN, AWQ), the quantized two dequantizing on the fly
def test_awq_language_model_prints_rtn_and_awq_on_held_out_text_and_writes_a_loadable_checkpoint(
    micro_lm, tmp_path, capsys
):
    import math

    from deamoe_trt.lm import load_lm
    from deamoe_trt.quantize.lm import held_out_loss

    text = tmp_path / "calibration.txt"
    text.write_text("It was a truth universally acknowledged, that a single man in possession of a good fortune. " * 8)
    out_dir = tmp_path / "lm-awq"
    capsys.readouterr()
    args = ["--bits", "4", "--group-size", "16", "--method", "awq", "--calibration", str(text)]
    assert main(["quantize", str(micro_lm), "-o", str(out_dir), *args]) == 0
    out = capsys.readouterr().out
    tokens = len(text.read_text()) // 48 * 48  # whole windows of the model's context, one token per byte
    assert f"calibration (what the search sees): {tokens} tokens of {text}" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith(("block 0", "block 2"))}
    assert set(rows) == {"0", "2"}  # block 1 is dense
    assert all(row[-1] == "0" and 0.01 < float(row[3]) < 0.3 and 0.01 < float(row[4]) < 0.3 for row in rows.values())
    loaded = load_lm(out_dir)
    assert loaded.model.config.quantization == QuantConfig(4, 16, "awq")
    table = {line.split("  ")[0]: line.split() for line in out.splitlines() if line.startswith(("input", "int4,"))}
    assert set(table) == {"input (float32)", "int4, group 16, rtn", "int4, group 16, awq"}
    assert table["int4, group 16, awq"][5] == f"{math.exp(held_out_loss(loaded.model, loaded.tokenizer)):.3f}"
    assert loaded.training["quantization"]["calibration"].startswith(str(text))
    # Without --calibration: the training part of the shipped text, never its held-out part.
    capsys.readouterr()
    assert main(["quantize", str(micro_lm), "-o", str(tmp_path / "default"), *args[:-2]]) == 0
    out = capsys.readouterr().out
    assert f"calibration (what the search sees): {16 * 48} tokens of the shipped text's training part" in out
    assert "held out (what the tables measure, not seen by the search): FFN inputs from the shipped text's" in out
