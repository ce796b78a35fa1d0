"""`deamoe-trt bench`: runs end to end, writes every figure, counts bytes as deamoe_trt.traffic does.

No speed assertions: timings depend on the machine and its load.
"""

import json

import pytest
import torch

from deamoe_trt import PRESETS, DeaMoELayer, MissingDependencyError
from deamoe_trt.bench import loop as bench_loop
from deamoe_trt.bench import machine as bench_machine
from deamoe_trt.bench import step_seed
from deamoe_trt.bench.contenders import PRIORITY, MemoryPlan
from deamoe_trt.cli.main import main
from deamoe_trt.inputs import random_hidden
from deamoe_trt.routing import Routing, route_logits
from deamoe_trt.traffic import weights_loaded

try:
    from deamoe_trt import cpu

    cpu.load()
except MissingDependencyError as exc:
    pytest.skip(f"CPU kernel unavailable: {exc}", allow_module_level=True)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    json_path, png_path = out / "bench.json", out / "bench.png"
    code = main(["bench", "--quick", "--json", str(json_path), "--plot", str(png_path)])
    return code, json.loads(json_path.read_text()), png_path


@pytest.mark.slow
def test_quick_run_writes_json_and_png(quick_run):
    code, result, png = quick_run
    assert code == 0
    assert result["schema"] == "deamoe-trt-bench/1"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    for key in ("cpu_model", "cores", "threads", "load_average", "versions"):
        assert key in result["machine"]
    assert result["bandwidth"]["standalone_bytes_per_s"] > 0
    assert result["layer"]["roof"]["bytes_per_s"] > 0
    assert result["bandwidth"]["numpy"]["bytes_per_s"] > 0


@pytest.mark.slow  # the module\'s quick benchmark run
def test_every_contender_is_reported(quick_run):
    _, result, _ = quick_run
    layer = result["layer"]
    assert layer["status"] == "ok"
    by_name = {c["name"]: c for c in layer["contenders"]}
    assert set(by_name) == set(PRIORITY)
    ok = [n for n, c in by_name.items() if c["status"] == "ok"]
    # The CPU kernel, PyTorch and the vanilla ONNX Runtime anchor always run here; the
    # DeaMoE ort forms run when deamoe_trt.export is present, and say why not otherwise.
    assert {"deamoe/cpu", "expanded/cpu", "deamoe/torch", "expanded/torch", "vanilla/ort"} <= set(ok)
    for c in by_name.values():
        assert c["status"] == "ok" or c["reason"]
        if c["status"] == "ok":
            assert c["max_abs_diff"] < 1e-3, c
    tokens = result["settings"]["tokens"]
    rows = {(r["contender"], r["tokens"]) for r in layer["results"]}
    assert rows == {(n, t) for n in ok for t in tokens}
    for row in layer["results"]:
        assert len(row["times_s"]) == layer["steps"]
        assert row["p10_s"] <= row["median_s"] <= row["p90_s"]
        assert row["roof_s"] == pytest.approx(row["bytes_per_step_mean"] / layer["roof"]["bytes_per_s"])
        assert row["roof_fraction"] == pytest.approx(row["roof_s"] / row["median_s"])
        if row["contender"] == "deamoe/cpu":
            assert "speedup_vs_expanded" in row and "speedup_vs_vanilla_ort" in row


@pytest.mark.slow  # the module\'s quick benchmark run
def test_bytes_match_traffic_recomputed_from_the_seed(quick_run):
    _, result, _ = quick_run
    layer_section = result["layer"]
    config = PRESETS["tiny"]
    layer = DeaMoELayer.random(config, seed=result["settings"]["seed"])
    warmup, steps = layer_section["warmup"], layer_section["steps"]
    for tokens in result["settings"]["tokens"]:
        recorded = layer_section["traffic"][str(tokens)]
        for i in range(steps):
            x = random_hidden(
                tokens, config.hidden_size, seed=step_seed(result["settings"]["seed"], tokens, warmup + i)
            )
            routing = layer.route(x)
            assert recorded["deamoe"]["bytes"][i] == weights_loaded(config, routing, 4).total
            assert recorded["expanded"]["bytes"][i] == weights_loaded(config.expanded(), routing, 4).total
            vanilla = DeaMoELayer(config.vanilla(), device="meta")
            vanilla_routing = route_logits(x @ layer.router.weight.t(), None, vanilla.config)
            assert recorded["vanilla"]["bytes"][i] == weights_loaded(config.vanilla(), vanilla_routing, 4).total
            assert recorded["deamoe"]["expert_ids"][i] == routing.expert_ids.tolist()


