"""`deamoe-trt check-edgellm`: the Edge-LLM device check's steps that run without a GPU.

The dry run is real end to end (import, our export and Edge-LLM's own export of a tiny
Qwen3-MoE, the greedy reference checked against transformers, the request files and the device
commands). The device tools themselves (llm_build, llm_inference) need TensorRT on a GPU; the
last tests stand them in with scripts that read and write Edge-LLM's documented file formats
(examples/llm/INPUT_FORMAT.md and its output's responses[].output_text), so what is checked is
the check's own logic: the plugin preloaded for our engine only, texts compared with the
reference, a mismatch failing the check, and TPOT from the two lengths.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch

from deamoe_trt.cli.main import main as cli_main
from deamoe_trt.integrations.edgellm import device_check as edgellm_device
from deamoe_trt.lm.checkpoint import load_lm
from integrations.edgellm.test_export import EDGELLM_PYTHON, WHY, build_qwen3_moe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(EDGELLM_PYTHON is None, reason=WHY)]
PROMPTS = ["the sea", "a department"]
TOKENS = 12


def check(out: Path, hf: Path, *extra: str) -> int:
    prompts = [arg for p in PROMPTS for arg in ("--prompt", p)]
    argv = [str(out), "--hf-dir", str(hf), "--tokens", str(TOKENS), *prompts]
    return cli_main(["check-edgellm", *argv, *extra])


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("check_edgellm")
    build_qwen3_moe(root / "hf")
    out = root / "out"
    code = check(out, root / "hf", "--dry-run", "--edgellm-build", str(root / "edge-llm-build"))
    return root, out, code, json.loads((out / "results.json").read_text())


def test_dry_run_exports_ours_and_the_vanilla_model_and_passes(dry_run):
    _, out, code, results = dry_run
    assert code == 0, [s for s in results["steps"] if s["status"] != "ok"]
    for variant in edgellm_device.VARIANTS:
        assert (out / "work" / f"edgellm-{variant}" / "llm" / "config.json").is_file()
    assert (out / "work" / "edgellm-deamoe" / "deamoe_trt.json").is_file()  # ours, with its sidecar
    assert not (out / "work" / "edgellm-vanilla" / "deamoe_trt.json").exists()  # Edge-LLM's own


def test_reference_is_transformers_greedy_on_the_chat_prompt(dry_run):
    import transformers as T

    root, out, _, results = dry_run
    tokenizer = load_lm(out / "work" / "lm").tokenizer
    source = T.AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    for row, prompt in zip(results["reference"], PROMPTS, strict=True):
        ids = tokenizer.encode(tokenizer.chat(prompt))
        greedy = source.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False)[0, len(ids) :].tolist()
        stop = next((i for i, t in enumerate(greedy) if t in tokenizer.eos_ids()), len(greedy))
        assert row["new_ids"] == greedy[:stop], prompt


def test_requests_are_greedy_in_edgellms_input_format_at_two_lengths(dry_run):
    _, out, _, _ = dry_run
    for length in (TOKENS // 4, TOKENS):
        request = json.loads((out / "work" / f"input-{length}.json").read_text())
        assert request["top_k"] == 1 and request["max_generate_length"] == length
        assert [r["messages"] for r in request["requests"]] == [[{"role": "user", "content": p}] for p in PROMPTS]


def test_only_our_engine_gets_the_plugin_preloaded(dry_run):
    _, _, _, results = dry_run
    commands = results["commands"]
    assert len(commands) == 2 * (1 + 2)  # per variant: llm_build, llm_inference at two lengths
    for command in commands:
        assert ("libdeamoe_plugin.so" in command) == ("engine-deamoe" in command or "edgellm-deamoe" in command)


FAKE_BUILD = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --engineDir ] && mkdir -p "$2" && echo "${LD_PRELOAD:-}" > "$2/preload"; shift; done
"""
# Answers each request with the texts the test wrote for (engine, length); sleeps per token
# asked for, so that the longer run takes longer, as a real engine's does.
FAKE_INFERENCE = """#!{python}
import json, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
request = json.load(open(args["--inputFile"]))
length = request["max_generate_length"]
texts = json.load(open("{answers}"))[args["--engineDir"].rsplit("-", 1)[1]][str(length)]
time.sleep(0.02 * length)
responses = [dict(output_text=t, request_idx=i, batch_idx=0) for i, t in enumerate(texts)]
json.dump(dict(responses=responses), open(args["--outputFile"], "w"))
"""


