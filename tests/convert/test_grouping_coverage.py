"""Departments that keep each token's routing weight together (grouping.coverage_groups) and
the report's share of the source's routing weight a method keeps (core.weight_kept)."""

from __future__ import annotations

import itertools
import json

import torch

from deamoe_trt import DeaMoELayer, DeaMoEStack, get_preset
from deamoe_trt.convert import baselines, grouping
from deamoe_trt.convert.core import ConvertSettings, convert_layer, plan_order, weight_kept
from deamoe_trt.convert.report import report_table
from deamoe_trt.convert.run import convert_model
from deamoe_trt.convert.sources import stack_source
from deamoe_trt.inputs import random_hidden
from deamoe_trt.routing import Routing

TINY = get_preset("tiny")  # d=64, D=4 x m=4, k=4, g=2


def routing_of(expert_ids: list[list[int]], weights: list[list[float]]) -> Routing:
    ids = torch.tensor(expert_ids)
    return Routing(
        expert_ids=ids,
        weights=torch.tensor(weights),
        department_ids=torch.zeros_like(ids),
        kept_departments=torch.zeros(len(ids), 1, dtype=torch.long),
        scores=torch.zeros(len(ids), 8),
    )


def brute_kept_mass(expert_ids, weights, groups, top_departments) -> float:
    shares = []
    for ids, w in zip(expert_ids, weights, strict=True):
        per_group = [sum(wi for e, wi in zip(ids, w, strict=True) if e in g) for g in groups]
        shares.append(sum(sorted(per_group, reverse=True)[:top_departments]) / sum(w))
    return sum(shares) / len(shares)


def planted_routing(seed: int = 0) -> tuple[Routing, list[list[int]]]:
    """Tokens each picking 2 of 8 experts, always inside one of two hidden groups."""
    planted = [[0, 3, 5, 6], [1, 2, 4, 7]]
    gen = torch.Generator().manual_seed(seed)
    ids, weights = [], []
    for _ in range(64):
        group = planted[int(torch.randint(2, (1,), generator=gen))]
        pair = torch.randperm(4, generator=gen)[:2].tolist()
        ids.append([group[i] for i in pair])
        w = float(torch.rand(1, generator=gen)) * 0.5 + 0.5
        weights.append([w, 1 - w])
    return routing_of(ids, weights), planted


def test_kept_mass_is_the_weight_inside_each_tokens_heaviest_groups():
    ids = [[0, 1, 2], [3, 4, 5], [0, 5, 7]]
    weights = [[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]
    r = routing_of(ids, weights)
    for groups in ([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4, 5, 7], [1, 2, 3, 6]], [[0, 1], [2, 3], [4, 5], [6, 7]]):
        for g in (1, 2):
            expected = brute_kept_mass(ids, weights, groups, g)
            assert abs(grouping.kept_mass(r, groups, g) - expected) < 1e-6


def test_coverage_recovers_planted_groups_from_the_source_order():
    r, planted = planted_routing()
    start = grouping.keep_groups(8, 2)
    assert grouping.kept_mass(r, start, 1) < 0.9
    found = grouping.coverage_groups(r, start, 1)
    assert found == planted
    assert abs(grouping.kept_mass(r, found, 1) - 1.0) < 1e-6


def test_coverage_never_lowers_kept_mass_and_ends_where_no_swap_raises_it():
    layer = DeaMoELayer.random(TINY, seed=3).vanilla()
    x = random_hidden(1024, TINY.hidden_size, seed=5)
    routing = layer.route(x)
    start = plan_order(layer, x, ConvertSettings(4, 1, shared_size=16)).view(4, 4).tolist()
    found = grouping.coverage_groups(routing, start, 1)
    assert sorted(e for g in found for e in g) == list(range(16))
    assert all(len(g) == 4 for g in found)
    best = grouping.kept_mass(routing, found, 1)
    assert best >= grouping.kept_mass(routing, start, 1)
    for (a, b), i, j in itertools.product(itertools.combinations(range(4), 2), range(4), range(4)):
        swapped = [list(g) for g in found]
        swapped[a][i], swapped[b][j] = swapped[b][j], swapped[a][i]
        assert grouping.kept_mass(routing, swapped, 1) <= best + 1e-9


