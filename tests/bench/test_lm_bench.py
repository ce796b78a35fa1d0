"""bench-lm: the whole-model TPOT benchmark runs its contenders interleaved and counts bytes
per token from the routing each contender ran (checked against deamoe_trt.traffic's formula
for the twins' known relation: same routing, so the expanded twin reads f_s+f_p per expert)."""

from __future__ import annotations

import statistics

import pytest
import torch

from deamoe_trt.bench.lm_bench import bench_config, lm_bench_table, run_lm_bench, write_plot
from deamoe_trt.cli.main import main


def test_bench_config_keeps_qwen3_30b_a3b_ffn_shapes():
    c = bench_config()
    assert (c.hidden_size, c.num_heads, c.num_key_value_heads, c.head_dim) == (2048, 32, 4, 128)
    moe = c.moe
    assert (moe.expert_intermediate_size, moe.top_k, moe.top_departments) == (768, 8, 2)
    assert moe.shared_intermediate_size == moe.private_intermediate_size == 384


@pytest.fixture(scope="module")
def cpu_run():
    """One block on the CPU kernel, 3 steps: each twin at Qwen3-30B-A3B's expert shapes takes
    seconds to build, so the tests that read this run share it."""
    return run_lm_bench(layers=1, departments=2, steps=3, prompt=4, threads=1, runtimes=("cpu",), progress=None)


@pytest.mark.slow
def test_one_block_bench_on_the_cpu_kernel(cpu_run, tmp_path):
    result = cpu_run
    rows = {r["twin"]: r for r in result["rows"]}
    assert set(rows) == {"deamoe", "expanded", "vanilla"}
    # One burst of 3 steps each: the first, after another contender's, is kept apart.
    assert all(len(r["step_ms"]) == 2 and len(r["switch_ms"]) == 1 for r in rows.values())
    assert all(
        r["tpot_ms"] == pytest.approx(sorted(r["step_ms"])[0] / 2 + sorted(r["step_ms"])[1] / 2) for r in rows.values()
    )
    # Same routing, so the expanded twin reads the shared part once per expert, not per department.
    assert rows["expanded"]["bytes_per_token"] > rows["deamoe"]["bytes_per_token"]
    assert "vs expanded" in lm_bench_table(result)
    assert write_plot(result, tmp_path / "p.png").stat().st_size > 1000


def test_bench_lm_rejects_unknown_runtimes(capsys):
    assert main(["bench-lm", "--runtimes", "cpu,trt"]) == 2
    assert "--runtimes takes a comma-separated list of cpu, cpu-native, ort" in capsys.readouterr().err


@pytest.mark.slow
def test_quantized_bench_counts_packed_codes_and_scales():
    from deamoe_trt.quant import QuantConfig

    small = {"layers": 1, "departments": 2, "steps": 2, "prompt": 4, "threads": 1}
    result = run_lm_bench(**small, runtimes=("cpu",), progress=None, quant=QuantConfig(4, 64))
    rows = {r["twin"]: r for r in result["rows"]}
    # One token per step reads g = 2 departments' shared parts and k = 8 experts' private
    # parts (3 * d * 384 weights each) at 4 bits plus one fp16 scale per 64, and the fp16 router.
    d, per_weight, router = 2048, 4 / 8 + 2 / 64, 16 * 2048 * 2
    assert rows["deamoe"]["ffn_bytes_per_token"] == (2 + 8) * 3 * d * 384 * per_weight + router
    assert rows["expanded"]["ffn_bytes_per_token"] == 8 * 3 * d * 768 * per_weight + router
    assert "FFNs int4 group 64" in lm_bench_table(result)


def test_mla_bench_config_has_deepseek_v2_lite_attention_and_counts_its_weights():
    from deamoe_trt.bench.lm_bench import _other_bytes

    gqa, mla = bench_config(layers=1), bench_config(layers=1, attention="mla")
    assert mla.is_mla and mla.moe == gqa.moe and mla.kv_cache_values_per_token() == 512 + 64
    d, v = 2048, gqa.vocab_size
    # q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj, two block norms (V2-Lite's config.json shapes)
    attention = d * 16 * 192 + d * 576 + 512 + 512 * 16 * 256 + 16 * 128 * d + 2 * d
    assert _other_bytes(mla, 2) == (attention + d + v * d + d) * 2
    # Qwen3-30B-A3B's: q/k/v/o, q/k norms, two block norms
    assert _other_bytes(gqa, 2) == ((32 * 128 * 2 + 4 * 128 * 2) * d + 2 * 128 + 2 * d + d + v * d + d) * 2


