"""The Edge-LLM device check: a DeaMoE LM on TensorRT Edge-LLM against its vanilla model.

    deamoe-trt check-edgellm OUT_DIR --hf-dir HF_DIR --edgellm-build DIR [--lm LM_DIR]
        [--plugin PATH] [--tensorrt-root DIR] [--tensorrt-include DIR] [--prompt TEXT ...]
        [--tokens 64] [--dry-run]
    (or: python -m deamoe_trt.integrations.edgellm.device_check OUT_DIR ...)

HF_DIR is the Hugging Face model Edge-LLM supports (a Qwen3-MoE); LM_DIR its DeaMoE LM
(imported or converted from it; default: `import-hf HF_DIR`). DIR is the build folder of a
TensorRT Edge-LLM source build (it holds examples/llm/llm_build and llm_inference).

Steps (each recorded in OUT_DIR/results.json, rewritten after every step):
 1. the LM: LM_DIR, or HF_DIR imported into OUT_DIR/work/lm
 2. exports: ours (`export-edgellm`) into work/edgellm-deamoe and the vanilla model by
    Edge-LLM's own exporter into work/edgellm-vanilla (an export already there is reused)
 3. reference: each prompt through the model's chat template, greedy on this project's
    PyTorch decoder for --tokens tokens (cut at the first end-of-sequence token)
 4. plugin: cmake build of libdeamoe_plugin.so for this GPU (skipped with --plugin)
 5. engines: llm_build for both exports, ours with the plugin preloaded (LD_PRELOAD: Edge-LLM
    dlopens its own plugin library; ours registers its creator when loaded)
 6. inference: llm_inference, greedy (top_k 1), on both engines at --tokens and at a quarter
    of it; our engine's text must equal the reference's; TPOT of each engine is the wall-time
    difference of the two runs over the difference of the tokens they produced, which leaves
    engine loading and prefill out; the ratio vanilla/DeaMoE is DeaMoE's speedup.
Exit 0 when every step passed and our engine's text matched the reference on every prompt,
1 otherwise. With --dry-run, steps 1-3 run (no GPU needed) and the commands of 4-6 are
written to results.json and printed instead of run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from ...checks.trt_device import Check, Skip

PROMPTS = ("Tell me about the sea.", "What is a department of experts?")
GREEDY = {"temperature": 1.0, "top_p": 1.0, "top_k": 1}
VARIANTS = ("deamoe", "vanilla")


@dataclasses.dataclass
class EdgeLLMCheckOptions:
    """What to check, as the command's flags say (deamoe-trt check-edgellm --help)."""

    out: Path
    hf_dir: Path  # the vanilla Hugging Face model's folder (config.json)
    lm: str | None = None  # its DeaMoE LM checkpoint (default: import-hf of hf_dir)
    edgellm_build: str = ""
    edgellm_python: str | None = None
    plugin: str | None = None
    tensorrt_root: str | None = None
    tensorrt_include: str | None = None
    prompt: list[str] = dataclasses.field(default_factory=lambda: list(PROMPTS))
    tokens: int = 64  # at least 4: TPOT needs two lengths
    max_kv_cache: int = 4096
    dry_run: bool = False


