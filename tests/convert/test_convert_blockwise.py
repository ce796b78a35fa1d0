"""Block-by-block conversion of a language model: the in-memory conversion's result, resumable, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert import blockwise
from deamoe_trt.convert.core import ConvertSettings
from deamoe_trt.convert.run import convert_model
from deamoe_trt.convert.sources import lm_source
from deamoe_trt.lm import ByteTokenizer, DeaMoELM, load_lm

from .test_convert_lm import TEXT, VANILLA

# Three blocks, the middle one dense: dense blocks are carried through unchanged.
CONFIG = VANILLA.replace(num_layers=3, dense_layers=(1,), dense_intermediate_size=40)
SETTINGS = ConvertSettings(2, 1, shared_size=12)


@pytest.fixture
def source(tmp_path):
    model = DeaMoELM.random(CONFIG, seed=7).eval()
    path = model.save_pretrained(tmp_path / "src")
    (tmp_path / "text.txt").write_text(TEXT)
    return model, path


def argv(src, out, tmp_path, *extra):
    return [
        "convert", str(src), "-o", str(out), "--departments", "2", "--shared-size", "12",
        "--top-departments", "1", "--no-compare", "--calibration", str(tmp_path / "text.txt"), *extra,
    ]  # fmt: skip


def test_block_by_block_gives_the_in_memory_conversion(source, tmp_path):
    model, src = source
    with open(tmp_path / "log.txt", "w") as log:
        blockwise.convert_lm_blockwise(src, tmp_path / "out", SETTINGS, TEXT, log=log)
    got = load_lm(tmp_path / "out").model
    expected, _ = convert_model(lm_source(model, ByteTokenizer(), TEXT), SETTINGS, compare=False, progress=False)
    assert got.config.moe == expected.lm.config.moe
    want = expected.lm.state_dict()
    for name, tensor in got.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    assert not blockwise.work_dir(tmp_path / "out").exists()


def test_a_killed_conversion_resumes_at_the_next_block_with_identical_bytes(source, tmp_path, monkeypatch, capsys):
    _, src = source
    assert cli(argv(src, tmp_path / "whole", tmp_path)) == 0
    calls = []
    real = blockwise.convert_layer

    def dies_on_the_second_moe_block(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a kill leaves: block 0 and the dense block 1 done
        return real(*args, **kwargs)

    monkeypatch.setattr(blockwise, "convert_layer", dies_on_the_second_moe_block)
    assert cli(argv(src, tmp_path / "out", tmp_path)) == 130  # interrupted
    state = json.loads((blockwise.work_dir(tmp_path / "out") / blockwise.STATE_FILE).read_text())
    assert [b["block"] for b in state["blocks"]] == [0, 1]
    assert not (tmp_path / "out" / "model.safetensors").exists()
    calls.clear()
    monkeypatch.setattr(blockwise, "convert_layer", lambda *a, **k: calls.append(1) or real(*a, **k))
    capsys.readouterr()
    assert cli(argv(src, tmp_path / "out", tmp_path)) == 0
    assert "resuming at block 3/3" in capsys.readouterr().err
    assert len(calls) == 1  # only the last block was converted again
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_resume_with_other_settings_is_refused_in_one_line(source, tmp_path, monkeypatch, capsys):
    _, src = source
    monkeypatch.setattr(blockwise, "convert_layer", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli(argv(src, tmp_path / "out", tmp_path)) == 130
    monkeypatch.undo()
    work = blockwise.work_dir(tmp_path / "out")
    before = sorted(p.name for p in work.iterdir())
    capsys.readouterr()
    assert cli(argv(src, tmp_path / "out", tmp_path, "--seed", "3")) == 2
    err = capsys.readouterr().err.strip()
    assert "another source or with other settings" in err and "\n" not in err
    assert sorted(p.name for p in work.iterdir()) == before and not (tmp_path / "out").exists()


def test_a_tensor_that_disagrees_with_the_config_is_refused_before_any_work(source, tmp_path, capsys):
    _, src = source
    tensors = load_file(src / "model.safetensors")
    tensors["layers.2.mlp.router.weight"] = torch.zeros(5, CONFIG.hidden_size, dtype=torch.float32)
    save_file(tensors, str(src / "model.safetensors"))
    assert cli(argv(src, tmp_path / "out", tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert "layers.2.mlp.router.weight has shape [5, 32]" in err and "\n" not in err
    assert not (tmp_path / "out").exists() and not blockwise.work_dir(tmp_path / "out").exists()
