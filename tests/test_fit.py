"""Whole-model sizes from config numbers against the models' published parameter counts."""

import pytest

from deamoe_trt.fit import DEVICES, GIB, KV_TOKENS, RESERVE_BYTES, deepseek_v3, fit_table, qwen3_moe
from deamoe_trt.quant import QuantConfig


def test_qwen3_30b_a3b_has_its_published_30_5b_parameters():
    model = qwen3_moe("Qwen3-30B-A3B")
    assert model.params == pytest.approx(30.5e9, rel=0.005)
    # fp16: about 61 GB; int4 FFN weights, group 64, fp16 scales: 0.5 + 2/64 = 17/32 B each.
    assert model.weight_bytes(None) == 2 * model.params
    ffn = 48 * 128 * 3 * 2048 * 768
    assert model.weight_bytes(QuantConfig(4, 64)) == model.weight_bytes(None) - ffn * 2 + ffn * 17 // 32


def test_deepseek_v3_has_its_published_671b_parameters():
    assert deepseek_v3("DeepSeek-V3").params == pytest.approx(671e9, rel=0.002)


def test_fit_is_weights_plus_kv_cache_plus_reserve():
    model = qwen3_moe("Qwen3-30B-A3B")
    need = model.weight_bytes(QuantConfig(4, 64)) + model.kv_bytes_per_token * KV_TOKENS + RESERVE_BYTES
    table = fit_table([model]).splitlines()
    int4 = next(line for line in table if " int4 " in line)
    verdicts = int4.split()[-len(DEVICES) :]
    assert verdicts == ["yes" if memory >= need else "no" for _, memory in DEVICES]
    assert verdicts == ["no", "no", "yes", "yes", "yes"]  # ~18.5 GB: from AGX Orin 32 GB on
    assert DEVICES[2][1] == 32 * GIB


def test_gpt_oss_20b_has_its_published_20_9b_parameters_and_a_windowed_kv_cache():
    from deamoe_trt.fit import GPT_OSS_20B_DEAMOE, gpt_oss

    model = gpt_oss("gpt-oss-20b")
    assert model.params == pytest.approx(20.9e9, rel=0.005)
    # 12 full layers grow 2 * 8 * 64 fp16 values per token; 12 sliding layers hold 127 tokens each.
    assert model.kv_bytes_per_token == 12 * 2 * 8 * 64 * 2
    assert model.kv_fixed_bytes == 12 * 127 * 2 * 8 * 64 * 2
    need = model.weight_bytes(QuantConfig(4, 64)) + model.kv_bytes_per_token * KV_TOKENS + model.kv_fixed_bytes
    int4 = next(line for line in fit_table([model]).splitlines() if " int4 " in line)
    verdicts = int4.split()[-len(DEVICES) :]
    assert verdicts == ["yes" if memory >= need + RESERVE_BYTES else "no" for _, memory in DEVICES]
    assert verdicts[1] == "yes"  # fits 16 GB at int4, as gpt-oss-20b is known to
    converted = gpt_oss("gpt-oss-20b, DeaMoE form", moe=GPT_OSS_20B_DEAMOE)
    assert converted.params < model.params
    assert "gpt-oss-20b, DeaMoE form" in fit_table()


def test_edge_family_models_have_their_published_sizes_and_mla_caches_the_latent():
    from deamoe_trt.fit import edge_models

    models = {m.name: m for m in edge_models()}
    lite = models["DeepSeek-V2-Lite (16B)"]
    assert lite.params == pytest.approx(15.7e9, rel=0.005)  # model card: 15.7B total
    assert models["Moonlight-16B-A3B"].params == pytest.approx(16e9, rel=0.01)
    assert models["Granite-3.0-3B-A800M"].params == pytest.approx(3.3e9, rel=0.01)
    # the latent cache: 576 fp16 values per token and block, 27 blocks
    assert lite.kv_bytes_per_token == 27 * (512 + 64) * 2
    assert lite.moe.top_departments == 1 and lite.moe.score_func == "softmax" and not lite.moe.norm_topk_prob
    table = fit_table(edge_models())
    assert "ERNIE-4.5-21B-A3B" in table and table.count(" int4 ") == 4