class EdgeLLMCheck(Check):
    def __init__(self, out: Path, args: EdgeLLMCheckOptions):
        super().__init__(out, args)
        self.results["script"] = "deamoe-trt check-edgellm (deamoe_trt/integrations/edgellm/device_check.py)"
        self.results.update({"reference": [], "commands": [], "inference": [], "tpot": {}})
        self.lm_dir = Path(args.lm) if args.lm else self.work / "lm"
        self.exports = {v: self.work / f"edgellm-{v}" for v in VARIANTS}
        self.engines = {v: self.work / f"engine-{v}" for v in VARIANTS}

    def save(self) -> None:
        super().save()
        matched = [r["matches_reference"] for r in self.results["inference"] if r["variant"] == "deamoe"]
        self.results["summary"]["texts_matched"] = f"{sum(matched)}/{len(matched)}"
        tmp = self.out / ".results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / "results.json")

    # -- steps 1-3: any machine ---------------------------------------------------------------

    def lm(self) -> str:
        if self.args.lm:
            return f"given: {self.lm_dir}"
        if (self.lm_dir / "config.json").is_file():
            return f"reused: {self.lm_dir}"
        from ...importers.hf_lm import import_hf_lm

        import_hf_lm(self.args.hf_dir, self.lm_dir)
        return f"imported {self.args.hf_dir} into {self.lm_dir}"

    def export_model(self, variant: str) -> str:
        out = self.exports[variant]
        if (out / "llm" / "config.json").is_file():
            return f"reused: {out}"
        if variant == "deamoe":
            from . import export_edgellm

            export_edgellm(self.lm_dir, out, python=self.args.edgellm_python)
        else:
            self._edgellm_export(out)
        return str(out)

    def _edgellm_export(self, out: Path) -> None:
        """Edge-LLM's own `tensorrt-edgellm-export HF_DIR out`, into a temporary name first."""
        from . import edgellm_python

        script = "import sys; from tensorrt_edgellm.scripts.export import main; sys.exit(main())"
        partial = out.with_name(f".{out.name}.partial")
        command = [str(edgellm_python(self.args.edgellm_python)), "-c", script, str(self.args.hf_dir), str(partial)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise RuntimeError("Edge-LLM's export of the vanilla model failed: " + " | ".join(tail))
        os.replace(partial, out)

    def reference(self) -> list[dict]:
        import torch

        from ... import runtimes
        from ...lm.checkpoint import load_lm
        from ...runtimes.decode import generate

        loaded = load_lm(self.lm_dir, device="cuda" if torch.cuda.is_available() else None)
        tokenizer = loaded.tokenizer
        stops = set(tokenizer.eos_ids())
        rows = []
        for prompt in self.args.prompt:
            ids = tokenizer.encode(tokenizer.chat(prompt))
            new = generate(runtimes.get("torch").decoder(loaded.model), ids, self.args.tokens).new_ids
            cut = next((i for i, t in enumerate(new) if t in stops), len(new))
            text = tokenizer.tokenizer.decode(new[:cut], skip_special_tokens=True)
            rows.append({"prompt": prompt, "prompt_tokens": len(ids), "new_ids": new[:cut], "text": text})
        self.results["reference"] = rows
        return [{"prompt": r["prompt"], "tokens": len(r["new_ids"])} for r in rows]

    def input_files(self) -> dict[int, Path]:
        """llm_inference's request files (examples/llm/INPUT_FORMAT.md), one per length."""
        files = {}
        for length in self.lengths():
            request: dict[str, Any] = {"batch_size": 1, **GREEDY, "max_generate_length": length}
            request["requests"] = [{"messages": [{"role": "user", "content": p}]} for p in self.args.prompt]
            path = self.work / f"input-{length}.json"
            path.write_text(json.dumps(request, indent=2) + "\n")
            files[length] = path
        return files

    def lengths(self) -> tuple[int, int]:
        return max(1, self.args.tokens // 4), self.args.tokens

    # -- steps 4-6: the device ------------------------------------------------------------------

    def tool(self, name: str) -> Path:
        path = Path(self.args.edgellm_build) / "examples" / "llm" / name
        if not path.is_file() and not self.args.dry_run:
            raise Skip(f"{path} does not exist: pass --edgellm-build, the build folder of an Edge-LLM source build")
        return path

    def command(self, variant: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        if variant == "deamoe":
            library = self.plugin_path or str(self.work / "build-plugins" / "libdeamoe_plugin.so")
            env["LD_PRELOAD"] = os.pathsep.join(filter(None, [library, env.get("LD_PRELOAD")]))
        shown = (f"LD_PRELOAD={env['LD_PRELOAD']} " if variant == "deamoe" else "") + shlex.join(argv)
        self.results["commands"].append(shown)
        return argv, env

    def run(self, variant: str, argv: list[str]) -> float:
        argv, env = self.command(variant, argv)
        if self.args.dry_run:
            self.say("  (dry run) $ " + self.results["commands"][-1])
            return 0.0
        self.say("  $ " + self.results["commands"][-1])
        began = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - began
        log = self.work / f"{Path(argv[0]).name}-{variant}.log"
        with log.open("a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
            raise RuntimeError(f"{Path(argv[0]).name} exited {done.returncode}: " + " | ".join(tail))
        return seconds

    def build_engine(self, variant: str) -> str:
        argv = [str(self.tool("llm_build")), "--onnxDir", str(self.exports[variant] / "llm"),
                "--engineDir", str(self.engines[variant]), "--maxBatchSize", "1",
                "--maxKVCacheCapacity", str(self.args.max_kv_cache)]  # fmt: skip
        self.run(variant, argv)
        return str(self.engines[variant])

    def infer(self, variant: str, inputs: dict[int, Path]) -> dict:
        from ...lm.checkpoint import load_lm

        tokenizer = load_lm(self.lm_dir).tokenizer if not self.args.dry_run else None
        timings = {}
        for length, request in inputs.items():
            output = self.work / f"output-{variant}-{length}.json"
            argv = [str(self.tool("llm_inference")), "--engineDir", str(self.engines[variant]),
                    "--inputFile", str(request), "--outputFile", str(output)]  # fmt: skip
            seconds = self.run(variant, argv)
            if self.args.dry_run:
                continue
            texts = [r["output_text"] for r in sorted(_responses(output), key=lambda r: r["request_idx"])]
            produced = [len(tokenizer.tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
            timings[length] = (seconds, sum(produced))
            if length == self.args.tokens:
                for row, text in zip(self.results["reference"], texts, strict=True):
                    record = {"variant": variant, "prompt": row["prompt"], "text": text}
                    if variant == "deamoe":
                        record["matches_reference"] = text.strip() == row["text"].strip()
                    self.results["inference"].append(record)
        if self.args.dry_run:
            return {"dry_run": True}
        mismatched = [r["prompt"] for r in self.results["inference"] if r.get("matches_reference") is False]
        if variant == "deamoe" and mismatched:
            raise RuntimeError(f"our engine's text differs from the reference decoder's for {mismatched}")
        (short_s, short_n), (long_s, long_n) = (timings[n] for n in self.lengths())
        if long_n <= short_n:
            raise RuntimeError(f"the engine produced {long_n} tokens at --tokens and {short_n} at a quarter: no TPOT")
        tpot_ms = 1000 * (long_s - short_s) / (long_n - short_n)
        self.results["tpot"][variant] = tpot_ms
        return {"tpot_ms": round(tpot_ms, 4), "tokens": long_n}


def _responses(path: Path) -> list[dict]:
    """llm_inference's output file's responses (its documented format)."""
    try:
        responses = json.loads(path.read_text())["responses"]
        return [{"output_text": str(r["output_text"]), "request_idx": int(r["request_idx"])} for r in responses]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{path} is not llm_inference's output (responses[].output_text): {exc}") from None


def run_check(args: EdgeLLMCheckOptions) -> int:
    """Run the check; 0 when every step passed and both TPOTs were measured (--dry-run: the
    steps that ran passed)."""
    args.out.mkdir(parents=True, exist_ok=True)
    check = EdgeLLMCheck(args.out, args)
    check.step("LM", check.lm)
    for variant in VARIANTS:
        check.step(f"{variant}: Edge-LLM model directory", check.export_model, variant)
    check.step("reference decoding (PyTorch, greedy)", check.reference)
    inputs = check.input_files()
    if not args.dry_run:
        check.step("plugin library: cmake build", check.build_plugin)
    for variant in VARIANTS:
        check.step(f"{variant}: llm_build", check.build_engine, variant)
        check.step(f"{variant}: llm_inference at {check.lengths()} tokens", check.infer, variant, inputs)
    tpot = check.results["tpot"]
    if len(tpot) == 2:
        check.results["speedup"] = tpot["vanilla"] / tpot["deamoe"]
        check.say(f"TPOT: DeaMoE {tpot['deamoe']:.3f} ms, vanilla {tpot['vanilla']:.3f} ms, "
                  f"speedup {check.results['speedup']:.2f}x")  # fmt: skip
    check.results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    check.save()
    summary = check.results["summary"]
    check.say(f"done: {summary['ok']} ok, {summary['failed']} failed, {summary['skipped']} skipped; "
              f"texts matched {summary['texts_matched']}; {args.out / 'results.json'}")  # fmt: skip
    if args.dry_run:
        print("\n".join(check.results["commands"]))
        return 0 if summary["failed"] == 0 else 1
    passed = summary["failed"] == 0 and summary["skipped"] == 0 and "speedup" in check.results
    return 0 if passed else 1
