"""The Python that has TensorRT Edge-LLM, and whether its version is one this export is tested with.

Edge-LLM pins its own torch/transformers/onnx, so it lives in its own environment
(scripts/setup.sh makes .venv-edgellm beside the checkout).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...checkout import checkout_root
from ...errors import DeaMoEError, MissingDependencyError, UsageError, one_line

if TYPE_CHECKING:
    from ...trt.doctor import Check

# Edge-LLM releases this export is tested with (the graph it writes changes between minor releases).
TESTED_VERSIONS = ("0.11.0",)
TESTED_SERIES = "0.11"
PYTHON_ENV = "DEAMOE_TRT_EDGELLM_PYTHON"


def venv_python() -> Path | None:
    """The Python of the .venv-edgellm scripts/setup.sh makes in the checkout (deamoe_trt.checkout)."""
    root = checkout_root()
    return None if root is None else root / ".venv-edgellm" / "bin" / "python"


def check_version(version: str) -> None:
    """A one-line UsageError when version is outside the tested Edge-LLM series."""
    if version.split("+")[0] not in TESTED_VERSIONS and not version.startswith(TESTED_SERIES + "."):
        raise UsageError(
            f"TensorRT Edge-LLM {version} is outside the tested range ({', '.join(TESTED_VERSIONS)}); "
            f"install tensorrt-edgellm=={TESTED_VERSIONS[-1]} (scripts/setup.sh makes .venv-edgellm with it)"
        )


def edgellm_python(explicit: str | None = None) -> Path:
    """The Python that has Edge-LLM: explicit, $DEAMOE_TRT_EDGELLM_PYTHON, the checkout's
    .venv-edgellm, or this one; MissingDependencyError when none has it."""
    for candidate in (explicit, os.environ.get(PYTHON_ENV)):
        if candidate:
            if not Path(candidate).is_file():
                raise UsageError(f"Edge-LLM Python {candidate} does not exist")
            if not os.access(candidate, os.X_OK):
                raise UsageError(f"Edge-LLM Python {candidate} is not executable; give the python of its environment")
            return Path(candidate)
    venv = venv_python()
    if venv is not None and venv.is_file():
        return venv
    if importlib.util.find_spec("tensorrt_edgellm") is not None:
        return Path(sys.executable)
    raise MissingDependencyError(
        "TensorRT Edge-LLM is not installed: run scripts/setup.sh (it makes .venv-edgellm with "
        f"tensorrt-edgellm[export]=={TESTED_VERSIONS[-1]}) or point {PYTHON_ENV} at a Python that has it"
    )


def installed_version(python: Path) -> str:
    """tensorrt_edgellm.__version__ in python (DeaMoEError when it cannot be imported there)."""
    command = [str(python), "-c", "import tensorrt_edgellm; print(tensorrt_edgellm.__version__)"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise DeaMoEError(f"{python} cannot run: {exc}") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise DeaMoEError(f"{python} cannot import tensorrt_edgellm: {lines[-1] if lines else result.returncode}")
    return result.stdout.strip()


def doctor_check() -> Check:
    """`deamoe-trt doctor`'s line (a trt.doctor.Check): Edge-LLM's exporter (export-edgellm) and its
    version, from the Python that would run it."""
    from ...trt.doctor import FAILED, MISSING, OK, Check

    name = "TensorRT Edge-LLM"
    fix = f"only for export-edgellm: scripts/setup.sh makes .venv-edgellm (tensorrt-edgellm=={TESTED_VERSIONS[-1]})"
    try:
        python = edgellm_python()
        version = installed_version(python)
    except DeaMoEError as exc:
        return Check(name, MISSING, one_line(exc), fix, needed=False)
    try:
        check_version(version)
    except DeaMoEError as exc:
        return Check(name, FAILED, one_line(exc), fix, needed=False)
    return Check(name, OK, f"{version} ({python})", needed=False)
