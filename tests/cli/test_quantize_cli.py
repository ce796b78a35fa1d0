"""`deamoe-trt quantize` and the quantized parts of `info` and `export`, as users run them."""

import pytest

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
