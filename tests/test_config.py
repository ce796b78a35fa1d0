import json

import pytest

from deamoe_trt import PRESETS, DeaMoEConfig
from deamoe_trt.config import ConfigError


def tiny(**changes):
    return PRESETS["tiny"].replace(**changes)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"top_k": 9}, "top_k"),  # k > g*m = 8
        ({"top_departments": 5}, "top_departments"),  # g > D = 4
        ({"shared_intermediate_size": 0, "private_intermediate_size": 0}, "shared_intermediate_size"),
        ({"score_func": "relu"}, "score_func"),
        ({"department_score": "mean"}, "department_score"),
        ({"experts_per_department": 1, "top_k": 2, "department_score": "sum_top2"}, "sum_top2"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"private_intermediate_size": -1}, "private_intermediate_size"),
        ({"routed_scaling_factor": 0.0}, "routed_scaling_factor"),
        ({"routed_scaling_factor": float("nan")}, "routed_scaling_factor"),
        ({"norm_topk_prob": 1}, "norm_topk_prob"),
        ({"shared_expert_gate": True}, "shared_expert_gate"),
        ({"top_k": 2.0}, "top_k"),
        ({"activation": "gelu"}, "activation"),
        ({"activation": "swiglu_clamped", "swiglu_limit": 0.0}, "swiglu_limit"),
        ({"activation": "swiglu_clamped", "swiglu_limit": -7.0}, "swiglu_limit"),
        ({"activation": "swiglu_clamped", "swiglu_alpha": float("inf")}, "swiglu_alpha"),
        ({"ffn_bias": 1}, "ffn_bias"),
        ({"router_logit_bias": "yes"}, "router_logit_bias"),
        ({"ffn_bias": True, "private_intermediate_size": 0}, "ffn_bias"),
    ],
)
def test_impossible_config_raises_one_line_naming_the_field(changes, field):
    with pytest.raises(ValueError) as info:
        tiny(**changes)
    message = str(info.value)
    assert field in message
    assert "\n" not in message


def test_config_errors_are_usage_errors_for_the_cli():
    from deamoe_trt.errors import UsageError

    with pytest.raises(UsageError):
        tiny(score_func="tanh")


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_round_trip_through_json(name):
    config = PRESETS[name]
    assert DeaMoEConfig.from_json(config.to_json()) == config


def test_json_with_unknown_or_missing_fields_is_rejected():
    data = PRESETS["tiny"].to_dict()
    with pytest.raises(ConfigError, match="unknown config field"):
        DeaMoEConfig.from_dict({**data, "num_expert": 3})
    del data["top_k"]
    with pytest.raises(ConfigError, match="missing required field"):
        DeaMoEConfig.from_dict(data)
    with pytest.raises(ConfigError, match="not valid JSON"):
        DeaMoEConfig.from_json("{")
    with pytest.raises(ConfigError, match="JSON object"):
        DeaMoEConfig.from_json(json.dumps([1, 2]))


def test_expanded_config_moves_shared_width_into_experts_and_keeps_routing():
    config = PRESETS["qwen3-30b-a3b-layer"]
    twin = config.expanded()
    assert twin.shared_intermediate_size == 0
    assert twin.private_intermediate_size == 768
    assert (twin.num_departments, twin.experts_per_department, twin.top_departments) == (16, 8, 2)


def test_vanilla_config_is_one_stage_top_k_over_all_experts():
    config = PRESETS["deepseek-v3-layer"]
    vanilla = config.vanilla()
    assert (vanilla.num_departments, vanilla.experts_per_department, vanilla.top_departments) == (1, 256, 1)
    assert vanilla.private_intermediate_size == 2048
    assert vanilla.top_k == 8


def test_spec_preset_shapes():
    qwen = PRESETS["qwen3-30b-a3b-layer"]
    assert (qwen.num_experts, qwen.expert_intermediate_size) == (128, 768)
    deepseek = PRESETS["deepseek-v3-layer"]
    assert (deepseek.num_experts, deepseek.expert_intermediate_size) == (256, 2048)


def test_differences_name_each_differing_field_in_order():
    tiny = PRESETS["tiny"]
    other = tiny.replace(top_k=2, score_func="sigmoid")
    assert tiny.differences(other) == ["top_k 4 vs 2", "score_func 'softmax' vs 'sigmoid'"]
    assert tiny.differences(tiny) == []


def test_third_wave_fields_are_written_only_when_set_and_round_trip():
    from configs import GPT_OSS_STYLE

    plain = tiny().to_dict()
    assert not {"ffn_bias", "activation", "swiglu_alpha", "swiglu_limit", "router_logit_bias"} & set(plain)
    data = GPT_OSS_STYLE.to_dict()
    assert data["activation"] == "swiglu_clamped" and data["swiglu_limit"] == 1.0 and data["swiglu_alpha"] == 1.702
    assert DeaMoEConfig.from_json(GPT_OSS_STYLE.to_json()) == GPT_OSS_STYLE
