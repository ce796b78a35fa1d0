"""The shipped converted sample: small, loadable, and as good as its record says."""

from __future__ import annotations

from deamoe_trt.convert.report import lm_step_bytes
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.shipped import TINY_LM_CONVERTED
from deamoe_trt.train.lm import shipped_text

SAMPLE = TINY_LM_CONVERTED


def test_converted_sample_is_small_and_records_the_target_met():
    assert sum(p.stat().st_size for p in SAMPLE.iterdir()) < 5_000_000
    loaded = load_lm(SAMPLE)
    moe = loaded.model.config.moe
    assert moe.shared_intermediate_size > 0 and moe.num_departments == 4
    rows = {r["method"]: r for r in loaded.training["conversion"]["report"]}
    source, converted = rows["source"], rows["converted + healed"]
    assert converted["bytes_vs_source"] <= 0.65
    assert converted["perplexity"] <= 1.03 * source["perplexity"]
    assert converted["next_token_agreement"] >= 0.90


def test_converted_sample_loads_fewer_bytes_than_its_vanilla_twin():
    loaded = load_lm(SAMPLE)
    measured = lm_step_bytes(loaded.model, loaded.tokenizer.encode(shipped_text()[-100:]))
    # One department per token: f_s + 4 f_p = 160 of the vanilla twin's 4 x 64 = 256 neurons.
    assert measured["deamoe"] < 0.65 * measured["vanilla"]
