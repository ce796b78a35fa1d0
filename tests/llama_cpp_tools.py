"""Where the tests find llama.cpp's binaries: $DEAMOE_LLAMA_CPP_BIN, else what
scripts/build_llama_cpp.sh builds by default (build/llama.cpp); tests that need them skip
with the way to build them when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def llama_bench_path() -> Path | None:
    folders = [Path(os.environ["DEAMOE_LLAMA_CPP_BIN"])] if os.environ.get("DEAMOE_LLAMA_CPP_BIN") else []
    folders += sorted((ROOT / "build" / "llama.cpp").glob("llama_cpp_python-*/vendor/llama.cpp/build/bin"))
    for folder in folders:
        if all((folder / name).is_file() for name in ("llama-bench", "llama-quantize", "llama-perplexity")):
            return folder / "llama-bench"
    return None


def llama_tools():
    """deamoe_trt.integrations.llamacpp.bench.LlamaTools, or a skip saying how to get them."""
    from deamoe_trt.integrations.llamacpp.bench import LlamaTools

    path = llama_bench_path()
    if path is None:
        pytest.skip("llama.cpp binaries absent: run scripts/build_llama_cpp.sh (or set DEAMOE_LLAMA_CPP_BIN)")
    return LlamaTools.beside(path)
