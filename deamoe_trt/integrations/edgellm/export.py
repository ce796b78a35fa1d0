"""`export_edgellm`: runs driver.py in the Python that has Edge-LLM, in a temporary folder renamed
onto the output only when everything succeeded."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..._io import temporary_folder
from ...checkout import import_root
from ...errors import DeaMoEError, UsageError
from .environment import edgellm_python

SIDECAR = "deamoe_trt.json"


def run_driver(python: Path, lm_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """driver.py in python, deamoe_trt importable from where this process imports it; threads kept to two."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_root()), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "2")
    command = [str(python), "-m", "deamoe_trt.integrations.edgellm.driver", str(lm_dir), str(out)]
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
    work = temporary_folder(output)  # beside it, under the name a later run sweeps, with the umask's mode
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
