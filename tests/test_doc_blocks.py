"""Every ```bash block of README.md and docs/*.md runs as written, in order, each document in a
fresh copy of the repository of its own (its tracked files in a temporary folder, the installed
package on PATH), so each page runs as a reader who opened only that page would run it.
Every command runs on one thread; two documents run at a time, one per core of a two-core CI
machine.

A command is skipped only when it needs what a test machine lacks or takes too long: a GPU,
TensorRT, a download or a long run. SKIPS lists each with its reason; a skip that matches no
command fails, so the list stays the docs' list.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?")

GPU, TRT, DOWNLOAD, LONG = "needs a CUDA GPU", "needs TensorRT", "downloads", "a long run (minutes or more)"
DOCTOR = "exits 1 where no GPU and TensorRT are ready (" + GPU + ", " + TRT + ")"
# (file, a regular expression the command matches, why it is not run here)
SKIPS: list[tuple[str, str, str]] = [
    ("README.md", r"^scripts/setup\.sh", DOWNLOAD + " (setup.sh installs from PyPI)"),
    ("docs/bench-method.md", r"^deamoe-trt bench(?![^#]*--quick)", LONG + ": a real-size layer"),
    ("docs/convert.md", r"scripts/convert_report\.py", LONG + ": trains the sources"),
    ("docs/convert.md", r"--heal-steps 100", LONG + ": 100 healing steps of a trained source"),
    ("docs/convert.md", r"fine-grained-moe", LONG + ": the fine-grained source trains first"),
    ("docs/convert.md", r"train -o cmp", LONG + ": trains two small models"),
    ("docs/convert.md", r"make_scratch\(600|code-moe", LONG + ": trains a 600-step source"),
    ("docs/convert.md", r"code-g1\.json", LONG + ": reads the reports of the healed code conversions"),
    ("docs/convert.md", r"qwen-vanilla", LONG + ": a 2.4 GB layer, minutes"),
    ("docs/convert.md", r"--heal-device cuda", GPU),
    ("docs/convert.md", r"nproc-per-node 4 -m deamoe_trt convert", LONG + ": 2000 healing steps"),
    ("docs/deploying.md", r"^deamoe-trt doctor", DOCTOR),
    ("docs/deploying.md", r"git clone|pip install|apt install", DOWNLOAD),
    ("docs/deploying.md", r"qwen3-30b-a3b-layer|export ckpt --form plugin", LONG + ": a 2.4 GB layer"),
    ("docs/deploying.md", r"cmake|deamoe-trt build|model\.engine|check-trt|-m trt", TRT),
    ("docs/edge-llm.md", r"^deamoe-trt doctor", DOCTOR),
    ("docs/edge-llm.md", r"^scripts/setup\.sh", DOWNLOAD + " (setup.sh installs from PyPI)"),
    ("docs/edge-llm.md", r"Qwen3-30B-A3B|lm/", DOWNLOAD + ": Qwen3-30B-A3B's weights"),
    ("docs/edge-llm.md", r"tests/integrations/edgellm", LONG + ": 50-250 s, TensorRT Edge-LLM's exporter"),
    ("docs/edge-llm.md", r"DEAMOE_TRT_HEADERS|cmake|llm_build|llm_inference", TRT),
    ("docs/hf-models.md", r"qwen3-30b-a3b|Qwen3-30B-A3B|hf/qwen3-deamoe", DOWNLOAD + ": Qwen3-30B-A3B's weights"),
    ("docs/hf-models.md", r"^HF_DATASETS_OFFLINE=1 lm_eval", DOWNLOAD + ": lm-eval is not a dependency"),
    ("docs/quantization.md", r"^deamoe-trt bench --quantized 4", LONG + ": a real-size layer"),
    ("docs/serving.md", r"^scripts/setup\.sh", DOWNLOAD + " (setup.sh installs from PyPI)"),
    ("docs/serving.md", r"serve-bench", LONG + ": a Triton server under load, minutes"),
    ("docs/serving.md", r"TritonServer\(|curl -s", LONG + ": a server that runs until stopped"),
    ("docs/serving.md", r"docker run|layer\.engine", GPU + " and " + TRT),
    ("docs/serving.md", r"export ckpt|layer-ort\.onnx", LONG + ": a 2.4 GB layer (deploying.md's ckpt)"),
    ("docs/serving.md", r"vllm\.serve|vllm serve|qwen3-moe", GPU + " (vLLM)"),
    ("docs/usage.md", r"^deamoe-trt bench(?![^#]*--quick)|build_llama_cpp", LONG + ": benchmarks"),
    ("docs/usage.md", r"ckpt/qwen3", LONG + ": a real-size layer"),
    ("docs/usage.md", r"build_kernels\.sh", LONG + ": nvcc for five architectures"),
    ("docs/usage.md", r"check-gpu --out DIR", GPU),
    ("docs/usage.md", r"cmake|deamoe-trt build|model\.engine|check-trt|generate_trt", TRT),
    ("docs/usage.md", r"^deamoe-trt doctor", DOCTOR),
    ("docs/usage.md", r"train-tiny", LONG + ": retrains the tiny LM"),
]

TIMEOUT = 300


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines, open quotes and here-documents joined."""
    out: list[str] = []
    current: list[str] = []
    heredoc = None
    for line in block.splitlines():
        if heredoc is not None:
            current.append(line)
            if line.strip() == heredoc:
                out.append("\n".join(current))
                current, heredoc = [], None
            continue
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        match = _HEREDOC.search(line)
        if match:
            heredoc = match.group(1)
            continue
        text = "\n".join(current)
        if line.rstrip().endswith("\\") or not _closed(text):
            continue
        out.append(text)
        current = []
    assert not current and heredoc is None, f"unterminated command: {current}"
    return out


