"""A local Hugging Face model directory, checked before anything reads its weights.

Both directory imports share these: the MoE layers alone (hf_layers, through transformers)
and the whole language model (hf_lm, streamed). One-line errors for a missing directory,
config.json or weights, quantized weights, and pickled weights (never opened).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._io import read_json
from ..errors import UsageError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a local model directory as a dict; one-line errors for a missing
    directory or file and for invalid JSON."""
    path = Path(model_dir)
    if not path.exists():
        raise UsageError(f"{path} does not exist; pass a local Hugging Face model directory")
    if not path.is_dir():
        raise UsageError(
            f"{path} is not a directory; pass a local Hugging Face model directory (config.json + *.safetensors)"
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise UsageError(f"{path} has no config.json; is it a Hugging Face model directory?")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise UsageError(f"{config_path} is not a JSON object")
    return config


def check_not_quantized(config: dict[str, Any], model_dir: str | Path) -> None:
    """A one-line refusal of quantized weights (deamoe-trt imports float ones)."""
    quantization = config.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise UsageError(
            f"{model_dir} holds quantized weights (quant_method {method!r}); "
            "dequantize them to bfloat16 or float32 safetensors first"
        )


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The directory's *.safetensors files; a clear error when it has only pickled weights."""
    path = Path(model_dir)
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise UsageError(
            f"{path} has only pickled weights ({pickled[0]}); deamoe-trt never unpickles files: "
            "convert them to safetensors first (e.g. load and save_pretrained with transformers where you trust them)"
        )
    raise UsageError(f"{path} has no *.safetensors weights")
