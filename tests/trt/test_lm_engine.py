"""`build_lm_engine` against a fake TensorRT: the prefill and decode profiles it asks for over
one set of weights, the builder settings, the engine written, and its failures."""

from __future__ import annotations

import pytest

from configs import MICRO_LM
from deamoe_trt.errors import DeaMoEError
from deamoe_trt.trt.lm_engine import DECODE, PREFILL, build_lm_engine


def test_one_engine_holds_a_prefill_and_a_decode_profile(fake_trt, no_plugin_search, tmp_path):
    trt = fake_trt("10.3.0")
    engine = build_lm_engine(tmp_path / "m.onnx", tmp_path / "out" / "m.engine", MICRO_LM, fp16=True, workspace_mib=64)
    config = trt.configs[0]
    assert trt.parsed == [("file", str(tmp_path / "m.onnx"), None)]
    assert config.pools == {trt.MemoryPoolType.WORKSPACE: 64 << 20} and config.flags == {trt.BuilderFlag.FP16}
    context, heads = MICRO_LM.max_position_embeddings, MICRO_LM.num_key_value_heads
    width = MICRO_LM.hidden_size // MICRO_LM.num_heads
    prefill, decode = config.profiles[PREFILL].shapes, config.profiles[DECODE].shapes
    assert len(config.profiles) == 2
    assert prefill["input_ids"] == ((1, 1), (1, min(64, context)), (1, context))
    assert decode["input_ids"] == ((1, 1),) * 3
    pasts = [f"past_key_values.{i}.{part}" for i in range(MICRO_LM.num_layers) for part in ("key", "value")]
    assert set(prefill) == set(decode) == {"input_ids", *pasts}
    for name in pasts:
        assert prefill[name] == ((1, heads, 0, width),) * 3  # an empty cache: the prompt fills it
        assert decode[name] == ((1, heads, 1, width), (1, heads, context // 2, width), (1, heads, context - 1, width))
    assert engine == tmp_path / "out" / "m.engine" and engine.read_bytes().startswith(b"ENGINE:")
    assert not list(engine.parent.glob(".*.tmp"))


def test_parse_errors_are_one_line_naming_the_model(fake_trt, no_plugin_search, tmp_path):
    fake_trt(parse_errors=["bad opset", "second"])
    with pytest.raises(DeaMoEError, match=r"TensorRT cannot parse .*m\.onnx: bad opset; second \(plugin: "):
        build_lm_engine(tmp_path / "m.onnx", tmp_path / "m.engine", MICRO_LM)


def test_a_failed_build_leaves_the_older_engine(fake_trt, no_plugin_search, tmp_path):
    fake_trt(build_fails=True)
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"old")
    with pytest.raises(DeaMoEError, match="could not build the language-model engine"):
        build_lm_engine(tmp_path / "m.onnx", engine, MICRO_LM)
    assert engine.read_bytes() == b"old" and not list(tmp_path.glob(".*.tmp"))
