"""Language-model checkpoints as models: save_lm and load_lm (a model with its tokenizer and
training record). The files themselves are deamoe_trt.lm.checkpoint_format's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint_format import FORMAT, FORMAT_VERSION, is_lm_checkpoint, read_lm_header, stored_state
from .model import DeaMoELM
from .tokenizer import Tokenizer

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LoadedLM",
    "expected_tensors",
    "is_lm_checkpoint",
    "load_lm",
    "read_lm_header",
    "save_lm",
    "stored_state",
]


@dataclass
class LoadedLM:
    model: DeaMoELM
    tokenizer: Tokenizer
    training: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def save_lm(
    model: DeaMoELM,
    directory: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write model (and its tokenizer) to directory; each file appears whole or not at all."""
    return model.save_pretrained(directory, tokenizer=tokenizer, training=training)


def expected_tensors(model: DeaMoELM) -> dict[str, Any]:
    """Name -> tensor (meta or real) of every tensor a checkpoint of model's config stores."""
    return stored_state(model.state_dict(), model.config)


def load_lm(directory: str | Path, *, device=None) -> LoadedLM:
    """Read a checkpoint written by save_lm, checking every tensor against its config."""
    directory = Path(directory)
    header = read_lm_header(directory)
    model = DeaMoELM.from_pretrained(directory, device=device, header=header)
    return LoadedLM(model=model, tokenizer=header["tokenizer"], training=header.get("training") or {}, path=directory)
