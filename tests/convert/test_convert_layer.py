"""Invariants of converting one vanilla MoE layer, against the spec's reference math."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from deamoe_trt import DeaMoELayer, get_preset
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.convert.core import ConvertSettings, convert_layer
from deamoe_trt.convert.department_fit import fit_downs
from deamoe_trt.convert.heal import heal_layer
from deamoe_trt.convert.metrics import relative_error, step_bytes
from deamoe_trt.errors import UsageError
from deamoe_trt.inputs import random_hidden
from deamoe_trt.quant import QuantConfig
from spec_reference import spec_bytes, spec_forward

TINY = get_preset("tiny")  # d=64, D=4 x m=4, f_s=32, f_p=16, k=4, g=2


def planted_source(seed: int = 0) -> tuple[DeaMoELayer, DeaMoELayer]:
    """(a DeaMoE layer, its vanilla twin): a vanilla MoE whose experts hide 4 departments
    sharing 32 of their 48 neurons, in order."""
    layer = DeaMoELayer.random(TINY, seed=seed)
    return layer, layer.vanilla()


def calibration(tokens: int = 2048, seed: int = 1) -> torch.Tensor:
    return random_hidden(tokens, TINY.hidden_size, seed=seed)


def tensors(layer: DeaMoELayer) -> dict:
    return {k: v.detach().numpy() for k, v in layer.state_dict().items()}


def test_one_department_without_sharing_reproduces_the_source_exactly():
    _, source = planted_source()
    shuffled = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # experts out of their planted order: clustering has work to do
        source.experts.gate_up.copy_(source.experts.gate_up[shuffled])
        source.experts.down.copy_(source.experts.down[shuffled])
    settings = ConvertSettings(departments=1, top_departments=1, shared_size=0)
    converted = convert_layer(source, calibration(), settings).layer
    assert converted.config == source.config
    for name, tensor in source.state_dict().items():
        assert torch.equal(converted.state_dict()[name], tensor), name
    x = calibration(64, seed=9)
    assert torch.equal(converted(x), source(x))


def test_deepseek_groups_kept_without_sharing_reproduce_the_source_exactly():
    config = DeaMoEConfig(
        hidden_size=32,
        num_departments=4,
        experts_per_department=4,
        shared_intermediate_size=0,
        private_intermediate_size=24,
        top_k=4,
        top_departments=2,
        score_func="sigmoid",
        department_score="sum_top2",
        router_bias=True,
        routed_scaling_factor=2.5,
        shared_expert_intermediate_size=16,
    )
    source = DeaMoELayer.random(config, seed=2)
    settings = ConvertSettings(
        departments=4, top_departments=2, shared_size=0, grouping="keep", department_score="sum_top2"
    )
    x = random_hidden(512, 32, seed=3)
    converted = convert_layer(source, x, settings).layer
    for name, tensor in source.state_dict().items():
        assert torch.equal(converted.state_dict()[name], tensor), name


def test_converted_layer_has_the_spec_shapes_and_computes_the_spec_math():
    _, source = planted_source()
    settings = ConvertSettings(departments=4, top_departments=2, shared_size=20)
    conversion = convert_layer(source, calibration(), settings)
    layer, c = conversion.layer, conversion.layer.config
    assert (c.num_departments, c.experts_per_department) == (4, 4)
    assert (c.shared_intermediate_size, c.private_intermediate_size) == (20, 48 - 20)
    assert c.top_k == 4 and c.top_departments == 2
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert shapes == {
        "router.weight": (16, 64),
        "departments.gate_up": (4, 40, 64),
        "departments.down": (4, 64, 20),
        "experts.gate_up": (16, 56, 64),
        "experts.down": (16, 64, 28),
    }
    # The router rows are the source's, permuted with the experts.
    assert torch.equal(layer.router.weight, source.router.weight[conversion.order])
    assert sorted(conversion.order.tolist()) == list(range(16))
    x = calibration(8, seed=5)
    expected = spec_forward(x.numpy(), tensors(layer), c)
    torch.testing.assert_close(layer(x), torch.from_numpy(expected).float(), rtol=1e-4, atol=1e-5)


def test_bytes_per_step_follow_the_spec_formula():
    _, source = planted_source()
    converted = convert_layer(source, calibration(), ConvertSettings(4, 1, shared_size=24)).layer
    x = calibration(40, seed=6)
    routing = converted.route(x)
    spec = [spec_bytes(converted.config, [set(row)], 4) for row in routing.expert_ids.tolist()]
    assert step_bytes(converted.config, routing, 4) == pytest.approx(sum(spec) / len(spec))
    # One department per token, 4 experts: f_s + 4 f_p = 24 + 96 of the source's 4 x 48 neurons.
    assert spec[0] == 3 * 64 * (24 + 4 * 24) * 4 + 16 * 64 * 4


@pytest.mark.parametrize("tokens", [4, 8])
def test_bytes_per_step_of_several_tokens_count_each_part_once_per_step(tokens):
    _, source = planted_source()
    converted = convert_layer(source, calibration(), ConvertSettings(4, 1, shared_size=24)).layer
    x = calibration(40, seed=6)
    routing = converted.route(x)
    rows = routing.expert_ids.tolist()
    n = len(rows) // tokens  # a step takes tokens n apart: tokens s, s + n, ... (the remainder is left out)
    spec = [spec_bytes(converted.config, [set(rows[s + k * n]) for k in range(tokens)], 4) for s in range(n)]
    assert step_bytes(converted.config, routing, 4, tokens) == pytest.approx(sum(spec) / len(spec))
    assert step_bytes(converted.config, routing, 4, tokens) > step_bytes(converted.config, routing, 4)


def test_clustering_and_alignment_recover_planted_departments_and_shared_neurons():
    planted, source = planted_source()
    # Hide the structure: shuffle experts, and each expert's neurons.
    gen = torch.Generator().manual_seed(4)
    experts = torch.randperm(16, generator=gen)
    with torch.no_grad():
        gate_up, down = source.experts.gate_up[experts].clone(), source.experts.down[experts].clone()
        for e in range(16):
            perm = torch.randperm(48, generator=gen)
            gate_up[e] = torch.cat((gate_up[e, :48][perm], gate_up[e, 48:][perm]))
            down[e] = down[e][:, perm]
        source.experts.gate_up.copy_(gate_up)
        source.experts.down.copy_(down)
        source.router.weight.copy_(source.router.weight[experts])
    conversion = convert_layer(source, calibration(), ConvertSettings(4, 2, shared_size=32))
    true_department = (experts // 4).tolist()  # source expert i was planted expert experts[i]
    groups = conversion.order.view(4, 4).tolist()
    assert all(len({true_department[e] for e in g}) == 1 for g in groups)
    for j, group in enumerate(groups):
        found = conversion.layer.departments.gate_up[j]
        truth = planted.departments.gate_up[true_department[group[0]]]
        found_rows = {tuple(r) for r in torch.cat(found.chunk(2), 1).round(decimals=4).tolist()}
        true_rows = {tuple(r) for r in torch.cat(truth.chunk(2), 1).round(decimals=4).tolist()}
        assert found_rows == true_rows


def test_least_squares_fit_solves_the_joint_problem():
    gen = torch.Generator().manual_seed(0)
    d, f_s, f_p, m = 6, 4, 3, 3
    hs = [torch.randn(30, f_s, generator=gen) for _ in range(m)]
    hp = [torch.randn(30, f_p, generator=gen) for _ in range(m)]
    ys = [torch.randn(30, d, generator=gen) for _ in range(m)]
    ws = [torch.rand(30, generator=gen) + 0.1 for _ in range(m)]
    shared, private = fit_downs(hs, hp, ys, ws, torch.zeros(d, f_s), [torch.zeros(d, f_p)] * m, ridge=0.0)
    # Independent: the stacked weighted least-squares problem solved by lstsq.
    rows, targets = [], []
    for e in range(m):
        block = torch.zeros(30, f_s + m * f_p)
        block[:, :f_s] = hs[e]
        block[:, f_s + e * f_p : f_s + (e + 1) * f_p] = hp[e]
        rows.append(block * ws[e].sqrt()[:, None])
        targets.append(ys[e] * ws[e].sqrt()[:, None])
    solution = torch.linalg.lstsq(torch.cat(rows).double(), torch.cat(targets).double()).solution.float()
    torch.testing.assert_close(shared, solution[:f_s].t(), rtol=1e-4, atol=1e-4)
    for e in range(m):
        torch.testing.assert_close(private[e], solution[f_s + e * f_p : f_s + (e + 1) * f_p].t(), rtol=1e-4, atol=1e-4)


def test_aligned_conversion_beats_the_naive_one_on_shuffled_neurons_and_healing_lowers_the_error():
    _, source = planted_source()
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():  # same departments, but each expert lists its neurons in its own order
        for e in range(16):
            perm = torch.randperm(48, generator=gen)
            g, u = source.experts.gate_up[e].chunk(2)
            source.experts.gate_up[e].copy_(torch.cat((g[perm], u[perm])))
            source.experts.down[e].copy_(source.experts.down[e][:, perm])
    x, held = calibration(), calibration(512, seed=7)
    settings = ConvertSettings(4, 2, shared_size=32, grouping="keep")
    aligned = convert_layer(source, x, settings).layer
    naive = convert_layer(source, x, settings, method="naive").layer
    with torch.no_grad():
        ref = source(held)
        before = relative_error(aligned(held), ref)
        assert before < relative_error(naive(held), ref)
    losses = heal_layer(aligned, source, x, 12, lr=3e-3)
    assert len(losses) == 12
    with torch.no_grad():
        assert relative_error(aligned(held), ref) < before


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ConvertSettings(4, 2, shared_size=48), "below the expert width 48"),
        (ConvertSettings(5, 1, shared_size=8), "--departments 5 must divide the source's 16 experts"),
        (ConvertSettings(4, 2, shared_fraction=1.5), "--shared-fraction must be in [0, 1)"),
        (ConvertSettings(4, 2, shared_size=8, private_size=41), "private size 41 must be in [0, 40]"),
        (ConvertSettings(4, 5, shared_size=8), "top_departments must be <= num_departments"),
    ],
)
def test_impossible_settings_are_one_line_errors(settings, message):
    _, source = planted_source()
    with pytest.raises(UsageError, match=re.escape(message)):
        convert_layer(source, calibration(), settings)


def test_source_with_shared_parts_and_short_calibration_are_refused():
    planted, source = planted_source()
    with pytest.raises(UsageError, match="already has department shared parts"):
        convert_layer(planted, calibration(), ConvertSettings(4, 2, shared_size=8))
    with pytest.raises(UsageError, match="calibration is too short: 16 tokens, need at least 32"):
        convert_layer(source, calibration(16), ConvertSettings(4, 2, shared_size=8))
    with pytest.raises(UsageError, match="the source is quantized"):
        convert_layer(source.quantized(QuantConfig(bits=8, group_size=16)), calibration(), ConvertSettings(4, 2, 8))


def test_conversion_is_deterministic():
    _, source = planted_source()
    settings = dataclasses.replace(ConvertSettings(2, 1, shared_fraction=0.5))
    a = convert_layer(source, calibration(), settings).layer.state_dict()
    b = convert_layer(source, calibration(), settings).layer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
