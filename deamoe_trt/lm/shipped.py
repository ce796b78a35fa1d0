"""The language models and prompts that ship inside the package (deamoe_trt/lm/data/), so
`demo`, `serve-bench` and the samples find them in a wheel as in a source checkout."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

DATA_DIR = Path(__file__).resolve().parent / "data"
# The trained 1.1M-parameter byte-level model (its README says how it was made).
TINY_LM = DATA_DIR / "tiny-lm"
# A trained vanilla MoE of the same size converted by `deamoe-trt convert` (its README has the table).
TINY_LM_CONVERTED = DATA_DIR / "tiny-lm-converted"
# Prompts of different lengths, one a line, in the tiny LM's alphabet (printable ASCII).
PROMPTS_FILE = DATA_DIR / "prompts.txt"


def read_prompts(path: str | Path = PROMPTS_FILE) -> list[str]:
    """The non-empty lines of a UTF-8 text file, each one prompt."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot read prompts from {path}: {exc.strerror if isinstance(exc, OSError) else exc}"
        ) from None
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UsageError(f"{path} has no prompts (one a line)")
    return prompts
