"""Converting a gpt-oss-style vanilla MoE (biased experts, clamped SwiGLU, router logit
bias): the biases keep their roles, against the spec's reference math."""

from __future__ import annotations

import pytest
import torch

from configs import GPT_OSS_STYLE
from deamoe_trt import DeaMoELayer
from deamoe_trt.config import ConfigError
from deamoe_trt.convert.core import ConvertSettings, convert_layer
from deamoe_trt.inputs import random_hidden
from spec_reference import spec_forward

D = GPT_OSS_STYLE.hidden_size
N = GPT_OSS_STYLE.num_experts
F_S = GPT_OSS_STYLE.shared_intermediate_size


def planted() -> tuple[DeaMoELayer, DeaMoELayer]:
    """(a gpt-oss-style DeaMoE layer, its vanilla twin): the twin's experts hide 4
    departments whose first f_s neurons, biases included, are identical."""
    layer = DeaMoELayer.random(GPT_OSS_STYLE, seed=3)
    return layer, layer.vanilla()


def calibration(tokens: int = 2048, seed: int = 1) -> torch.Tensor:
    return random_hidden(tokens, D, seed=seed)


def test_identity_conversion_of_a_biased_clamped_layer_is_exact():
    _, source = planted()
    shuffled = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # experts out of their planted order: clustering has work to do
        for name in ("gate_up", "down", "gate_up_bias", "down_bias"):
            getattr(source.experts, name).copy_(getattr(source.experts, name)[shuffled])
    converted = convert_layer(source, calibration(), ConvertSettings(departments=1, top_departments=1, shared_size=0))
    assert converted.layer.config == source.config
    for name, tensor in source.state_dict().items():
        assert torch.equal(converted.layer.state_dict()[name], tensor), name
    x = calibration(64, seed=9)
    assert torch.equal(converted.layer(x), source(x))


def test_shared_neurons_take_their_biases_and_experts_keep_their_down_biases():
    truth, source = planted()
    conversion = convert_layer(
        source, calibration(), ConvertSettings(4, 2, shared_size=F_S, grouping="keep", department_score="max")
    )
    layer = conversion.layer
    assert layer.config.router_logit_bias and layer.config.ffn_bias
    assert torch.equal(layer.router.logit_bias, source.router.logit_bias[conversion.order])
    assert torch.equal(layer.experts.down_bias, source.experts.down_bias[conversion.order])
    assert torch.equal(layer.shared_experts.down_bias, source.shared_experts.down_bias)
    for j in range(4):
        # Each shared neuron as (gate row, up row, gate bias, up bias): the planted ones, in some order.
        def neurons(gate_up, bias):
            gate, up = gate_up.chunk(2)
            gate_bias, up_bias = bias.chunk(2)
            rows = torch.cat((gate, up, gate_bias[:, None], up_bias[:, None]), 1)
            return {tuple(r) for r in rows.round(decimals=4).tolist()}

        found = neurons(layer.departments.gate_up[j], layer.departments.gate_up_bias[j])
        assert found == neurons(truth.departments.gate_up[j], truth.departments.gate_up_bias[j])
    x = calibration(8, seed=5)
    tensors = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    expected = torch.from_numpy(spec_forward(x.numpy(), tensors, layer.config)).float()
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-5)
    # The planted layer is recovered, its routing (same score) and outputs included.
    torch.testing.assert_close(layer(x), truth(x), rtol=1e-3, atol=1e-3)


def test_merged_alternative_of_a_biased_layer_is_a_one_line_refusal():
    _, source = planted()
    from deamoe_trt.convert.core import convert_layer as convert

    with pytest.raises(ConfigError, match="ffn_bias needs private_intermediate_size >= 1"):
        convert(source, calibration(), ConvertSettings(4, 2, shared_size=F_S), method="merged", merged_width=24)


@pytest.mark.slow  # the whole command: baselines and healing
def test_convert_with_baselines_and_healing_completes_and_skips_only_the_merged_baseline(tmp_path, capsys):
    import json

    from deamoe_trt import DeaMoEStack
    from deamoe_trt.cli.main import main

    _, source = planted()
    src = DeaMoEStack.from_layers([source]).save_pretrained(tmp_path / "src")
    argv = ["convert", str(src), "-o", str(tmp_path / "out"), "--departments", "4", "--top-departments", "2"]
    argv += [
        "--shared-size",
        str(F_S),
        "--calibration-tokens",
        "256",
        "--heal-steps",
        "2",
        "--report",
        str(tmp_path / "r.json"),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note: no merged-experts baseline for experts with biases" in err
    methods = {row["method"] for row in json.loads((tmp_path / "r.json").read_text())["rows"]}
    assert "merged" not in methods and {"source", "converted", "naive", "converted + healed"} <= methods
    converted = DeaMoEStack.from_pretrained(tmp_path / "out")
    assert converted.config.ffn_bias and converted.config.private_intermediate_size >= 1