@pytest.mark.slow  # the module\'s quick benchmark run
def test_bytes_match_traffic_of_the_recorded_routing(quick_run):
    _, result, _ = quick_run
    config = PRESETS["tiny"]
    for tokens, per in result["layer"]["traffic"].items():
        for kind, cfg in (("deamoe", config), ("expanded", config.expanded()), ("vanilla", config.vanilla())):
            for ids, nbytes in zip(per[kind]["expert_ids"], per[kind]["bytes"], strict=True):
                ids = torch.tensor(ids)
                routing = Routing(
                    ids, torch.ones(ids.shape), ids // cfg.experts_per_department, ids[:, :1], ids.float()
                )
                assert weights_loaded(cfg, routing, 4).total == nbytes
        # Mean bytes in the results rows are those steps' mean.
        for row in result["layer"]["results"]:
            if row["tokens"] == int(tokens):
                step_bytes = per[row["model"]]["bytes"]
                assert row["bytes_per_step_mean"] == pytest.approx(sum(step_bytes) / len(step_bytes))


@pytest.mark.slow  # the module\'s quick benchmark run
def test_stack_section(quick_run):
    _, result, _ = quick_run
    stack = result["stack"]
    assert stack["status"] == "ok" and stack["num_layers"] == 2 and stack["dtype"] == "fp16"
    names = {r["contender"] for r in stack["results"]}
    assert {"deamoe/cpu", "expanded/cpu"} <= names
    for t in result["settings"]["tokens"]:
        per = stack["traffic"][str(t)]
        # Each layer reads at least its router; DeaMoE never reads more than its twin.
        assert all(d <= e for d, e in zip(per["deamoe"]["bytes"], per["expanded"]["bytes"], strict=True))
        assert stack["deamoe_vs_expanded_max_abs_diff"][str(t)] < 5e-2


def test_memory_plan_skips_what_does_not_fit():
    """deepseek-v3-layer on a 24 GiB machine: fp32 cannot hold the kernel's copy next to the
    layer (a GPU-sized memory); fp16 fits the DeaMoE form on the kernel, never the 22.5 GB twin."""
    config = PRESETS["deepseek-v3-layer"]
    budget = int(24 * 2**30 * 0.8)
    plan = MemoryPlan.make(config, torch.float32, budget, list(PRIORITY))
    assert "deamoe/cpu" not in plan.kept
    half = MemoryPlan.make(config, torch.float16, budget, list(PRIORITY))
    assert "deamoe/cpu" in half.kept
    assert not any(name.startswith(("expanded", "vanilla")) for name in half.kept)
    assert all(half.skipped[n] for n in PRIORITY if n.startswith(("expanded", "vanilla")))
    assert half.expanded_bytes > 22e9 and 6e9 < half.deamoe_bytes < 6.6e9


def test_memory_plan_counts_an_onnx_runtime_session_at_twice_its_weights():
    """qwen3-30b-a3b-layer, fp32: 1.36 GB DeaMoE, 2.42 GB twin. Every contender together
    peaks at about 22.4 GB (measured: 22.7 GB); 20 GB keeps all but the last ORT twin."""
    config = PRESETS["qwen3-30b-a3b-layer"]
    everything = MemoryPlan.make(config, torch.float32, 10**12, list(PRIORITY))
    assert everything.peak == pytest.approx(22.38e9, rel=0.01)
    plan = MemoryPlan.make(config, torch.float32, int(20e9), list(PRIORITY))
    assert list(plan.skipped) == ["expanded/ort"]
    assert plan.peak <= 20e9


def test_gpu_sized_preset_is_skipped_not_crashed(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_machine, "available_memory", lambda: 24 * 2**30)
    monkeypatch.setattr(bench_loop, "random_layer", _no_allocation)
    out = tmp_path / "skip.json"
    code = main(["bench", "--quick", "--preset", "deepseek-v3-layer", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["layer"]["status"] == "skipped"
    assert "GPU-sized memory" in result["layer"]["reason"]
    assert result["stack"]["status"] == "skipped"
    assert "GPU-sized memory" in capsys.readouterr().out


def _no_allocation(*args, **kwargs):
    raise AssertionError("the benchmark allocated a layer it had no memory for")


def test_unknown_contender_is_a_usage_error(capsys):
    assert main(["bench", "--quick", "--only", "deamoe/gpu"]) == 2
    assert "unknown contender" in capsys.readouterr().err
