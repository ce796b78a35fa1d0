"""The alternatives to converting: each one's bytes per step against the converted model's,
counted here from the spec's formula, and each one's math against a direct computation."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from deamoe_trt import DeaMoELayer
from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.convert import baselines
from deamoe_trt.convert.core import ConvertSettings, convert_layer
from deamoe_trt.inputs import random_hidden

D, N, F_W, K = 32, 8, 24, 4
SOURCE = DeaMoEConfig(
    hidden_size=D,
    num_departments=1,
    experts_per_department=N,
    shared_intermediate_size=0,
    private_intermediate_size=F_W,
    top_k=K,
    top_departments=1,
)
FLOAT = 4  # bytes per float32 weight
SETTINGS = ConvertSettings(departments=2, top_departments=1, shared_size=12)


def source_layer(seed: int = 0, config: DeaMoEConfig = SOURCE) -> DeaMoELayer:
    return DeaMoELayer.random(config, seed=seed).eval()


def hidden(tokens: int, seed: int) -> torch.Tensor:
    return random_hidden(tokens, D, seed=seed)


def converted(source: DeaMoELayer, x: torch.Tensor, shared: int = 12):
    return convert_layer(source, x, ConvertSettings(departments=2, top_departments=1, shared_size=shared))


def router_bytes() -> int:
    return N * D * FLOAT


def spec_converted_bytes(shared: int, private: int, departments_used: float) -> float:
    """One token, one department, k experts: router + U_d f_s + k f_p neurons of 3 d weights."""
    return router_bytes() + departments_used * 3 * D * shared * FLOAT + K * 3 * D * private * FLOAT


def test_pruned_experts_match_the_converted_bytes_within_one_neuron_per_expert():
    source, x, held = source_layer(), hidden(2048, 1), hidden(256, 2)
    conversion = converted(source, x)
    target = spec_converted_bytes(12, 12, departments_used=1)  # top_departments 1: one shared part
    built = baselines.build([source], [x], [held], [conversion.layer], [conversion.order], SETTINGS)
    pruned = next(b for b in built if b.name == baselines.PRUNED)
    width = pruned.detail["expert_width"]
    pruned_bytes = router_bytes() + K * 3 * D * width * FLOAT
    neuron_step = K * 3 * D * FLOAT
    assert pruned_bytes <= target < pruned_bytes + neuron_step
    layer = pruned.layers[0]
    assert layer.config.private_intermediate_size == width
    # The same routing as the source: narrower experts, the same choices.
    assert torch.equal(layer.route(held).expert_ids, source.route(held).expert_ids)


def test_lowered_top_k_and_the_delta_rank_match_the_converted_bytes_within_one_step():
    source, x, held = source_layer(), hidden(2048, 1), hidden(256, 2)
    conversion = converted(source, x, shared=6)
    target = spec_converted_bytes(6, 18, departments_used=1)
    built = {
        b.name: b for b in baselines.build([source], [x], [held], [conversion.layer], [conversion.order], SETTINGS)
    }
    k = built[baselines.TOP_K].detail["top_k"]
    expert = 3 * D * F_W * FLOAT
    assert router_bytes() + k * expert <= target < router_bytes() + (k + 1) * expert
    for name in (baselines.DELTA, baselines.DELTA_ONE):
        rank = built[name].detail["rank"]
        # Every token's k experts in one department: one base, k deltas of 3 r (d + f) weights.
        delta = 3 * (D + F_W) * FLOAT
        spent = router_bytes() + 3 * D * F_W * FLOAT + K * rank * delta
        assert spent <= target < spent + K * delta, name


def test_delta_bytes_count_every_department_a_token_uses():
    source, x = source_layer(), hidden(2048, 1)
    config = SOURCE.replace(num_departments=4, experts_per_department=2, top_departments=2)
    layer = baselines.delta_layer(source, x, torch.arange(N), config, rank=3)
    routing = layer.route(hidden(64, 3))
    used = [len(set(routing.department_ids[t].tolist())) for t in range(routing.num_tokens)]
    per_token = [router_bytes() + u * 3 * D * F_W * FLOAT + K * 3 * 3 * (D + F_W) * FLOAT for u in used]
    assert layer.step_bytes(routing, FLOAT) == pytest.approx(sum(per_token) / len(per_token))
    assert min(used) >= 1 and max(used) == 2  # the test means something: some tokens use two


def test_lowered_top_k_is_the_renormalised_top_k_of_the_source():
    source, x = source_layer(), hidden(64, 4)
    layer = baselines.lowered_topk_layer(source, 2)
    logits = x @ source.router.weight.t()
    scores = torch.softmax(logits, dim=-1)
    weights, ids = scores.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    expected = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t], ids[t], strict=True):
            gate, up = (source.experts.gate_up[e] @ x[t]).chunk(2)
            expected[t] += w * (source.experts.down[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)


def direct_expert(source: DeaMoELayer, e: int, x: torch.Tensor) -> torch.Tensor:
    gate, up = (x @ source.experts.gate_up[e].t()).chunk(2, dim=-1)
    y = (F.silu(gate) * up) @ source.experts.down[e].t()
    if source.experts.down_bias is not None:
        y = y + source.experts.down_bias[e]
    return y


@pytest.mark.parametrize("whiten", [True, False])
def test_the_delta_at_full_rank_reproduces_every_expert(whiten):
    source, x = source_layer(), hidden(2048, 1)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    config = SOURCE.replace(num_departments=2, experts_per_department=4)
    layer = baselines.delta_layer(source, x, order, config, rank=min(D, F_W), whiten=whiten)
    probe = hidden(32, 5)
    with torch.no_grad():
        for i, e in enumerate(order.tolist()):
            torch.testing.assert_close(
                layer.expert_forward(i, probe), direct_expert(source, e, probe), rtol=1e-4, atol=1e-5
            )
        low = baselines.delta_layer(source, x, order, config, rank=2, whiten=whiten)
        assert not torch.allclose(
            low.expert_forward(0, probe), direct_expert(source, order[0].item(), probe), atol=1e-3
        )


def test_the_whitened_delta_beats_the_plain_one_on_its_calibration_inputs():
    source, x = source_layer(), hidden(2048, 1) * torch.linspace(0.1, 3.0, D)  # anisotropic inputs
    config = SOURCE.replace(num_departments=2, experts_per_department=4)
    errors = {}
    for whiten in (True, False):
        layer = baselines.delta_layer(source, x, torch.arange(N), config, rank=4, whiten=whiten)
        with torch.no_grad():
            errors[whiten] = sum(
                float((layer.expert_forward(e, x) - direct_expert(source, e, x)).norm()) for e in range(N)
            )
    assert errors[True] < errors[False]


def test_one_base_with_the_source_routing_keeps_every_expert_choice():
    source, x, held = source_layer(), hidden(2048, 1), hidden(128, 2)
    layer = baselines.delta_layer(source, x, torch.arange(N), SOURCE, rank=3)
    assert torch.equal(layer.route(held).expert_ids, source.route(held).expert_ids)


def test_biased_experts_keep_their_biases_in_the_delta():
    config = SOURCE.replace(ffn_bias=True)
    source, x = source_layer(config=config), hidden(2048, 1)
    with torch.no_grad():
        source.experts.gate_up_bias.normal_()
        source.experts.down_bias.normal_()
    layer = baselines.delta_layer(source, x, torch.arange(N), config, rank=min(D, F_W))
    probe = hidden(16, 5)
    with torch.no_grad():
        for e in range(N):
            gate_up = source.experts.gate_up[e]
            gate, up = (probe @ gate_up.t() + source.experts.gate_up_bias[e]).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ source.experts.down[e].t() + source.experts.down_bias[e]
            torch.testing.assert_close(layer.expert_forward(e, probe), y, rtol=1e-4, atol=1e-4)


def test_pruned_then_converted_is_the_pruned_width_converted_at_the_spec_bytes():
    source, x, held = source_layer(), hidden(2048, 1), hidden(256, 2)
    conversion = converted(source, x)  # f_s = f_p = 12 of 24
    built = {
        b.name: b for b in baselines.build([source], [x], [held], [conversion.layer], [conversion.order], SETTINGS)
    }
    width = built[baselines.PRUNED].detail["expert_width"]
    composed = built[baselines.PRUNED_CONVERTED]
    assert composed.detail["pruned_width"] == width and width < F_W
    layer = composed.layers[0]
    shared = round(12 * width / F_W)
    private = width - shared
    assert (layer.config.shared_intermediate_size, layer.config.private_intermediate_size) == (shared, private)
    # The converted model's departments and choices; bytes from the spec's formula (one shared part).
    routing = layer.route(held)
    assert torch.equal(routing.expert_ids, conversion.layer.route(held).expert_ids)
    assert baselines.layer_step_bytes(layer, routing) == pytest.approx(spec_converted_bytes(shared, private, 1))
    assert torch.equal(composed.orders[0], conversion.order)


def test_pruned_then_converted_without_a_shared_part_is_the_pruned_layer():
    source, x, held = source_layer(), hidden(2048, 1), hidden(256, 2)
    settings = ConvertSettings(departments=1, top_departments=1, shared_size=0)
    pruned = baselines.pruned_layer(source, x, 16)
    layer = baselines.pruned_converted_layer(pruned, x, torch.arange(N), settings, F_W)
    assert layer.config.private_intermediate_size == 16
    torch.testing.assert_close(layer(held), pruned(held), rtol=1e-4, atol=1e-5)


def test_the_composition_shows_its_pruned_width_and_sizes_in_the_table():
    from deamoe_trt.convert.report import report_table

    row = {
        "method": baselines.PRUNED_CONVERTED,
        "shared_fraction": 0.5,
        "f_s": 10,
        "f_p": 10,
        "pruned_width": 20,
        "bytes_per_step": 40,
        "bytes_vs_source": 0.4,
        "relative_error": [0.2],
        "expert_agreement": [0.5],
    }
    source = {**row, "method": "source", "bytes_per_step": 100, "bytes_vs_source": 1.0, "relative_error": [0.0]}
    del source["pruned_width"]
    report = {"rows": [source, row], "source": {"layers": 1, "num_experts": 8, "expert_width": 24, "top_k": 4}}
    report["source"]["heldout_tokens"] = 256
    line = next(s for s in report_table(report).splitlines() if s.lstrip().startswith(baselines.PRUNED_CONVERTED))
    assert "f=20: 10/10" in line and "40.0%" in line
