"""Converting a language model: the CLI end to end on a micro model, identity, healing."""

from __future__ import annotations

import json

import pytest
import torch

from configs import MICRO_LM
from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert.baselines import BASELINES
from deamoe_trt.convert.core import ConvertSettings
from deamoe_trt.convert.run import convert_model
from deamoe_trt.convert.sources import lm_source
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import ByteTokenizer, DeaMoELM, load_lm
from deamoe_trt.train.lm import shipped_text

# MICRO_LM with vanilla MoE FFNs (4 experts of width 24, top-2): a conversion source.
VANILLA = MICRO_LM.replace(
    moe=MICRO_LM.moe.replace(
        num_departments=1, experts_per_department=4, shared_intermediate_size=0, private_intermediate_size=24
    )
)
# MICRO_LM has department shared parts: not a conversion source.
MICRO = MICRO_LM
TEXT = shipped_text()[:20000]


@pytest.fixture
def vanilla_lm():
    return DeaMoELM.random(VANILLA, seed=5).eval()


def test_one_department_without_sharing_gives_the_same_logits(vanilla_lm):
    source = lm_source(vanilla_lm, ByteTokenizer(), TEXT, seq_len=32)
    result, report = convert_model(source, ConvertSettings(1, 1, shared_size=0), compare=False, progress=False)
    ids = source.heldout_windows
    with torch.no_grad():
        assert torch.equal(result.lm(ids).logits, vanilla_lm(ids).logits)
    converted = next(r for r in report["rows"] if r["method"] == "converted")
    assert converted["next_token_agreement"] == 1.0 and converted["bytes_vs_source"] == 1.0


@pytest.mark.slow
def test_healing_lowers_the_layer_error_and_the_logit_gap(vanilla_lm):
    source = lm_source(vanilla_lm, ByteTokenizer(), TEXT, seq_len=32)
    settings = ConvertSettings(2, 1, shared_size=12, heal_steps=15, heal_lr=3e-3)
    _, report = convert_model(source, settings, compare=False, progress=False)
    rows = {r["method"]: r for r in report["rows"]}
    before, after = rows["converted"], rows["converted + healed"]
    assert sum(after["relative_error"]) < sum(before["relative_error"])
    first, last = after["heal_loss"]["lm"]
    assert last < first
    assert after["bytes_vs_source"] == before["bytes_vs_source"] < 1


def test_convert_cli_writes_a_loadable_model_and_report(vanilla_lm, tmp_path, capsys):
    src = vanilla_lm.save_pretrained(tmp_path / "src")
    text = tmp_path / "calibration.txt"
    text.write_text(TEXT)
    out, report = tmp_path / "out", tmp_path / "r.json"
    argv = [
        "convert",
        str(src),
        "-o",
        str(out),
        "--departments",
        "2",
        "--shared-fraction",
        "0.5",
        "--top-departments",
        "1",
        "--calibration",
        str(text),
        "--heldout-windows",
        "3",
        "--report",
        str(report),
    ]
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert "naive" in printed and "merged" in printed and "perplexity" in printed
    loaded = load_lm(out)
    moe = loaded.model.config.moe
    assert (moe.num_departments, moe.experts_per_department, moe.shared_intermediate_size) == (2, 2, 12)
    assert loaded.training["conversion"]["converted_from"] == str(src)
    written = json.loads(report.read_text())
    # Every number is measured on the 3 held-out windows asked for, each a context's worth of inputs.
    assert written["source"]["heldout_tokens"] == 3 * (VANILLA.max_position_embeddings - 1)
    rows = written["rows"]
    assert {r["method"] for r in rows} == {"source", "converted", "naive", "merged", *BASELINES}
    merged = next(r for r in rows if r["method"] == "merged")
    converted = next(r for r in rows if r["method"] == "converted")
    # The merged alternative gets at most the converted model's bytes per step (within a neuron),
    # the other baselines at most the converted model's.
    assert merged["bytes_vs_source"] <= converted["bytes_vs_source"] * 1.02
    for row in rows:
        if row["method"] in BASELINES:
            assert row["bytes_per_step"] <= converted["bytes_per_step"], row["method"]
    # Bytes at 1, 4 and 8 tokens per step: the one-token count is bytes_per_step; a step of more
    # tokens reads at least as much; the source's own ratio is 1 at every count.
    for row in rows:
        at = row["bytes_per_step_at"]
        assert set(at) == {"1", "4", "8"} and at["1"] == row["bytes_per_step"]
        assert at["1"] <= at["4"] <= at["8"], row["method"]
    assert set(next(r for r in rows if r["method"] == "source")["bytes_vs_source_at"].values()) == {1.0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--departments", "3", "--shared-size", "4"], "--departments 3 must divide the source's 4 experts"),
        (["--departments", "2", "--shared-size", "24"], "shared size 24 must be >= 0 and below the expert width 24"),
        (["--departments", "2", "--shared-size", "4", "--calibration", "missing.txt"], "missing.txt does not exist"),
        (["--departments", "2", "--shared-size", "4", "--calibration", "short.txt"], "calibration text is too short"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(vanilla_lm, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "short.txt").write_text("Anne Elliot")
    src = vanilla_lm.save_pretrained(tmp_path / "src")
    assert cli(["convert", str(src), "-o", "out", "--top-departments", "1", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_token_id_calibration_is_the_same_as_its_text(vanilla_lm):
    from_text = lm_source(vanilla_lm, ByteTokenizer(), TEXT, seq_len=32)
    ids = torch.tensor(ByteTokenizer().encode(TEXT))
    from_ids = lm_source(vanilla_lm, ByteTokenizer(), ids, seq_len=32)
    assert torch.equal(from_text.calibration_windows, from_ids.calibration_windows)
    with pytest.raises(UsageError, match=r"calibration token ids must be in \[0, 256\), got 0..300"):
        lm_source(vanilla_lm, ByteTokenizer(), torch.tensor([0, 300]), seq_len=32)


def test_source_with_shared_parts_is_refused(tmp_path, capsys):
    src = DeaMoELM.random(MICRO, seed=1).save_pretrained(tmp_path / "src")
    argv = [
        "convert",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--departments",
        "2",
        "--shared-size",
        "4",
        "--top-departments",
        "1",
    ]
    assert cli(argv) == 2
    assert "already has department shared parts" in capsys.readouterr().err


def test_the_fine_grained_recipe_trains_deterministically_and_converts():
    from deamoe_trt.convert.testmodels import fine_grained, make_fine_grained

    config = fine_grained(layers=2, hidden=32, experts=8, width=16, top_k=2, context=48)
    runs = [make_fine_grained(3, config=config, seed=1, progress=False, seq_len=32) for _ in range(2)]
    assert runs[0].val_loss == runs[1].val_loss
    model = runs[0].model.eval()
    assert [model.layers[i].mlp.config.num_experts for i in model.moe_layers()] == [8, 8]
    source = lm_source(model, ByteTokenizer(), TEXT, seq_len=32)
    result, _ = convert_model(source, ConvertSettings(2, 1, shared_size=8), compare=False, progress=False)
    assert result.lm.config.moe.shared_intermediate_size == 8
