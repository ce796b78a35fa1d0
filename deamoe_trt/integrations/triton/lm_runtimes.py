"""The runtimes the LM decode service runs, from deamoe_trt.runtimes' registry (light to import:
the commands list them when their parsers are built)."""

from __future__ import annotations

from ... import runtimes
from ...errors import UsageError


def lm_runtimes(*, gpu: bool | None = None) -> tuple[str, ...]:
    """The decode service's runtimes: every one that decodes (deamoe_trt.runtimes' capabilities;
    not the emulated one, seconds a step), and the older names repositories already written
    carry ("trt" for tensorrt); gpu False: those a CPU-only server runs."""
    names = runtimes.names(can="decoding", emulated=False, gpu=gpu)
    return names + tuple(old for old, name in runtimes.ALIASES.items() if name in names)


def check_lm_runtime(runtime: str) -> None:
    if runtime not in lm_runtimes():
        raise UsageError(f"unknown runtime {runtime!r}; choose one of: {', '.join(lm_runtimes())}")


def needs_engine(runtime: str) -> bool:
    """Whether the runtime decodes from an engine file (tensorrt) the repository must carry."""
    return "engine" in runtimes.get(runtime).capabilities.files
