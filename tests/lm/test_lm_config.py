"""LMConfig's attention and layer options: old configs read unchanged, bad values one line each,
and the rotary variants equal transformers' (YaRN, linear)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from deamoe_trt.config import ConfigError
from deamoe_trt.lm import get_lm_preset
from deamoe_trt.lm.config import LMConfig
from deamoe_trt.lm.rope import inverse_frequencies
from deamoe_trt.lm.shipped import TINY_LM


def test_a_config_written_before_the_new_fields_reads_with_their_defaults():
    data = json.loads((TINY_LM / "config.json").read_text())["config"]
    old = {k: v for k, v in data.items() if k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
           "num_key_value_heads", "max_position_embeddings", "moe", "rope_theta", "rms_norm_eps")}  # fmt: skip
    config = LMConfig.from_dict(old)
    assert config == get_lm_preset("tiny-lm").replace(rope_theta=config.rope_theta)
    assert config.head_dim == 32 and config.qk_norm == "none" and not config.dense_layers
    assert LMConfig.from_dict(json.loads(config.to_json())) == config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qk_norm": "layer"}, "qk_norm must be one of none, head, full"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn needs original_max_position_embeddings"),
        ({"dense_layers": [5]}, "dense_layers must list block indices 0..2"),
        ({"dense_layers": [1]}, "dense_layers needs dense_intermediate_size >= 1"),
        ({"sliding_window": -1}, "sliding_window must be an integer >= 0"),
        ({"head_dim": 33}, "head_dim (33) must be even"),
    ],
)
def test_bad_options_are_one_line(change, message):
    data = {**get_lm_preset("tiny-lm").to_dict(), **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        LMConfig.from_dict(data)


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16, "mscale": 1.2,
         "mscale_all_dim": 1.0},
    ],
)  # fmt: skip
def test_rotary_frequencies_equal_transformers(params):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = transformers.Qwen3MoeConfig(
        hidden_size=64, num_attention_heads=4, head_dim=32, max_position_embeddings=256,
        rope_parameters={**params, "rope_theta": 10000.0},
    )  # fmt: skip
    want, want_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")
    got, factor = inverse_frequencies(32, 10000.0, params, 256)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)