def fake_edgellm(root: Path, answers: dict) -> Path:
    tools = root / "fake-build" / "examples" / "llm"
    tools.mkdir(parents=True, exist_ok=True)
    (root / "answers.json").write_text(json.dumps(answers))
    (tools / "llm_build").write_text(FAKE_BUILD)
    (tools / "llm_inference").write_text(FAKE_INFERENCE.format(python=sys.executable, answers=root / "answers.json"))
    for tool in tools.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return root / "fake-build"


def answers(results: dict, tokenizer, *, deamoe_texts: list[str] | None = None) -> dict:
    """What a correct engine would print: the reference at both lengths (the short run cut)."""
    short, long = {}, {}
    for row in results["reference"]:
        short.setdefault("texts", []).append(tokenizer.decode(row["new_ids"][: TOKENS // 4]))
        long.setdefault("texts", []).append(row["text"])
    right = {str(TOKENS // 4): short["texts"], str(TOKENS): long["texts"]}
    wrong = {str(TOKENS // 4): short["texts"], str(TOKENS): deamoe_texts or long["texts"]}
    return {"deamoe": wrong, "vanilla": right}


def device_run(dry_run, tmp_path, name: str, **kwargs) -> tuple[int, dict, Path]:
    root, out, _, results = dry_run
    if any(len(r["new_ids"]) <= TOKENS // 4 for r in results["reference"]):
        pytest.skip("the tiny model ends a reply within a quarter of --tokens: no TPOT to check")
    tokenizer = load_lm(out / "work" / "lm").tokenizer
    run = tmp_path / name
    shutil.copytree(out / "work", run / "work", ignore=shutil.ignore_patterns("engine-*"))  # exports reused
    build = fake_edgellm(tmp_path, answers(results, tokenizer, **kwargs))
    plugin = tmp_path / "libdeamoe_plugin.so"
    plugin.write_bytes(b"")
    lm = run / "work" / "lm"
    code = check(run, root / "hf", "--edgellm-build", str(build), "--plugin", str(plugin), "--lm", str(lm))
    return code, json.loads((run / "results.json").read_text()), plugin


def test_device_steps_pass_when_our_engine_prints_the_reference(dry_run, tmp_path):
    code, results, plugin = device_run(dry_run, tmp_path, "match")
    assert code == 0, [s for s in results["steps"] if s["status"] != "ok"]
    assert results["summary"]["texts_matched"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
    assert results["tpot"]["deamoe"] > 0 and results["tpot"]["vanilla"] > 0
    assert results["speedup"] == pytest.approx(results["tpot"]["vanilla"] / results["tpot"]["deamoe"])
    engines = tmp_path / "match" / "work"
    assert (engines / "engine-deamoe" / "preload").read_text().strip() == str(plugin)
    assert (engines / "engine-vanilla" / "preload").read_text().strip() == os.environ.get("LD_PRELOAD", "")


def test_a_text_that_differs_from_the_reference_fails_the_check(dry_run, tmp_path):
    code, results, _ = device_run(dry_run, tmp_path, "mismatch", deamoe_texts=["w1 w2", "w2 w1"])
    assert code == 1
    assert results["summary"]["texts_matched"] == f"0/{len(PROMPTS)}"
    failed = [s for s in results["steps"] if s["status"] == "failed"]
    assert [s["name"] for s in failed] == [f"deamoe: llm_inference at {(TOKENS // 4, TOKENS)} tokens"]
    assert "differs from the reference" in failed[0]["error"]
