"""`quantize --no-compare` of a language model, streamed tensor by tensor from disk: the
same files as quantizing the model in memory and saving it, and bad input refused whole."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs import QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.lm import DeaMoELM, load_lm, save_lm
from deamoe_trt.quant import QuantConfig

SOURCES = {
    # a dense block, shared experts with a gate, router biases; untied head
    "bf16": (QUANTIZABLE_MICRO_LM, torch.bfloat16),
    # tied embeddings (the head is not stored) and a float32 router in a float16 model
    "fp16-tied": (QUANTIZABLE_MICRO_LM.replace(tie_word_embeddings=True, float32_router=True), torch.float16),
    "fp32": (QUANTIZABLE_MICRO_LM, torch.float32),
}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def source(request, tmp_path_factory):
    config, dtype = SOURCES[request.param]
    model = DeaMoELM.random(config, seed=7, dtype=dtype)
    return save_lm(model, tmp_path_factory.mktemp("src") / request.param, training={"note": "kept"})


def in_memory(source, output, quant):
    """What quantizing the loaded model and saving it writes (the path that holds the model)."""
    loaded = load_lm(source)
    record = {"source": str(source), **quant.to_dict()}
    training = {**loaded.training, "quantization": record}
    return save_lm(loaded.model.quantized(quant), output, tokenizer=loaded.tokenizer, training=training)


@pytest.mark.parametrize("bits", [4, 8])
def test_streamed_files_are_the_in_memory_files_byte_for_byte(source, bits, tmp_path, capsys):
    quant = QuantConfig(bits, 16)
    expected = in_memory(source, tmp_path / "memory", quant)
    out = tmp_path / "streamed"
    args = ["quantize", str(source), "-o", str(out), "--bits", str(bits), "--group-size", "16", "--no-compare"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "Held-out perplexity" not in printed and "relative error" not in printed  # nothing measured
    assert f"2 DeaMoE FFN(s) of 3 block(s), int{bits}" in printed
    got, want = load_file(out / "model.safetensors"), load_file(expected / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert (out / "model.safetensors").read_bytes() == (expected / "model.safetensors").read_bytes()
    assert (out / "config.json").read_bytes() == (expected / "config.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["training"]["note"] == "kept"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no temporary left


def test_the_measured_path_writes_the_same_weights(source, tmp_path, capsys):
    if source.name != "bf16":
        pytest.skip("one source is enough for the slower measured path")
    """Without --no-compare the model is quantized in memory and measured; the weights agree."""
    args = ["quantize", str(source), "--bits", "4", "--group-size", "16"]
    assert main([*args, "-o", str(tmp_path / "measured")]) == 0
    assert "Held-out perplexity" in capsys.readouterr().out
    assert main([*args, "-o", str(tmp_path / "streamed"), "--no-compare"]) == 0
    measured, streamed = (tmp_path / d / "model.safetensors" for d in ("measured", "streamed"))
    assert measured.read_bytes() == streamed.read_bytes()


def test_no_compare_with_linears_holds_the_model_and_skips_the_measurements(source, tmp_path, capsys):
    out = tmp_path / "q"
    args = ["quantize", str(source), "-o", str(out), "--bits", "8", "--group-size", "16", "--no-compare"]
    assert main([*args, "--linears", "attention"]) == 0
    assert "Held-out perplexity" not in capsys.readouterr().out
    assert load_lm(out).model.config.quantized_linears == ("attention",)


def test_bad_input_is_one_line_and_writes_nothing(source, tmp_path, capsys):
    def refused(args, message):
        out = tmp_path / "out"
        assert main(["quantize", *args, "-o", str(out), "--no-compare"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not out.exists() or not any(out.iterdir())

    refused([str(source), "--bits", "4", "--method", "awq"], "--no-compare is for --method rtn")
    refused([str(source), "--bits", "4", "--group-size", "128"], "not divisible by the group size 128")
    q = tmp_path / "q"
    assert main(["quantize", str(source), "-o", str(q), "--bits", "4", "--group-size", "16", "--no-compare"]) == 0
    capsys.readouterr()
    refused([str(q), "--bits", "4"], "the model is already quantized (int4, group size 16)")
    # A NaN in the last tensor the writer reaches: refused after the others were written.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    name = sorted(n for n in tensors if n.endswith("experts.down"))[-1]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(broken / "model.safetensors"))
    refused([str(broken), "--bits", "4", "--group-size", "16"], f"{name} contains NaN or Inf")