def test_weight_kept_counts_the_source_weight_on_experts_both_routings_pick():
    source = routing_of([[0, 1], [2, 3]], [[0.75, 0.25], [0.5, 0.5]])
    converted = routing_of([[1, 0], [0, 3]], [[0.5, 0.5], [0.5, 0.5]])  # converted ids 0..3
    order = torch.tensor([2, 1, 0, 3])  # converted expert i is source expert order[i]
    # token 0: converted {1, 0} = source {1, 2}, keeps 0.25; token 1: source {2, 3}, keeps 1.0
    assert abs(weight_kept(source, converted, order) - (0.25 + 1.0) / 2) < 1e-6


def test_coverage_grouping_keeps_more_source_weight_than_cluster_on_held_out_tokens():
    source = DeaMoELayer.random(TINY, seed=3).vanilla()
    x, held = random_hidden(2048, TINY.hidden_size, seed=5), random_hidden(1024, TINY.hidden_size, seed=6)
    kept = {}
    for name in ("cluster", "coverage"):
        c = convert_layer(source, x, ConvertSettings(4, 1, shared_size=16, grouping=name, department_score="sum"))
        kept[name] = weight_kept(source.route(held), c.layer.route(held), c.order)
    assert kept["coverage"] > kept["cluster"]


def test_report_table_shows_weight_kept_only_when_every_row_has_it():
    def row(method, kept=None):
        r = {
            "method": method,
            "shared_fraction": 0.5,
            "f_s": 1,
            "f_p": 1,
            "bytes_per_step": 10,
            "bytes_vs_source": 0.5,
            "relative_error": [0.1],
            "expert_agreement": [0.5],
        }
        return r if kept is None else {**r, "weight_kept": [kept, kept / 2]}

    source = {"layers": 2, "num_experts": 4, "expert_width": 8, "top_k": 2, "heldout_tokens": 10}
    table = report_table({"rows": [row("source", 1.0), row("converted", 0.8)], "source": source})
    assert "weight kept" in table
    converted = next(line for line in table.splitlines() if line.lstrip().startswith("converted"))
    assert "60.0%" in converted  # the mean over layers of 0.8 and 0.4
    older = report_table({"rows": [row("source"), row("converted", 0.8)], "source": source})
    assert "weight kept" not in older


@torch.no_grad()
def test_weight_kept_of_lower_top_k_is_the_share_of_the_source_weight_on_its_best_experts():
    source = DeaMoELayer.random(TINY, seed=3).vanilla()
    x = random_hidden(256, TINY.hidden_size, seed=7)
    weights = source.route(x).weights  # best first
    expected = float((weights[:, :2].sum(1) / weights.sum(1)).mean())
    lowered = baselines.lowered_topk_layer(source, 2)
    assert abs(weight_kept(source.route(x), lowered.route(x), torch.arange(16)) - expected) < 1e-6


def test_report_rows_carry_the_weight_kept_per_layer():
    stack = DeaMoEStack.from_layers([DeaMoELayer.random(TINY, seed=s).vanilla() for s in (3, 4)])
    source = stack_source(stack, seed=0, tokens=1024)
    settings = ConvertSettings(1, 1, shared_size=0)  # the identity: keeps every choice
    _, report = convert_model(source, settings, compare=False, progress=False)
    assert all(r["weight_kept"] == [1.0, 1.0] for r in report["rows"])
    _, report = convert_model(source, ConvertSettings(4, 1, shared_size=16), compare=False, progress=False)
    converted = next(r for r in report["rows"] if r["method"] == "converted")
    assert len(converted["weight_kept"]) == 2 and all(0.25 <= w < 1.0 for w in converted["weight_kept"])


def test_cli_grouping_coverage_reaches_the_conversion(tmp_path):
    from deamoe_trt.cli.main import main as cli

    src = DeaMoEStack.from_layers([DeaMoELayer.random(TINY, seed=3).vanilla()]).save_pretrained(tmp_path / "src")
    orders = {}
    for how in ("cluster", "coverage"):
        out = tmp_path / how
        argv = ["convert", str(src), "-o", str(out), "--departments", "4", "--shared-size", "16"]
        argv += ["--top-departments", "1", "--grouping", how, "--no-compare", "--calibration-tokens", "1024"]
        assert cli(argv) == 0
        orders[how] = json.loads((out / "config.json").read_text())["source"]["expert_order"][0]
    source = DeaMoEStack.from_pretrained(src).layers[0]
    x = stack_source(DeaMoEStack.from_pretrained(src), seed=0, tokens=1024).calibration[0]
    routing = source.route(x)
    kept = {how: grouping.kept_mass(routing, torch.tensor(o).view(4, 4).tolist(), 1) for how, o in orders.items()}
    assert kept["coverage"] > kept["cluster"]
