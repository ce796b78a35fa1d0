"""`convert --method pruned|top-k`: the report's alternatives written as checkpoints whose
held-out quality is the report's, read by generate and info; bad sizes refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from configs import MICRO_LM
from deamoe_trt.cli.main import main as cli
from deamoe_trt.convert.baselines import PRUNED, TOP_K, lowered_topk_layer, pruned_layer
from deamoe_trt.convert.metrics import lm_quality
from deamoe_trt.convert.sources import lm_source
from deamoe_trt.lm import ByteTokenizer, DeaMoELM, load_lm
from deamoe_trt.train.lm import shipped_text

# MICRO_LM with vanilla MoE FFNs (4 experts of width 24, top-2), as tests/convert/test_convert_lm.py's.
VANILLA = MICRO_LM.replace(
    moe=MICRO_LM.moe.replace(
        num_departments=1, experts_per_department=4, shared_intermediate_size=0, private_intermediate_size=24
    )
)
TEXT = shipped_text()[:20000]
WINDOWS = 3


@pytest.fixture
def source_dir(tmp_path):
    lm = DeaMoELM.random(VANILLA, seed=5).eval()
    src = lm.save_pretrained(tmp_path / "src")
    (tmp_path / "calibration.txt").write_text(TEXT)
    return src


def _data(tmp_path) -> list[str]:
    return ["--calibration", str(tmp_path / "calibration.txt"), "--heldout-windows", str(WINDOWS)]


def _exact_perplexity(lm, layers_of) -> float:
    """Held-out perplexity of the source with each FFN replaced by layers_of(ffn, calibration
    inputs), on the windows the CLI measures (unrounded)."""
    from deamoe_trt.convert.run import _lm_with

    source = lm_source(lm, ByteTokenizer(), TEXT, heldout_windows=WINDOWS)
    layers = [layers_of(layer, x) for layer, x in zip(source.layers, source.calibration, strict=True)]
    windows = source.heldout_windows
    with torch.no_grad():
        return lm_quality(_lm_with(lm, layers), lm(windows[:, :-1]).logits, windows)["perplexity"]


def _written_perplexity(src, out) -> float:
    source = load_lm(src).model
    written = load_lm(out).model
    s = lm_source(source, ByteTokenizer(), TEXT, heldout_windows=WINDOWS)
    windows = s.heldout_windows
    with torch.no_grad():
        return lm_quality(written, source(windows[:, :-1]).logits, windows)["perplexity"]


@pytest.mark.slow
def test_written_alternatives_are_the_reports(source_dir, tmp_path, capsys):
    report = tmp_path / "full.json"
    argv = ["convert", str(source_dir), "-o", str(tmp_path / "deamoe"), "--departments", "2"]
    argv += ["--shared-fraction", "0.5", "--top-departments", "1", "--report", str(report), *_data(tmp_path)]
    assert cli(argv) == 0
    rows = {r["method"]: r for r in json.loads(report.read_text())["rows"]}
    source_lm = load_lm(source_dir).model
    k, width = rows[TOP_K]["top_k"], rows[PRUNED]["expert_width"]
    f = VANILLA.moe.expert_intermediate_size
    for method, flags, name, expected in (
        ("top-k", ["--top-k", str(k)], TOP_K, lambda layer, x: lowered_topk_layer(layer, k)),
        ("pruned", ["--keep-fraction", str(width / f)], PRUNED, lambda layer, x: pruned_layer(layer, x, width)),
    ):
        out, own = tmp_path / method, tmp_path / f"{method}.json"
        argv = ["convert", str(source_dir), "-o", str(out), "--method", method, *flags, "--report", str(own)]
        assert cli([*argv, *_data(tmp_path)]) == 0
        written = load_lm(out)
        moe = written.model.config.moe
        assert (moe.num_departments, moe.shared_intermediate_size) == (1, 0)
        assert moe.top_k == (k if method == "top-k" else VANILLA.moe.top_k)
        assert moe.expert_intermediate_size == (f if method == "top-k" else width)
        perplexity = _written_perplexity(source_dir, out)
        # the full report's row for the method (rounded to 4 places there) and its exact value
        assert round(perplexity, 4) == rows[name]["perplexity"]
        assert perplexity == pytest.approx(_exact_perplexity(source_lm, expected), rel=1e-6)
        assert json.loads(own.read_text())["rows"][1]["perplexity"] == rows[name]["perplexity"]
        capsys.readouterr()
        assert cli(["generate", str(out), "--prompt", "Anne", "--max-new-tokens", "4"]) == 0
        assert capsys.readouterr().out.strip()
        assert cli(["info", str(out)]) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "top-k", "--top-k", "3"], "--top-k 3 must be below the source's top-2"),
        (["--method", "top-k", "--top-k", "2"], "--top-k 2 must be below the source's top-2"),
        (["--method", "top-k"], "--method top-k needs --top-k K"),
        (["--method", "pruned", "--keep-fraction", "1"], "expected a number in (0, 1)"),
        (["--method", "pruned", "--keep-fraction", "0"], "expected a number in (0, 1)"),
        (["--method", "pruned", "--keep-fraction", "0.01"], "keeps 0 of 24 neurons"),
        (["--method", "pruned"], "--method pruned needs --keep-fraction"),
        (["--method", "pruned", "--keep-fraction", "0.5", "--departments", "2"], "--departments is the DeaMoE"),
        (["--top-k", "1", "--departments", "2", "--shared-size", "4", "--top-departments", "1"], "--top-k takes"),
        (["--departments", "2", "--shared-size", "4"], "convert needs --top-departments"),
    ],
)
def test_bad_method_input_is_one_line_and_writes_nothing(source_dir, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    try:
        status = cli(["convert", str(source_dir), "-o", "out", *extra])
    except SystemExit as exc:  # argparse's own refusal (the value's type)
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_healed_alternatives_are_the_reports_healed_rows(source_dir, tmp_path):
    report = tmp_path / "full.json"
    heal = ["--heal-steps", "3", "--heal-batch", "2"]
    argv = ["convert", str(source_dir), "-o", str(tmp_path / "deamoe"), "--departments", "2"]
    argv += ["--shared-fraction", "0.5", "--top-departments", "1", "--report", str(report), *heal, *_data(tmp_path)]
    assert cli(argv) == 0
    rows = {r["method"]: r for r in json.loads(report.read_text())["rows"]}
    f = VANILLA.moe.expert_intermediate_size
    flags = {
        PRUNED: ["--method", "pruned", "--keep-fraction", str(rows[PRUNED]["expert_width"] / f)],
        TOP_K: ["--method", "top-k", "--top-k", str(rows[TOP_K]["top_k"])],
    }
    healed = [name for name in flags if f"{name} + healed" in rows]
    assert healed  # the report heals the two baselines closest to the source; on this model one of these
    for name in healed:
        out = tmp_path / name.replace(" ", "-")
        assert cli(["convert", str(source_dir), "-o", str(out), *flags[name], *heal, *_data(tmp_path)]) == 0
        perplexity = _written_perplexity(source_dir, out)
        assert round(perplexity, 4) == rows[f"{name} + healed"]["perplexity"]
        assert perplexity != pytest.approx(rows[name]["perplexity"], abs=1e-4)  # healing changed it


@pytest.mark.slow
def test_healed_lower_top_k_is_the_report_healing(source_dir, tmp_path):
    """The report heals only the two baselines closest to the source (here not lower top-k):
    the written healed model against the report's healing of it, run here."""
    from deamoe_trt.convert.core import ConvertSettings
    from deamoe_trt.convert.run import Variant, _heal, _lm_with

    out = tmp_path / "top1"
    heal = ["--heal-steps", "3", "--heal-batch", "2"]
    assert (
        cli(["convert", str(source_dir), "-o", str(out), "--method", "top-k", "--top-k", "1", *heal, *_data(tmp_path)])
        == 0
    )
    lm = load_lm(source_dir).model
    source = lm_source(lm, ByteTokenizer(), TEXT, heldout_windows=WINDOWS)
    layers = [lowered_topk_layer(layer, 1) for layer in source.layers]
    variant = Variant(TOP_K, 0.0, list(layers), [torch.arange(4)] * len(layers), lm=_lm_with(lm, layers))
    healed = _heal(source, variant, ConvertSettings(1, 1, shared_size=0, heal_steps=3, heal_batch=2), False, None)
    windows = source.heldout_windows
    with torch.no_grad():
        expected = lm_quality(healed.lm, lm(windows[:, :-1]).logits, windows)["perplexity"]
        unhealed = lm_quality(variant.lm, lm(windows[:, :-1]).logits, windows)["perplexity"]
    perplexity = _written_perplexity(source_dir, out)
    assert perplexity == pytest.approx(expected, rel=1e-6)
    assert perplexity != pytest.approx(unhealed, rel=1e-4)


def test_a_stack_is_written_as_a_stack_of_pruned_experts(tmp_path, capsys):
    from configs import QWEN2_STYLE_GATED_SHARED
    from deamoe_trt import DeaMoEStack

    source = DeaMoEStack.random(QWEN2_STYLE_GATED_SHARED, 2, seed=1)
    src = source.save_pretrained(tmp_path / "src")
    out = tmp_path / "out"
    argv = ["convert", str(src), "-o", str(out), "--method", "pruned", "--keep-fraction", "0.5"]
    assert cli([*argv, "--calibration-tokens", "256"]) == 0
    written = DeaMoEStack.from_pretrained(out)
    f = QWEN2_STYLE_GATED_SHARED.expert_intermediate_size
    assert [layer.config.expert_intermediate_size for layer in written.layers] == [round(0.5 * f)] * 2
    # the gated shared expert and the router are the source's
    for layer, src_layer in zip(written.layers, source.layers, strict=True):
        assert torch.equal(layer.router.weight, src_layer.router.weight)
        for name, tensor in src_layer.shared_experts.state_dict().items():
            assert torch.equal(layer.shared_experts.state_dict()[name], tensor)
