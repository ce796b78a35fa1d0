import numpy as np
import onnx
import pytest
import torch

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.export.lm import build_lm_model, export_lm, lm_export_info
from deamoe_trt.lm import DeaMoELM, load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder
from deamoe_trt.validation.lm import validate_lm

PROMPT = list(b"Anne was ")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["ort", "onnx", "plugin"])
def test_onnx_greedy_decoding_matches_pytorch_token_for_token(micro_model, form):
    steps = 24 if form != "plugin" else 8  # the plugin form runs each FFN through a Python op: slower
    ref = generate(TorchDecoder(micro_model), PROMPT, steps).new_ids
    got = generate(OrtDecoder.from_model(micro_model, form=form), PROMPT, steps).new_ids
    assert got == ref


@pytest.mark.slow
def test_expanded_twin_export_decodes_the_same_tokens(micro_model):
    ref = generate(TorchDecoder(micro_model), PROMPT, 16).new_ids
    assert generate(OrtDecoder.from_model(micro_model.expanded()), PROMPT, 16).new_ids == ref


def test_logits_and_cache_match_pytorch_with_batch_and_chunked_prefill(micro_model):
    decoder = OrtDecoder.from_model(micro_model, form="onnx")
    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(5))
    logits, cache = decoder.run(ids[:, :6].numpy(), decoder.empty_cache(2))
    logits, cache = decoder.run(ids[:, 6:].numpy(), cache)  # 5 new tokens after 6 cached
    with torch.no_grad():
        ref = micro_model(ids[:, 6:], micro_model(ids[:, :6]).past_key_values)
    np.testing.assert_allclose(logits, ref.logits.numpy(), atol=1e-4, rtol=1e-3)
    flat = [t.numpy() for kv in ref.past_key_values for t in kv]
    for got, want in zip(cache, flat, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-3)


def test_graph_io_and_metadata(micro_model):
    proto = build_lm_model(micro_model, "plugin")
    onnx.checker.check_model(proto)
    inputs = [i.name for i in proto.graph.input]
    outputs = [o.name for o in proto.graph.output]
    assert inputs == ["input_ids"] + [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert sum(n.op_type == "DeaMoE" for n in proto.graph.node) == 2
    info = lm_export_info(proto)
    assert (info.form, info.dtype, info.config) == ("plugin", "fp32", micro_model.config)
    names = {t.name for t in proto.graph.initializer}
    assert {"embed_tokens.weight", "lm_head.weight", "layers.1.mlp.router.weight", "rope.cos"} <= names


def test_fp16_export_runs_close_to_pytorch(micro_model):
    decoder = OrtDecoder.from_model(micro_model, dtype="fp16")
    logits = decoder.prefill(PROMPT)
    with torch.no_grad():
        ref = micro_model(torch.tensor([PROMPT])).logits[0, -1].numpy()
    assert np.abs(logits - ref).max() < 0.05


def test_validate_lm_passes_and_names_a_wrong_checkpoint(tmp_path, micro_model, micro_checkpoint):
    path = export_lm(micro_model, tmp_path / "m.onnx", "ort")
    report = validate_lm(path, micro_checkpoint, tokens=(3,))
    assert report.passed
    assert [r.output for r in report.rows][:1] == ["logits @past=0"]
    assert {r.tokens for r in report.rows} == {3, 1}
    other = DeaMoELM.random(micro_model.config, seed=99).save_pretrained(tmp_path / "other")
    with pytest.raises(UsageError, match=r"lm_head\.weight differs"):
        validate_lm(path, other, tokens=(3,))


def test_validate_command_takes_language_models(tmp_path, micro_model, micro_checkpoint, capsys):
    path = export_lm(micro_model, tmp_path / "m.onnx", "onnx")
    assert main(["validate", str(path), "--against", str(micro_checkpoint), "--tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "present.1.value @past=2" in out and "FAIL" not in out


@pytest.mark.slow
def test_export_lm_command(tmp_path, micro_checkpoint, capsys):
    out = tmp_path / "lm.onnx"
    assert main(["export-lm", str(micro_checkpoint), "-o", str(out), "--twin", "expanded", "--validate"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "expanded" in text and "logits @past=0" in text
    assert lm_export_info(onnx.load(str(out))).twin == "expanded"
    loaded = load_lm(micro_checkpoint)
    assert OrtDecoder.from_file(out).prefill(PROMPT).shape == (loaded.model.config.vocab_size,)
