"""DeaMoE language models as NVIDIA TensorRT Edge-LLM model directories (`deamoe-trt export-edgellm`).

Edge-LLM's own exporter writes the directory; each MoE layer in its graph is one DeaMoE
plugin node (deamoe_trt.contract) instead of its Fp16MoePlugin/Int4MoePlugin, because Edge-LLM
has no way to say departments with shared parts. How:
- source.py shows the LM to Edge-LLM as the Hugging Face Qwen3-MoE checkpoint it reads;
- family.py registers a Qwen3-MoE model class whose MoE blocks call a torch custom op, and
  adds that op's ONNX translation (one deamoe_trt::DeaMoE node) to Edge-LLM's table;
- driver.py runs Edge-LLM's `tensorrt-edgellm-export` with both in place.

Edge-LLM pins its own torch/transformers/onnx, so it lives in its own environment
(scripts/setup.sh makes .venv-edgellm); this module finds that Python and runs the driver
there, in a temporary folder renamed onto the output only when everything succeeded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ...errors import DeaMoEError, MissingDependencyError, UsageError

# Edge-LLM releases this export is tested with (the graph it writes changes between minor releases).
TESTED_VERSIONS = ("0.11.0",)
TESTED_SERIES = "0.11"
SIDECAR = "deamoe_trt.json"
PYTHON_ENV = "DEAMOE_TRT_EDGELLM_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[3]
VENV_PYTHON = REPO_ROOT / ".venv-edgellm" / "bin" / "python"


def check_version(version: str) -> None:
    """A one-line UsageError when version is outside the tested Edge-LLM series."""
    if version.split("+")[0] not in TESTED_VERSIONS and not version.startswith(TESTED_SERIES + "."):
        raise UsageError(
            f"TensorRT Edge-LLM {version} is outside the tested range ({', '.join(TESTED_VERSIONS)}); "
            f"install tensorrt-edgellm=={TESTED_VERSIONS[-1]} (scripts/setup.sh makes .venv-edgellm with it)"
        )


def edgellm_python(explicit: str | None = None) -> Path:
    """The Python that has Edge-LLM: explicit, $DEAMOE_TRT_EDGELLM_PYTHON, the repository's
    .venv-edgellm, or this one; MissingDependencyError when none has it."""
    for candidate in (explicit, os.environ.get(PYTHON_ENV)):
        if candidate:
            if not Path(candidate).is_file():
                raise UsageError(f"Edge-LLM Python {candidate} does not exist")
            return Path(candidate)
    if VENV_PYTHON.is_file():
        return VENV_PYTHON
    if importlib.util.find_spec("tensorrt_edgellm") is not None:
        return Path(sys.executable)
    raise MissingDependencyError(
        "TensorRT Edge-LLM is not installed: run scripts/setup.sh (it makes .venv-edgellm with "
        f"tensorrt-edgellm[export]=={TESTED_VERSIONS[-1]}) or point {PYTHON_ENV} at a Python that has it"
    )


def run_driver(python: Path, lm_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """driver.py in python, deamoe_trt importable from this source tree; threads kept to two."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "2")
    command = [str(python), "-m", "deamoe_trt.export.edgellm.driver", str(lm_dir), str(out)]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def export_edgellm(lm_dir: str | Path, output: str | Path, *, dtype: str = "fp16", python: str | None = None) -> Path:
    """The Edge-LLM model directory of the DeaMoE LM in lm_dir, written to output (whole or not at all)."""
    from ...lm.checkpoint import read_lm_header
    from . import source

    lm_dir, output = Path(lm_dir), Path(output)
    if dtype not in source.DTYPES:
        raise UsageError(f"Edge-LLM export writes {', '.join(source.DTYPES)} graphs, not {dtype}; pass --dtype fp16")
    header = read_lm_header(lm_dir)
    source.check_representable(header["config"], str(lm_dir))
    source.check_tokenizer(header["tokenizer"], lm_dir)
    if output.exists() and (not output.is_dir() or (any(output.iterdir()) and not (output / SIDECAR).is_file())):
        raise UsageError(
            f"-o {output} exists and is not an earlier export-edgellm directory; remove it or choose another"
        )
    interpreter = edgellm_python(python)
    output.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        result = run_driver(interpreter, lm_dir, work)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            message = lines[-1].removeprefix("error: ") if lines else f"exit status {result.returncode}"
            error = UsageError if result.returncode == 2 else DeaMoEError
            raise error(message)
        if output.exists():
            shutil.rmtree(output)
        os.replace(work, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output


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
