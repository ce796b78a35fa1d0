"""An export-hf directory in an interpreter that cannot import deamoe_trt: transformers runs the
directory's own copy of the package's modules (trust_remote_code) and gets the reference's
logits and greedy tokens; without that code the load fails naming what is missing."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deamoe_trt.export.hf import write_hf_dir
from deamoe_trt.hf.remote_code import AUTO_MAP, remote_code
from deamoe_trt.lm.tokenizer import default_tokenizer

from .models import PROMPT_TOKENS, VARIANTS, model, prompt, reference_greedy

pytest.importorskip("transformers")
CHILD = Path(__file__).with_name("without_deamoe.py")


def test_the_remote_code_is_the_package_source_with_flat_relative_imports():
    files = remote_code()
    assert {f"{name.split('.')[0]}.py" for name in AUTO_MAP.values()} <= files.keys()
    here = Path(__file__).resolve().parents[2] / "deamoe_trt"
    errors = files["deamoe_errors.py"]
    assert errors.split("\n", 1)[1] == (here / "errors.py").read_text()  # no package imports: copied as is
    assert "from .deamoe_config import DeaMoEConfig" in files["deamoe_routing.py"]
    assert "from .deamoe_layer import SUPPORTED_DTYPES, DeaMoELayer" in files["deamoe_lm_model.py"]
    for name, text in files.items():  # every package import is one of a copied module, by its flat name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and f"{node.module or node.names[0].name}.py" in files, (name, node.lineno)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(m.startswith("deamoe_trt") for m in modules), (name, node.lineno)


@pytest.mark.slow
def test_transformers_alone_runs_every_variant_as_the_reference(tmp_path):
    ids = prompt()
    save_file({"ids": ids}, str(tmp_path / "prompt.safetensors"))
    references, dirs = [], []
    for variant in sorted(VARIANTS):
        lm = model(variant)
        dirs.append(str(write_hf_dir(lm, default_tokenizer(lm.config.vocab_size), tmp_path / variant)))
        with torch.no_grad():
            references.append((lm(ids).logits, reference_greedy(lm, ids)))
    stripped = tmp_path / "no-code"
    shutil.copytree(dirs[0], stripped)
    for file in stripped.glob("deamoe_*.py"):
        file.unlink()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    run = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), *dirs, "--expect-error", str(stripped)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert all(line.startswith("transformers_modules.") for line in run.stdout.split())
    for i, (logits, tokens) in enumerate(references):
        got = load_file(str(tmp_path / f"{i}.safetensors"))
        assert torch.allclose(got["logits"], logits, atol=1e-5, rtol=0), sorted(VARIANTS)[i]
        assert got["tokens"][0, PROMPT_TOKENS:].tolist() == tokens, sorted(VARIANTS)[i]
    error = json.loads((tmp_path / "error.json").read_text())
    assert error is not None and "deamoe_hf_configuration.py" in error
