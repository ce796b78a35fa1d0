"""DeaMoE against its matched vanilla MoE: sizes matched (counted from the configs and the
built models, apart from the package's own counts), upcycling, the report's columns, the
`train` command, and two gloo processes training as one process does."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn import functional as F

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.lm.tokenizer import ByteTokenizer
from deamoe_trt.train.compare import PRESETS, compare, get_preset, matched_vanilla, report_table, upcycle
from deamoe_trt.train.lm import shipped_text, split_text, train

MICRO = get_preset("micro")
FLOAT32 = 4


def expert_weights(model: DeaMoELM) -> int:
    return sum(t.numel() for n, t in model.state_dict().items() if ".mlp.departments." in n or ".mlp.experts." in n)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_vanilla_moe_has_the_deamoe_expert_parameters_and_flops_per_token(name):
    preset = PRESETS[name]
    deamoe, vanilla = preset.config, preset.vanilla()
    a, b = DeaMoELM(deamoe), DeaMoELM(vanilla)
    assert expert_weights(a) == expert_weights(b) > 0
    d, layers = deamoe.hidden_size, deamoe.num_layers
    ma, mb = deamoe.moe, vanilla.moe
    assert mb.num_departments == 1 and mb.shared_intermediate_size == 0 and mb.top_departments == 1
    # Everything but the routers is the same size; the routers differ by their rows.
    routers = layers * d * (ma.num_departments * ma.experts_per_department - mb.experts_per_department)
    total = sum(p.numel() for p in a.parameters()) - sum(p.numel() for p in b.parameters())
    assert total == routers
    # FLOPs per token of one block's experts: 2 per weight of each SwiGLU part computed.
    flops_a = 2 * 3 * d * (ma.top_departments * ma.shared_intermediate_size + ma.top_k * ma.private_intermediate_size)
    flops_b = 2 * 3 * d * mb.top_k * mb.private_intermediate_size
    assert flops_a == flops_b
    # ... at most: a token's experts lie in at most g departments (exactly g when g = 1).
    x = torch.randn(64, d)
    routing = a.layers[0].mlp.route(x)
    departments = [len(set(row)) for row in routing.department_ids.tolist()]
    assert max(departments) <= ma.top_departments and (ma.top_departments > 1 or set(departments) == {1})
    assert ma.top_k < ma.top_departments * ma.experts_per_department  # the experts are chosen, not all taken
    assert [len(set(row)) for row in b.layers[0].mlp.route(x).expert_ids.tolist()] == [mb.top_k] * 64


def test_a_width_that_matches_no_vanilla_moe_is_refused_in_one_line():
    with pytest.raises(UsageError, match="no vanilla MoE of experts 7 wide") as error:
        matched_vanilla(MICRO.config.moe, 7)
    assert "\n" not in str(error.value)
    with pytest.raises(UsageError, match="unknown comparison preset 'huge'"):
        get_preset("huge")


def test_an_upcycled_model_computes_the_dense_models_function_before_training():
    dense = DeaMoELM.random(MICRO.dense(), seed=5).eval()
    ids = torch.randint(0, 256, (2, 12))
    expected = dense(ids).logits
    for config in (MICRO.config, MICRO.vanilla()):
        model = upcycle(dense, config, seed=1).eval()
        assert model.config == config
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(UsageError, match="upcycling needs a dense model"):
        upcycle(DeaMoELM.random(MICRO.config), MICRO.vanilla())


def test_the_report_holds_perplexity_and_bytes_per_step_at_1_4_and_8_tokens():
    report, models = compare(MICRO, upcycled=True, progress=False)
    rows = {r["model"]: r for r in report["rows"]}
    assert list(rows) == ["deamoe", "vanilla", "dense", "deamoe-upcycled", "vanilla-upcycled"]
    assert rows["deamoe-upcycled"]["steps"] == {"dense": 2, "moe": 4} and rows["deamoe"]["steps"] == {"moe": 6}
    c = MICRO.config
    d, layers, moe, van = c.hidden_size, c.num_layers, c.moe, MICRO.vanilla().moe
    # One token reads its router, one department's shared part and k private parts (DeaMoE),
    # or its router and k_v experts (vanilla): the spec's count, whatever the routing.
    one_deamoe = (
        layers
        * FLOAT32
        * d
        * (moe.num_experts + 3 * (moe.shared_intermediate_size + moe.top_k * moe.private_intermediate_size))
    )
    one_vanilla = layers * FLOAT32 * d * (van.num_experts + 3 * van.top_k * van.private_intermediate_size)
    for name in ("deamoe", "deamoe-upcycled"):
        assert rows[name]["bytes_per_step_at"]["1"] == pytest.approx(one_deamoe)
    for name in ("vanilla", "vanilla-upcycled"):
        assert rows[name]["bytes_per_step_at"]["1"] == pytest.approx(one_vanilla)
    _, heldout = split_text(shipped_text(MICRO.corpus), ByteTokenizer(), MICRO.settings.val_fraction)
    L = MICRO.settings.seq_len
    chunk = torch.stack([heldout[i * L : i * L + L + 1] for i in range(MICRO.heldout_windows)])
    for name, row in rows.items():
        at = row["bytes_per_step_at"]
        assert set(at) == {"1", "4", "8"} and at["1"] <= at["4"] <= at["8"] <= 8 * at["1"]
        with torch.no_grad():
            logits = models[name].eval()(chunk[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten()).item()
        assert row["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
        assert row["perplexity"] < 256  # trained: better than a uniform guess over bytes
    only, _ = compare(MICRO, upcycled=True, scratch=False, progress=False)
    assert [r["model"] for r in only["rows"]] == ["dense", "deamoe-upcycled", "vanilla-upcycled"]
    assert only["rows"][1]["perplexity"] == rows["deamoe-upcycled"]["perplexity"]  # the same run, deterministic
    with pytest.raises(UsageError, match="nothing to train"):
        compare(MICRO, scratch=False)
    table = report_table(report)
    assert "bytes/step at 4" in table and "bytes/step at 8" in table
    ratio = rows["deamoe"]["bytes_per_step_at"]["8"] / rows["vanilla"]["bytes_per_step_at"]["8"]
    assert f"({ratio:.1%})" in table.splitlines()[3]
    assert report_table(report, markdown=True).count("\n") == len(rows) + 1


def test_train_writes_both_models_and_the_report_and_refuses_a_foreign_directory(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["train", "--preset", "micro", "--steps", "3", "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [r["model"] for r in report["rows"]] == ["deamoe", "vanilla"] and report["settings"]["processes"] == 1
    assert DeaMoELM.from_pretrained(out / "vanilla").config.moe == MICRO.vanilla().moe
    assert "bytes/step at 8" in capsys.readouterr().out
    # Its own output is replaced; --text picks another shipped text.
    assert main(["train", "--preset", "micro", "--steps", "3", "--text", "cpython", "-o", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["corpus"] == "cpython"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["train", "--preset", "micro", "--steps", "3", "-o", str(foreign)]) == 2
    assert "refusing to replace" in capsys.readouterr().err and (foreign / "notes.txt").exists()


SETTINGS = dataclasses.replace(MICRO.settings, steps=4, batch_size=4)


def _trained_once() -> tuple[dict[str, torch.Tensor], list[float]]:
    result = train(MICRO.config, SETTINGS, text=shipped_text()[:20000], progress=False)
    return {k: v.clone() for k, v in result.model.state_dict().items()}, result.losses


def _worker(rank: int, size: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist
    from safetensors.torch import save_file

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        state, losses = _trained_once()
        if rank == 0:
            state["losses"] = torch.tensor(losses)
            save_file({k: v.contiguous() for k, v in state.items()}, out)
        dist.barrier()  # both ranks leave together (see tests/convert/test_distill.py)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_train_as_one_process_does(tmp_path):
    from safetensors.torch import load_file

    out = str(tmp_path / "two.safetensors")
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous"), out), nprocs=2, join=True)
    two = load_file(out)
    one, losses = _trained_once()
    torch.testing.assert_close(two.pop("losses"), torch.tensor(losses), rtol=1e-5, atol=1e-5)
    start = DeaMoELM.random(MICRO.config, seed=SETTINGS.seed).state_dict()
    assert set(two) == set(one)
    moved = 0.0
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, rtol=1e-4, atol=1e-5)
        moved = max(moved, float((tensor - start[name]).abs().max()))
    assert moved > 1e-3  # training changed the weights, so the comparison means something
