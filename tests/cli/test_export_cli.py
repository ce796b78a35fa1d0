"""`deamoe-trt export` and `deamoe-trt validate` as users run them, bad input included."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from deamoe_trt import DeaMoEStack, get_preset
from deamoe_trt.cli.main import main
from deamoe_trt.export import export_info, load_model

RECIPES = Path(__file__).resolve().parents[2] / "export-recipes"


def table_rows(out: str) -> list[list[str]]:
    """The rows of validate's table: output name, tokens, errors..., verdict."""
    return [line.split() for line in out.splitlines() if line.startswith("output ") and line.split()[1].isdigit()]


def cli(capsys, *argv):
    """main(argv) in this process: (exit code, stdout, stderr lines)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    tiny = get_preset("tiny")
    DeaMoEStack.random(tiny, 2, seed=1).save_pretrained(root / "tiny2")
    DeaMoEStack.random(tiny, 2, seed=2).save_pretrained(root / "tiny2-other-weights")
    DeaMoEStack.random(tiny, 1, seed=1).save_pretrained(root / "tiny1")
    DeaMoEStack.random(tiny.replace(hidden_size=32), 2, seed=1).save_pretrained(root / "narrow")
    DeaMoEStack.random(tiny.replace(top_k=3), 2, seed=1).save_pretrained(root / "top3")
    return root


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory):
    """tiny2 exported in the ort form, fp32, all layers."""
    path = tmp_path_factory.mktemp("models") / "tiny2.onnx"
    assert main(["export", str(checkpoints / "tiny2"), "-o", str(path), "--form", "ort"]) == 0
    return path


@pytest.mark.slow
def test_export_then_validate_passes_and_prints_a_table_per_token_count(checkpoints, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    code, out, err = cli(capsys, "export", checkpoints / "tiny2", "-o", model, "--form", "plugin", "--dtype", "fp16")
    assert (code, err) == (0, [])
    assert "plugin form, fp16, 2 layers" in out
    code, out, err = cli(capsys, "validate", model, "--against", checkpoints / "tiny2", "--tokens", "1,4,17")
    assert code == 0, err
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["1", "4", "17"] and all(r[-1] == "ok" for r in rows)
    assert "atol 0.01, rtol 0.01" in out


def test_export_with_a_recipe_and_flags_overriding_it(checkpoints, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    code, _, err = cli(
        capsys, "export", checkpoints / "tiny2", "-o", model, "--recipe", RECIPES / "tiny-ort.toml", "--dtype", "fp16"
    )
    assert (code, err) == (0, [])
    info = export_info(load_model(model))
    assert (info.form, info.dtype, info.max_tokens, info.layers) == ("ort", "fp16", 64, (0, 1))


def test_export_of_one_layer_is_the_layer_and_validates(checkpoints, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    assert cli(capsys, "export", checkpoints / "tiny2", "-o", model, "--form", "onnx", "--layers", "1")[0] == 0
    info = export_info(load_model(model))
    assert (info.module, info.layers) == ("layer", (1,))
    code, out, _ = cli(capsys, "validate", model, "--against", checkpoints / "tiny2", "--tokens", "2")
    assert code == 0 and "one layer" in out


def test_external_data_export_validates(checkpoints, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    args = ("export", checkpoints / "tiny2", "-o", model, "--form", "plugin", "--external-data-threshold", "1000")
    code, out, _ = cli(capsys, *args)
    assert code == 0 and "weights in m.onnx.data" in out
    assert cli(capsys, "validate", model, "--against", checkpoints / "tiny2", "--tokens", "3")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]  # no temporary left


def test_validate_exits_1_with_one_line_above_tolerance(checkpoints, exported, capsys):
    code, out, err = cli(capsys, "validate", exported, "--against", checkpoints / "tiny2", "--atol", "0", "--rtol", "0")
    assert code == 1
    assert len(err) == 1 and "exceed tolerance (atol 0, rtol 0)" in err[0]
    assert "FAIL" in out


def test_validate_reports_an_expert_weight_changed_after_export(checkpoints, exported, tmp_path, capsys):
    model = onnx.load(str(exported))
    (down,) = [t for t in model.graph.initializer if t.name == "layers.1.experts.down"]
    values = onnx.numpy_helper.to_array(down).copy()
    values *= 1.5
    down.CopyFrom(onnx.numpy_helper.from_array(values, down.name))
    onnx.save(model, str(tmp_path / "changed.onnx"))
    code, _, err = cli(capsys, "validate", tmp_path / "changed.onnx", "--against", checkpoints / "tiny2")
    assert code == 1 and len(err) == 1 and "worst: output" in err[0]


def test_validate_says_plainly_when_the_model_outputs_nan(checkpoints, exported, tmp_path, capsys):
    """A model whose output is NaN (here: one expert weight made NaN after export) fails with
    a line that says so, and the table counts the NaN/Inf values."""
    model = onnx.load(str(exported))
    (down,) = [t for t in model.graph.initializer if t.name == "layers.1.experts.down"]
    values = onnx.numpy_helper.to_array(down).copy()
    values[:] = np.nan
    down.CopyFrom(onnx.numpy_helper.from_array(values, down.name))
    onnx.save(model, str(tmp_path / "nan.onnx"))
    code, out, err = cli(capsys, "validate", tmp_path / "nan.onnx", "--against", checkpoints / "tiny2")
    assert code == 1 and len(err) == 1
    assert "the model's output is NaN/Inf in" in err[0] and "where the reference's is finite" in err[0], err
    assert "NaN/Inf" in out and "FAIL" in out


def _write_not_deamoe(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, producer_name="someone-else"), str(path))
    return path


def _truncated(exported: Path, path: Path) -> Path:
    data = exported.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    ("make_model", "against", "message"),
    [
        (lambda d, e: d / "missing.onnx", "tiny2", "no model file at"),
        (lambda d, e: (d / "t.onnx").write_text("hello") and d / "t.onnx", "tiny2", "it looks like text"),
        (lambda d, e: (d / "j.onnx").write_text('{"a": 1}') and d / "j.onnx", "tiny2", "it looks like JSON text"),
        (
            lambda d, e: (d / "b.onnx").write_bytes(bytes(range(1, 256))) and d / "b.onnx",
            "tiny2",
            "not a readable ONNX",
        ),
        (lambda d, e: _truncated(e, d / "cut.onnx"), "tiny2", "truncated"),
        (lambda d, e: _write_not_deamoe(d / "relu.onnx"), "tiny2", "not a deamoe-trt export: made by someone-else"),
        (lambda d, e: d.parent, "tiny2", "is a directory"),
        (lambda d, e: e, "narrow", "does not match the model: hidden_size 64 vs 32"),
        (lambda d, e: e, "top3", "does not match the model: top_k 4 vs 3"),
        (lambda d, e: e, "tiny1", "holds layer(s) 0,1 but the checkpoint has 1 layer(s)"),
        (lambda d, e: e, "tiny2-other-weights", "router weights differ"),
        (lambda d, e: e, "nowhere", "no checkpoint at"),
    ],
    ids=[
        "missing",
        "text",
        "json",
        "binary",
        "truncated",
        "other-onnx",
        "directory",
        "hidden-size",
        "config-attribute",
        "layer-count",
        "other-weights",
        "no-checkpoint",
    ],
)
def test_validate_bad_input_is_one_line_and_exit_2(
    checkpoints, exported, tmp_path, capsys, make_model, against, message
):
    model = make_model(tmp_path, exported)
    code, out, err = cli(capsys, "validate", model, "--against", checkpoints / against)
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert out == ""


def test_validate_rejects_nan_inputs(checkpoints, exported, tmp_path, capsys):
    values = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    values[1, 2] = np.nan
    np.save(tmp_path / "x.npy", values)
    code, _, err = cli(capsys, "validate", exported, "--against", checkpoints / "tiny2", "--inputs", tmp_path / "x.npy")
    assert code == 2 and len(err) == 1 and "inputs contain NaN or Inf (1 element(s))" in err[0]


@pytest.mark.slow
def test_validate_accepts_given_inputs(checkpoints, exported, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32))
    code, out, _ = cli(capsys, "validate", exported, "--against", checkpoints / "tiny2", "--inputs", tmp_path / "x.npy")
    assert code == 0 and [row[1] for row in table_rows(out)] == ["5"]


def test_validate_of_an_engine_without_the_tensorrt_backend_says_what_is_missing(checkpoints, tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    (tmp_path / "m.engine").write_bytes(b"\0" * 16)
    code, _, err = cli(capsys, "validate", tmp_path / "m.engine", "--against", checkpoints / "tiny2")
    assert code == 1 and len(err) == 1 and "TensorRT" in err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--form", "tensorrt"), "invalid choice: 'tensorrt'"),
        (("--form", "ort", "--dtype", "fp8"), "invalid choice: 'fp8'"),
        (("--form", "ort", "--dtype", "bf16"), "the ort form does not support bf16"),
        ((), "no form given"),
        (("--form", "ort", "--opset", "9"), "opset must be an integer from 17"),
        (("--form", "ort", "--layers", "0,7"), "layer 7 is out of range"),
        (("--recipe", "no/such.toml"), "no recipe at no/such.toml"),
    ],
)
def test_export_bad_input_is_one_line_exit_2_and_writes_nothing(checkpoints, tmp_path, capsys, args, message):
    code, _, err = cli(capsys, "export", checkpoints / "tiny2", "-o", tmp_path / "m.onnx", *args)
    assert code == 2
    assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_export_of_a_checkpoint_with_nan_weights_fails_and_writes_nothing(checkpoints, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        (broken / name).write_bytes((checkpoints / "tiny1" / name).read_bytes())
    tensors = load_file(str(broken / "model.safetensors"))
    tensors["layers.0.experts.down"][0, 0, 0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"))
    out_dir = tmp_path / "out"
    code, _, err = cli(capsys, "export", broken, "-o", out_dir / "m.onnx", "--form", "onnx")
    assert code == 2 and len(err) == 1 and "NaN" in err[0]
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_export_interrupted_while_writing_leaves_no_file(checkpoints, tmp_path, capsys, monkeypatch):
    from deamoe_trt.export import save

    def fail(model, path):
        path.write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(save, "_write", fail)
    code, _, err = cli(capsys, "export", checkpoints / "tiny2", "-o", tmp_path / "m.onnx", "--form", "ort")
    assert code == 1 and len(err) == 1 and "disk full" in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_real_console_entry_prints_one_stderr_line(checkpoints, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deamoe_trt",
            "validate",
            str(tmp_path / "none.onnx"),
            "--against",
            str(checkpoints / "tiny2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"deamoe-trt validate: error: no model file at {tmp_path / 'none.onnx'}"
    ]


@pytest.mark.slow
def test_export_takes_a_language_model_and_export_lm_stays_its_alias(micro_checkpoint, tmp_path, capsys):
    from deamoe_trt.export.lm import export_lm, lm_export_info
    from deamoe_trt.lm import load_lm

    loaded = load_lm(micro_checkpoint)
    expected = load_model(export_lm(loaded.model, tmp_path / "lib.onnx", "onnx", tokenizer=loaded.tokenizer))
    for command in ("export", "export-lm"):
        code, out, err = cli(capsys, command, micro_checkpoint, "-o", tmp_path / f"{command}.onnx", "--form", "onnx")
        assert (code, err) == (0, [])
        assert "(deamoe, onnx form, fp32," in out
        model = load_model(tmp_path / f"{command}.onnx")
        assert lm_export_info(model).form == "onnx"
        assert model.graph.SerializeToString() == expected.graph.SerializeToString()


@pytest.mark.parametrize(
    ("which", "flags", "message"),
    [
        ("lm", ("--layers", "0"), "--layers does not apply to .*, a language model"),
        ("lm", ("--max-tokens", "8"), "--max-tokens does not apply to .*, a language model"),
        ("lm", ("--recipe", RECIPES / "tiny-ort.toml"), "--recipe does not apply"),
        ("layer", ("--form", "ort", "--twin", "expanded"), "--twin does not apply to .*, a stack of layers"),
        ("layer", ("--form", "ort", "--target", "genai"), "--target does not apply to .*, a stack of layers"),
    ],
)
def test_export_refuses_a_flag_the_checkpoint_does_not_take_in_one_line(
    which, flags, message, micro_checkpoint, checkpoints, tmp_path, capsys
):
    source = micro_checkpoint if which == "lm" else checkpoints / "tiny2"
    code, _out, err = cli(capsys, "export", source, "-o", tmp_path / "m.onnx", *flags)
    assert code == 2 and len(err) == 1, err
    assert re.search(message, err[0]), err[0]
    assert not (tmp_path / "m.onnx").exists()


def test_export_lm_help_names_it_an_alias(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "alias of export, kept for one release" in " ".join(out.split())


def test_validate_of_a_layer_export_against_a_language_model_is_refused_in_one_line(exported, micro_checkpoint, capsys):
    code, out, err = cli(capsys, "validate", exported, "--against", micro_checkpoint)
    assert (code, out) == (2, "")
    assert len(err) == 1 and "holds a language model and the model is a stack export" in err[0], err


@pytest.mark.slow
def test_export_validate_compares_a_layer_export_with_its_checkpoint(checkpoints, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    code, out, err = cli(capsys, "export", checkpoints / "tiny2", "-o", model, "--form", "ort", "--validate")
    assert (code, err) == (0, [])
    rows = table_rows(out)
    assert [int(r[1]) for r in rows] == [1, 4, 16] and all(r[-1] == "ok" for r in rows), out