@pytest.mark.slow
def test_the_native_step_joins_as_a_contender_with_its_own_fp16_bytes(cpu_run):
    # Two runs, so that the native rows count their FFN bytes themselves (by replaying their tokens).
    native_run = run_lm_bench(
        layers=1, departments=2, steps=2, prompt=4, threads=1, runtimes=("cpu-native",), progress=None
    )
    rows = {(r["runtime"], r["twin"]): r for r in native_run["rows"] + cpu_run["rows"]}
    assert {runtime for runtime, _ in rows} == {"cpu", "cpu-native"}
    for twin in ("deamoe", "expanded", "vanilla"):
        cpu, native = rows["cpu", twin], rows["cpu-native", twin]
        # A one-token step loads the same FFN bytes whichever experts it picks; outside the
        # FFNs the native step reads fp16 where the PyTorch path reads float32 copies.
        assert native["ffn_bytes_per_token"] == cpu["ffn_bytes_per_token"] > 0
        assert native["bytes_per_token"] < cpu["bytes_per_token"]
        assert native["of_roof"] > 0
    # The roof: read before, after and once per burst (2 steps: one burst); rows use the median.
    roofs = native_run["roof_bytes_per_s"]
    assert len(roofs) == 3
    native = rows["cpu-native", "deamoe"]
    assert native["roof_ms"] == pytest.approx(native["bytes_per_token"] / statistics.median(roofs) * 1e3)
    assert "CPU kernel, native step" in lm_bench_table(native_run)
    assert "median of 3 measurements" in lm_bench_table(native_run)


def test_the_native_step_refuses_mla_before_building_anything():
    from deamoe_trt.errors import UsageError

    with pytest.raises(UsageError, match="multi-head latent attention"):
        run_lm_bench(layers=1, departments=2, steps=1, runtimes=("cpu-native",), attention="mla", progress=None)


def test_quantized_projections_count_their_codes_and_fp16_scales():
    from deamoe_trt.bench.lm_bench import _other_bytes
    from deamoe_trt.quant import QuantConfig

    config = bench_config(layers=1).replace(quantization=QuantConfig(4, 64), quantized_linears=("attention", "head"))
    d, v = 2048, config.vocab_size
    per_weight = 4 / 8 + 2 / 64  # a code, and an fp16 scale per 64
    projections = (32 * 128 * 2 + 4 * 128 * 2) * d
    norms = 2 * 128 + 2 * d
    assert _other_bytes(config, 2) == projections * per_weight + norms * 2 + 2 * d * 2 + v * d * per_weight


def test_quantized_projections_need_quantized_ffns(capsys):
    assert main(["bench-lm", "--linears", "attention", "--runtimes", "cpu"]) == 2
    assert "--linears needs --quantized" in capsys.readouterr().err


@pytest.mark.slow
def test_quantized_projections_run_on_onnx_runtime_and_count_as_packed(capsys):
    from deamoe_trt.bench.lm_bench import _other_bytes
    from deamoe_trt.quant import QuantConfig

    small = {"layers": 1, "departments": 2, "steps": 2, "prompt": 4, "threads": 1}
    quant, linears = QuantConfig(4, 64), ("attention", "head")
    result = run_lm_bench(**small, runtimes=("cpu", "ort"), progress=None, quant=quant, linears=linears)
    rows = {(r["twin"], r["runtime"]): r for r in result["rows"]}
    config = bench_config(layers=1, departments=2).replace(quantization=quant, quantized_linears=linears)
    ffn = rows["deamoe", "cpu"]["ffn_bytes_per_token"]
    assert rows["deamoe", "ort"]["bytes_per_token"] == ffn + _other_bytes(config, 2)
    assert all(rows[t, "ort"]["tpot_ms"] > 0 for t in ("deamoe", "expanded", "vanilla"))


@pytest.mark.slow
def test_batched_bench_times_each_count_of_sequences_and_counts_the_union_it_reads():
    from deamoe_trt.bench.lm_bench import _other_bytes, lm_batch_table, run_lm_batch_bench

    small = {"layers": 1, "departments": 2, "steps": 2, "prompt": 4, "threads": 1}
    result = run_lm_batch_bench(**small, sequences=(1, 3), progress=None)
    rows = {(r["twin"], r["sequences"]): r for r in result["rows"]}
    assert set(rows) == {(t, n) for t in ("deamoe", "expanded", "vanilla") for n in (1, 3)}
    config = bench_config(layers=1, departments=2)
    d, b, router = 2048, 2, 16 * 2048 * 2
    for (twin, n), r in rows.items():
        assert r["tokens_per_s"] == pytest.approx(n / r["tpot_ms"] * 1e3)
        assert r["vs_one"] == pytest.approx(r["tokens_per_s"] / rows[twin, 1]["tokens_per_s"])
        other = _other_bytes(config, b) + (n - 1) * d * b
        experts = r["experts_read"] * 16
        if twin == "deamoe":
            # Both departments' shared parts (every token picks both), the union of private parts.
            assert r["bytes_per_step"] == pytest.approx((2 * 384 + experts * 384) * 3 * d * b + router + other)
        else:
            assert r["bytes_per_step"] == pytest.approx(experts * 768 * 3 * d * b + router + other)
    # One token reads top-k = 8 experts; three read at least those 8 and at most 24.
    assert rows["deamoe", 1]["experts_read"] == 8 / 16
    assert 8 / 16 <= rows["vanilla", 3]["experts_read"] <= 1
    assert rows["deamoe", 3]["bytes_per_step"] > rows["deamoe", 1]["bytes_per_step"]
    table = lm_batch_table(result)
    assert "vs 1 seq" in table and "Batched decoding" in table