def _closed(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def doc_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        rel = str(doc.relative_to(ROOT))
        for block in _BLOCK.findall(doc.read_text()):
            out += [(rel, c) for c in commands(block)]
    return out


def skip_reason(doc: str, command: str) -> str | None:
    for file, pattern, reason in SKIPS:
        if file == doc and re.search(pattern, command):
            return reason
    return None


def test_every_skip_matches_a_command():
    listed = doc_commands()
    for file, pattern, reason in SKIPS:
        assert any(doc == file and re.search(pattern, c) for doc, c in listed), (file, pattern, reason)


def fresh_checkout(work: Path) -> Path:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    return work


def run_doc(doc: str, commands: list[str], work: Path, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """The document's commands in order, in work; (a line per command, the failures)."""
    lines, failures = [], []
    for command in commands:
        began = time.perf_counter()
        try:
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", command],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:  # reported with the other documents' results
            failures.append(f"{doc}: {command}\n  did not finish in {TIMEOUT} s")
            continue
        finally:
            lines.append(f"{time.perf_counter() - began:6.1f} s  {doc}: {command.splitlines()[0][:100]}")
        if done.returncode != 0:
            failures.append(f"{doc}: {command}\n  exit {done.returncode}: {done.stderr.strip()[-400:]}")
    return lines, failures


@pytest.mark.slow
def test_every_doc_command_runs_as_written_in_a_fresh_checkout(tmp_path):
    by_doc: dict[str, list[str]] = {}
    for doc, command in doc_commands():
        if not skip_reason(doc, command):
            by_doc.setdefault(doc, []).append(command)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    # The documents with the most commands first, so that the two workers finish close together.
    docs = sorted(by_doc, key=lambda doc: -len(by_doc[doc]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        checkouts = {doc: fresh_checkout(tmp_path / doc.replace("/", "_")) for doc in docs}
        runs = [pool.submit(run_doc, doc, by_doc[doc], checkouts[doc], env) for doc in docs]
        results = [run.result() for run in runs]
    failures = []
    for lines, failed in results:
        print("\n".join(lines))
        failures += failed
    assert not failures, "\n".join(failures)
