"""`deamoe-trt check-gpu`: its --dry-run runs the whole flow (correctness, timing of the
kernels and of the expanded twin with programmatic launch off and on, the report) through
the SIMT-emulated kernel library; on a GPU it is the one command that measures the kernels."""

import json
import re

import pytest
from cli_status import cli_main

from deamoe_trt.checks.gpu import shrink
from deamoe_trt.presets import PRESETS


@pytest.mark.slow
def test_dry_run_checks_and_times_through_the_emulator(emulated_lib, tmp_path):
    argv = ["--dry-run", "--library", emulated_lib._name, "--presets", "deepseek-v3-layer", "--tokens", "1",
            "--bits", "0", "--out", str(tmp_path)]  # fmt: skip
    assert cli_main(["check-gpu", *argv]) == 0
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["correctness"] and all(r["pass"] for r in results["correctness"])
    assert {r["preset"] for r in results["correctness"]} == {"deepseek-v3-layer"}
    (bench,) = results["benchmarks"]
    timings = {(t["variant"], t["mode"], t["pdl"]): t for t in bench["timings"]}
    assert {("deamoe", "eager", False), ("deamoe", "eager", True), ("expanded", "eager", False)} <= set(timings)
    # One token of the (shrunken) preset: the spec's bytes for k experts and min(g, k)
    # departments, against the twin's k experts of the full width.
    c = PRESETS["deepseek-v3-layer"]
    deamoe, twin = timings[("deamoe", "eager", False)], timings[("expanded", "eager", False)]
    assert twin["bytes_per_step_mean"] > deamoe["bytes_per_step_mean"] > 0
    assert bench["mean_used_experts"] == c.top_k
    assert "speedup vs expanded" in " ".join(results["targets"].values())
    report = (tmp_path / "gpu_check.txt").read_text()
    assert "PASS deepseek-v3-layer" in report and "targets" in report


@pytest.mark.slow
def test_dry_run_checks_and_times_the_int4_rows(emulated_lib, tmp_path):
    """The quantized rows (int4 here; int8 is the same flow): the layer quantized, checked
    against the dequantized reference, timed against its quantized twin, bytes counted as
    packed codes plus scales, the int4 target reported."""
    argv = ["--dry-run", "--library", emulated_lib._name, "--presets", "deepseek-v3-layer", "--tokens", "1",
            "--bits", "4", "--out", str(tmp_path)]  # fmt: skip
    assert cli_main(["check-gpu", *argv]) == 0
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["dtype"] for r in results["correctness"]] == ["bf16-int4"] and results["correctness"][0]["pass"]
    (bench,) = results["benchmarks"]
    timings = {(t["variant"], t["mode"], t["pdl"]): t for t in bench["timings"]}
    deamoe, twin = timings[("deamoe", "eager", False)], timings[("expanded", "eager", False)]
    assert twin["bytes_per_step_mean"] > deamoe["bytes_per_step_mean"] > 0
    # The shrunken preset's 1-token step at int4 (the spec's weights loaded): min(g, k)
    # departments, k experts and the shared expert as codes (half a byte each) plus a bf16
    # scale per group of 32; the router (bf16) and the selection bias (float32) as they are.
    c = shrink(PRESETS["deepseek-v3-layer"], 32)
    widths = min(c.top_departments, c.top_k) * c.shared_intermediate_size + c.top_k * c.private_intermediate_size
    ffn = 3 * c.hidden_size * (widths + c.shared_expert_intermediate_size)
    router = c.num_experts * c.hidden_size * 2 + c.num_experts * 4
    assert deamoe["bytes_per_step_mean"] == ffn // 2 + ffn // 32 * 2 + router
    assert any(key.startswith("bf16-int4") for key in results["targets"])
    assert re.search(r"PASS deepseek-v3-layer +bf16-int4", (tmp_path / "gpu_check.txt").read_text())


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    assert cli_main(["check-gpu", "--presets", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown preset(s) nope" in capsys.readouterr().err
    assert cli_main(["check-gpu", "--out", str(tmp_path), "--presets", "tiny"]) == 2  # no GPU here, no --dry-run
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert cli_main(["check-gpu", "--out", str(tmp_path), "--dry-run", "--bits", "4,3"]) == 2
    assert "argument --bits: takes 0, 4 and/or 8" in capsys.readouterr().err


@pytest.mark.slow
def test_dry_run_checks_the_gpt_oss_rows(emulated_lib, tmp_path):
    """gpt-oss's layer (FFN biases, the clamped SwiGLU, a router logit bias) in float and
    int4, checked against the float32 reference with its biases and activation."""
    argv = ["--dry-run", "--library", emulated_lib._name, "--presets", "gpt-oss-20b-style", "--bits", "0,4",
            "--skip-bench", "--out", str(tmp_path)]  # fmt: skip
    assert cli_main(["check-gpu", *argv]) == 0
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = results["correctness"]
    assert [r["dtype"] for r in rows] == ["bf16", "fp16", "bf16-int4"] and all(r["pass"] for r in rows)
    assert {r["preset"] for r in rows} == {"gpt-oss-20b-style"}
    assert all(r["routing"]["max_logit_abs_error_vs_torch"] < 1e-3 for r in rows), "the logit bias in both"


@pytest.mark.slow
def test_dry_run_tune_times_every_variant_and_writes_the_table(emulated_lib, tmp_path):
    """--tune: every kernel variant that runs kernels of its own for the weight format timed on
    each layer made, the table written from the medians (readable by deamoe_trt.cuda.tuning);
    --sm-limit needs SMs, so the emulator records why not."""
    from deamoe_trt.cuda import tuning
    from deamoe_trt.cuda._abi import variant_names

    argv = ["--dry-run", "--library", emulated_lib._name, "--presets", "qwen3-30b-a3b-layer", "--tokens", "1",
            "--bits", "4", "--skip-bench", "--sm-limit", "16", "--out", str(tmp_path)]  # fmt: skip
    assert cli_main(["check-gpu", *argv]) == 0
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    (row,) = results["tuning"]
    timed = set(row["median_us"])
    assert timed == set(tuning.distinct_variants(variant_names(emulated_lib), 4)) and "bit-dequant" in timed
    assert row["variant"] == tuning.fastest(row["median_us"]) and row["median_us_16_sms"] is None
    assert set(row["relative_error"]) == timed and max(row["relative_error"].values()) < 1e-2  # bf16's tolerance
    assert any("on 16 SMs" in s for s in results["skipped"])
    table = tuning.load_table("emulated", str(tmp_path))
    c = shrink(PRESETS["qwen3-30b-a3b-layer"], 32)
    assert table is not None and table.variant(c, "bf16", 4, 1) == row["variant"]
    assert table.measured["command"].startswith("deamoe-trt check-gpu ")
    assert "kernel variants" in (tmp_path / "gpu_check.txt").read_text()
    tuning.load_table.cache_clear()