def test_bench_lm_sequences_refuses_other_runtimes_and_bad_counts(capsys):
    assert main(["bench-lm", "--sequences", "1,4", "--runtimes", "ort"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["bench-lm", "--sequences", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--sequences times the native step's batch decoder" in err and "sequence counts" in err


# One block of 2 departments x 2 experts, top-3 (so both departments every token): a step's
# FFN bytes depend on the routing only through the union of experts it reads.
TINY_BATCH_LM = dict(
    vocab_size=256,
    hidden_size=32,
    num_layers=1,
    num_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16,
)
TINY_BATCH_MOE = dict(
    hidden_size=32,
    num_departments=2,
    experts_per_department=2,
    shared_intermediate_size=16,
    private_intermediate_size=16,
    top_k=3,
    top_departments=2,
)


@pytest.mark.slow
def test_batched_bench_runs_the_cuda_decoder_emulated_with_the_bytes_traffic_counts(monkeypatch, emulated_lib):
    from deamoe_trt import runtimes
    from deamoe_trt.bench.lm_bench import _other_bytes, lm_batch_table, run_lm_batch_bench
    from deamoe_trt.config import DeaMoEConfig
    from deamoe_trt.lm.config import LMConfig
    from deamoe_trt.routing import route_logits
    from deamoe_trt.traffic import weights_loaded

    emulated = runtimes.get("cuda-emulated")
    monkeypatch.setattr(emulated, "library", emulated_lib._name)
    monkeypatch.setattr(emulated, "_lib", None)
    moe = DeaMoEConfig(**TINY_BATCH_MOE)
    config = LMConfig(**TINY_BATCH_LM, moe=moe)
    result = run_lm_batch_bench(
        sequences=(1, 2), steps=1, prompt=3, threads=1, runtime="cuda-emulated", model_config=config, progress=None
    )
    rows = {(r["twin"], r["sequences"]): r for r in result["rows"]}
    assert set(rows) == {(t, n) for t in ("deamoe", "expanded", "vanilla") for n in (1, 2)}
    assert all(r["runtime"] == "cuda-emulated" and r["tpot_ms"] > 0 for r in rows.values())
    assert result["roof_bytes_per_s"] == [] and all(r.get("of_roof") is None for r in rows.values())
    twins = {"deamoe": moe, "expanded": moe.expanded(), "vanilla": moe.vanilla()}
    d, b = 32, 2
    for (twin, n), r in rows.items():
        other = _other_bytes(config, b) + (n - 1) * d * b
        # Any one token's routing reads the same bytes: top-3 experts, so both departments.
        one = weights_loaded(twins[twin], route_logits(torch.randn(1, moe.num_experts), None, twins[twin]), b)
        per_expert = one.expert_bytes // one.experts_used
        used = r["experts_read"] * twins[twin].num_experts
        assert r["bytes_per_step"] == pytest.approx(one.total - one.expert_bytes + used * per_expert + other)
        if n == 1:
            assert r["bytes_per_step"] == pytest.approx(one.total + other)
        assert one.experts_used <= used <= min(n * one.experts_used, twins[twin].num_experts)
    table = lm_batch_table(result)
    assert "CUDA decoder, SIMT-emulated" in table and "roof: not measured" in table


def test_bench_lm_sequences_on_cuda_without_a_gpu_exits_2_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["bench-lm", "--sequences", "1,4,16", "--runtimes", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--runtimes cuda needs a CUDA GPU" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--lm", "--preset", "tiny"], "--preset does not apply to bench of a language model"),
        (["bench-lm", "--quick"], "--quick does not apply to bench of a language model"),
        (["bench", "--departments", "2"], "--departments does not apply to bench of a layer"),
        (["bench", "--quick", "--sequences", "1,4"], "--sequences does not apply to bench of a layer"),
        (["bench", "--lm", "--layers", "auto"], "--layers is a count of decoder blocks >= 1 with --lm"),
    ],
)
def test_bench_refuses_a_flag_of_the_other_form_in_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_bench_lm_is_an_alias_of_bench_with_lm(capsys):
    assert main(["bench", "--lm", "--runtimes", "cpu,trt"]) == 2
    assert "--runtimes takes a comma-separated list of cpu, cpu-native, ort" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "alias of bench --lm, kept for one release" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_bench_lm_flags_reach_the_benchmark(tmp_path):
    import json

    out = tmp_path / "r.json"
    argv = ["--layers", "1", "--departments", "2", "--steps", "3", "--threads", "1", "--runtimes", "cpu"]
    assert main(["bench", "--lm", *argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["config"]["num_layers"], result["threads"], result["steps"]) == (1, 1, 3)
    assert result["config"]["moe"]["num_departments"] == 2
    assert {r["runtime"] for r in result["rows"]} == {"cpu"}
