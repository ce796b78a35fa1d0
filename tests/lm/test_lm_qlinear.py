"""Weight-only int8/int4 beyond the FFNs: attention, dense MLP and head projections stored as
the FFNs are (quant.quantize_rtn's codes and scales), run as quant.dequantize defines them,
through the checkpoint, the CPU-kernel decoder, and `deamoe-trt quantize --linears`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from configs import LINEARS_MICRO_LM, QUANTIZABLE_MICRO_LM
from deamoe_trt.cli.main import main
from deamoe_trt.config import ConfigError
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import DeaMoELM, load_lm, save_lm
from deamoe_trt.quant import QuantConfig, dequantize, quantize_rtn
from deamoe_trt.runtimes.cpu_kernel import CpuDecoder
from deamoe_trt.runtimes.torch import TorchDecoder

IDS = [5, 17, 99, 3, 42, 7]
ALL = ("attention", "dense", "head")
CONFIG = LINEARS_MICRO_LM


@pytest.fixture(scope="module")
def float_model():
    return DeaMoELM.random(CONFIG, seed=5).eval()


@pytest.fixture(scope="module", params=[4, 8], ids=["int4", "int8"])
def quantized(request, float_model):
    return float_model.quantized(QuantConfig(request.param, 16), linears=ALL)


def dequantized(model: DeaMoELM) -> DeaMoELM:
    """The float model a quantized one stands for: every qweight/scales pair replaced by dequantize()."""
    q = model.config.quantization
    state = model.state_dict()
    dense = {}
    for name, t in state.items():
        if name.endswith(".qweight"):
            base = name.removesuffix(".qweight")
            dense[base] = dequantize(t, state[base + ".scales"], q.bits, q.group_size)
        elif not name.endswith(".scales"):
            dense[name] = t
    reference = DeaMoELM(model.config.replace(quantization=None, quantized_linears=()), dtype=model.dtype)
    reference.load_state_dict(dense)
    return reference.eval()


def test_every_projection_of_the_parts_is_stored_as_round_to_nearest_codes(float_model, quantized):
    quant, state, source = quantized.config.quantization, quantized.state_dict(), float_model.state_dict()
    projections = [n for n in state if n.endswith(".weight.qweight")]
    # 3 blocks x q/k/v/o, the dense block's gate/up/down, the head
    assert len(projections) == 3 * 4 + 3 + 1
    assert "lm_head.weight.qweight" in projections and "layers.1.mlp.down_proj.weight.qweight" in projections
    for name in projections:
        codes, scales = quantize_rtn(source[name.removesuffix(".qweight")], quant)
        assert torch.equal(state[name], codes) and torch.equal(state[name.replace(".qweight", ".scales")], scales)
    assert torch.equal(state["embed_tokens.weight"], source["embed_tokens.weight"])  # embeddings kept


def test_the_model_runs_the_dequantized_projections(quantized):
    ids = torch.tensor([IDS])
    with torch.no_grad():
        torch.testing.assert_close(quantized(ids).logits, dequantized(quantized)(ids).logits, atol=1e-5, rtol=1e-5)


def test_checkpoint_round_trip_keeps_the_parts_and_their_codes(quantized, tmp_path):
    save_lm(quantized, tmp_path / "q")
    header = json.loads((tmp_path / "q" / "config.json").read_text())
    assert header["config"]["quantized_linears"] == list(ALL)
    loaded = load_lm(tmp_path / "q").model
    assert loaded.config == quantized.config
    for name, tensor in quantized.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_float_and_ffn_only_configs_do_not_mention_the_parts(float_model):
    assert "quantized_linears" not in float_model.config.to_dict()
    assert "quantized_linears" not in float_model.quantized(QuantConfig(8, 16)).config.to_dict()


def test_cpu_kernel_decoder_runs_the_dequantized_projections(quantized):
    def logits(decoder):
        return np.stack([decoder.prefill(IDS[:-1]), decoder.step(IDS[-1])])

    want = logits(TorchDecoder(dequantized(quantized)))
    got = logits(CpuDecoder(quantized, threads=1))
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=1e-4)


def test_parts_without_quantization_a_tied_head_unknown_or_off_the_group_are_refused():
    with pytest.raises(ConfigError, match="quantized_linears needs quantization"):
        CONFIG.replace(quantized_linears=("attention",))
    q = QuantConfig(4, 16)
    with pytest.raises(ConfigError, match="the head cannot be quantized with tie_word_embeddings"):
        CONFIG.replace(quantization=q, quantized_linears=("head",), tie_word_embeddings=True)
    with pytest.raises(ConfigError, match="distinct parts of attention, dense, head"):
        CONFIG.replace(quantization=q, quantized_linears=("norms",))
    narrow = DeaMoELM.random(QUANTIZABLE_MICRO_LM, seed=0)  # its dense MLP is 24 wide
    with pytest.raises(UsageError, match=r"input width of layers\.1\.mlp\.down_proj is 24, not divisible by the group"):
        narrow.quantized(q, linears=("dense",))


def test_quantize_prints_the_held_out_perplexity_of_each_added_part(float_model, tmp_path, capsys):
    from deamoe_trt.lm import ByteTokenizer

    save_lm(float_model, tmp_path / "f", tokenizer=ByteTokenizer())
    out = tmp_path / "q"
    argv = ["quantize", str(tmp_path / "f"), "-o", str(out), "--bits", "8", "--group-size", "16"]
    assert main([*argv, "--linears", "attention,head"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith(("input", "int8"))]
    assert [r.split("  ")[0] for r in rows] == [
        "input (float32)",
        "int8, group 16",
        "int8, group 16 + attention",
        "int8, group 16 + attention + head",
    ]
    assert load_lm(out).model.config.quantized_linears == ("attention", "head")
    record = json.loads((out / "config.json").read_text())["training"]["quantization"]["held_out_perplexity"]
    # int8 round to nearest barely moves a random model's perplexity (about 256 for bytes)
    assert abs(record["int8, group 16 + attention + head"] / record["input"] - 1) < 0.01
    assert main([*argv, "--linears", "attention,norms"]) == 2
    assert "--linears takes distinct parts of attention, dense, head" in capsys.readouterr().err
