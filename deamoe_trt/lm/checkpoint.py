"""Checkpoints of every artifact: read(path) says which one a directory holds (a layer, a
stack of layers or a language model) with its checked config, and loads the weights only
when asked. Language-model checkpoints as models: save_lm and load_lm (a model with its
tokenizer and training record).

The two file formats stay apart (deamoe_trt.checkpoint: layers and stacks;
deamoe_trt.lm.checkpoint_format: language models). The reader that tells them apart lives
here because it must parse a language model's config, and the core may not import lm/
(tests/test_layering.py); lm/ may import the core, so this is the lowest place that sees both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..checkpoint import WEIGHTS_FILE, read_header, read_tensors
from ..errors import CheckpointError
from .checkpoint_format import FORMAT, FORMAT_VERSION, is_lm_checkpoint, read_lm_header, stored_state
from .model import DeaMoELM
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

    from ..config import DeaMoEConfig
    from ..layer import DeaMoEStack
    from .config import LMConfig

__all__ = [
    "ARTIFACTS",
    "FORMAT",
    "FORMAT_VERSION",
    "Artifact",
    "Checkpoint",
    "LoadedLM",
    "expected_tensors",
    "is_lm_checkpoint",
    "load_lm",
    "read",
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
    return Checkpoint(directory, "lm", read_lm_header(directory)).lm(device=device)


Artifact = Literal["layer", "stack", "lm"]
# How each artifact is named in messages.
ARTIFACTS: dict[str, str] = {"layer": "layer", "stack": "stack of layers", "lm": "language model"}


@dataclass(frozen=True)
class Checkpoint:
    """What read() found: the artifact, its config.json as checked (config parsed; for a
    language model the tokenizer too), and loaders that read model.safetensors when called."""

    path: Path
    artifact: Artifact
    header: dict[str, Any]

    @property
    def config(self) -> DeaMoEConfig | LMConfig:
        """The layer config (layer, stack) or the language model's (its FFNs' under .moe)."""
        return self.header["config"]

    @property
    def dtype(self) -> str:
        """The weights' dtype as config.json names it (float32, float16, bfloat16)."""
        return self.header["dtype"]

    @property
    def num_layers(self) -> int:
        """Layers of a layer checkpoint, decoder blocks of a language model."""
        return self.config.num_layers if self.artifact == "lm" else self.header["num_layers"]

    @property
    def description(self) -> str:
        """The artifact in words, e.g. "stack of 4 layers" or "language model of 2 blocks"."""
        if self.artifact == "layer":
            return "layer"
        unit = "blocks" if self.artifact == "lm" else "layers"
        return f"{ARTIFACTS[self.artifact]} of {self.num_layers} {unit}"

    def expect(self, *artifacts: Artifact, command: str | None = None) -> Checkpoint:
        """self when it holds one of artifacts; otherwise a one-line CheckpointError naming what
        command (a deamoe-trt command's name) takes."""
        if self.artifact not in artifacts:
            wanted = " or ".join(ARTIFACTS[a] for a in artifacts)
            taker = f"`deamoe-trt {command}` takes" if command else "this needs"
            raise CheckpointError(f"{self.path} holds a {ARTIFACTS[self.artifact]}; {taker} a {wanted} checkpoint")
        return self

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor model.safetensors stores, by its stored name, unchecked (stack() and
        lm() check them against the config)."""
        return read_tensors(self.path / WEIGHTS_FILE)

    def stack(self, *, device=None) -> DeaMoEStack:
        """The layers, checked against the config (a layer checkpoint: a stack of one)."""
        from ..layer import DeaMoEStack

        self.expect("layer", "stack")
        return DeaMoEStack.from_pretrained(self.path, device=device)

    def lm(self, *, device=None) -> LoadedLM:
        """The language model with its tokenizer and training record, checked against the config."""
        self.expect("lm")
        model = DeaMoELM.from_pretrained(self.path, device=device, header=self.header)
        return LoadedLM(model, self.header["tokenizer"], self.header.get("training") or {}, self.path)


def read(directory: str | Path) -> Checkpoint:
    """The checkpoint in directory, of either format, its config.json checked; no weights read."""
    directory = Path(directory)
    if is_lm_checkpoint(directory):
        return Checkpoint(directory, "lm", read_lm_header(directory))
    header = read_header(directory)
    return Checkpoint(directory, "layer" if header["num_layers"] == 1 else "stack", header)
