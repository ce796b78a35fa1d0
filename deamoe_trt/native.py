"""What every native build of deamoe-trt shares: where built libraries are cached and which
C++ compiler builds them (the CPU kernel, the CUDA kernel library, the test builds)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE_ENV = "DEAMOE_TRT_CACHE_DIR"


def cache_dir() -> Path:
    """Where built libraries live: $DEAMOE_TRT_CACHE_DIR, else $XDG_CACHE_HOME/deamoe-trt, else ~/.cache/deamoe-trt.

    Each build keeps its own subfolder (cpu/, cuda/) keyed by a hash of what it was built from."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "deamoe-trt"


def find_cxx() -> str | None:
    """The C++ compiler to use: $CXX, else g++, else c++, else clang++; None when there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None
