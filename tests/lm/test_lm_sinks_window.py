"""Attention sinks and sliding-window blocks whose KV cache keeps only the window, in PyTorch
and after export-lm on ONNX Runtime (transformers' gpt-oss is the end-to-end reference in
tests/importers/families/test_gpt_oss.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from configs import MICRO_LM
from deamoe_trt.config import ConfigError
from deamoe_trt.lm import DeaMoELM, LMConfig
from deamoe_trt.lm.attention import Attention

# Blocks 0 and 2 slide over 4 positions, block 1 sees every key; every head has a sink.
SINKS = MICRO_LM.replace(num_layers=3, sliding_window=4, sliding_window_layers=(0, 2), attention_sinks=True)


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return DeaMoELM.random(SINKS, seed=5).eval()


def _ids(tokens: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, SINKS.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def test_a_sliding_block_keeps_window_minus_one_keys_and_a_full_block_all(model):
    ids = _ids(9)
    with torch.no_grad():
        cache = model(ids[:, :2]).past_key_values
        assert [kv[0].shape[2] for kv in cache] == [2, 2, 2]
        for t in range(2, 9):
            cache = model(ids[:, t : t + 1], cache).past_key_values
            assert [kv[0].shape[2] for kv in cache] == [min(t + 1, 3), t + 1, min(t + 1, 3)]
            assert [kv[1].shape[2] for kv in cache] == [min(t + 1, 3), t + 1, min(t + 1, 3)]


def test_the_windowed_cache_reproduces_the_full_forward(model):
    ids = _ids(20)
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :7])  # a prefill longer than the window
        steps, cache = [out.logits], out.past_key_values
        for t in range(7, 20, 3):  # chunks of 3, then 1
            out = model(ids[:, t : t + 3], cache)
            steps.append(out.logits)
            cache = out.past_key_values
    got = torch.cat(steps, dim=1)
    assert (got - full).abs().max() <= 1e-5 * full.abs().max()


def test_a_head_with_one_key_keeps_sigmoid_of_score_minus_sink_of_its_value():
    # One token attends to itself only: p = e^s / (e^s + e^sink) = sigmoid(s - sink), an
    # independent restatement of the sink's share for a single key.
    config = SINKS.replace(num_layers=1, sliding_window=0, sliding_window_layers=None)
    torch.manual_seed(0)
    attn = Attention(config)
    with torch.no_grad():
        attn.sinks.copy_(torch.tensor([-2.0, 0.0, 1.5, 4.0]))
        x = torch.randn(1, 1, config.hidden_size)
        cos, sin = torch.ones(1, config.head_dim // 2), torch.zeros(1, config.head_dim // 2)
        got, _ = attn(x, cos, sin, None)
        q = attn.q_proj(x).view(config.num_heads, config.head_dim).double()
        k = attn.k_proj(x).view(config.num_key_value_heads, config.head_dim).double()
        v = attn.v_proj(x).view(config.num_key_value_heads, config.head_dim).double()
        group = config.num_heads // config.num_key_value_heads
        heads = []
        for h in range(config.num_heads):
            score = (q[h] @ k[h // group]) / math.sqrt(config.head_dim)
            heads.append(torch.sigmoid(score - attn.sinks[h].double()) * v[h // group])
        want = attn.o_proj(torch.cat(heads).float().view(1, 1, -1))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_very_negative_sink_is_plain_softmax(model):
    plain = DeaMoELM(SINKS.replace(attention_sinks=False)).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(".sinks")}
    plain.load_state_dict(state)
    sunk = DeaMoELM(SINKS).eval()
    sunk.load_state_dict({**state, **{f"layers.{i}.self_attn.sinks": torch.full((4,), -1e4) for i in range(3)}})
    ids = _ids(10)
    with torch.no_grad():
        assert torch.allclose(sunk(ids).logits, plain(ids).logits, rtol=0, atol=1e-6)
        assert not torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-3)  # the learned sinks matter


def test_every_block_sliding_keeps_full_caches():
    config = SINKS.replace(sliding_window_layers=None)
    assert config.position_layer() is None and config.cache_keep(0) == 0
    with torch.no_grad():
        cache = DeaMoELM.random(config).eval()(_ids(9)).past_key_values
    assert [kv[0].shape[2] for kv in cache] == [9, 9, 9]


def test_attention_sinks_is_written_only_when_set_and_must_be_a_bool():
    assert "attention_sinks" not in MICRO_LM.to_dict()
    assert SINKS.to_dict()["attention_sinks"] is True
    assert LMConfig.from_dict(SINKS.to_dict()) == SINKS
    with pytest.raises(ConfigError, match="attention_sinks must be true or false"):
        SINKS.replace(attention_sinks=1)


@pytest.mark.parametrize("form", ["ort", "onnx", "plugin"])
def test_onnx_runtime_decodes_sinks_and_windowed_caches_like_pytorch(model, form):
    from deamoe_trt.runtimes.onnxruntime import OrtDecoder

    decoder = OrtDecoder.from_model(model, form=form, threads=1)
    ids = _ids(12, seed=4, batch=1)
    logits, cache = decoder.run(ids[:, :6].numpy(), decoder.empty_cache())
    steps = [logits]
    for t in range(6, 12):
        logits, cache = decoder.run(ids[:, t : t + 1].numpy(), cache)
        steps.append(logits)
        assert [cache[2 * i].shape[2] for i in range(3)] == [min(t + 1, 3), t + 1, min(t + 1, 3)]
    with torch.no_grad():
        want = model(ids).logits.numpy()
    got = np.concatenate(steps, axis=1)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_tensorrt_decode_profile_of_a_sliding_block_stops_at_its_kept_keys():
    from deamoe_trt.export.lm import past_names
    from deamoe_trt.trt.lm_engine import DECODE, lm_profiles

    decode = lm_profiles(SINKS)[DECODE]
    longest = [decode[past_names(i)[0]][2][2] for i in range(3)]
    assert longest == [3, SINKS.max_position_embeddings - 1, 3]
    assert [SINKS.cached_keys(i, 10) for i in range(3)] == [3, 10, 3]


def test_export_lm_validate_checks_the_windowed_presents(model, tmp_path, capsys):
    from deamoe_trt.cli.main import main

    checkpoint = model.save_pretrained(tmp_path / "sinks-lm")
    assert main(["export-lm", str(checkpoint), "-o", str(tmp_path / "m.onnx"), "--form", "onnx", "--validate"]) == 0
    assert "present.0.key" in capsys.readouterr().out
