"""The files of a language-model checkpoint: a directory with config.json and model.safetensors.
Never pickle. This module knows no model class: DeaMoELM.save_pretrained and from_pretrained
(deamoe_trt.lm.model) build on it, and deamoe_trt.lm.checkpoint adds save_lm/load_lm on top.

Same conventions as deamoe_trt.checkpoint (weights first, then the config, each written
atomically; every tensor checked against the config on load), with its own format name
so a layer checkpoint and a model checkpoint are never mistaken for one another.

config.json:  {"format": "deamoe-trt-lm", "format_version": 1, "dtype": "float32",
               "config": {LMConfig fields, "moe": {DeaMoEConfig fields},
                          "quantization": {"bits": 4, "group_size": 32, ...} (quantized models only)},
               "tokenizer": {"type": "bytes", "vocab_size": 256, "alphabet": "..."},
               "training": {...}}   (training: optional, how the weights were made)
model.safetensors: DeaMoELM.state_dict() (names in deamoe_trt.lm.model's docstring); in a
quantized model each DeaMoE FFN weight <name> is "<name>.qweight" (uint8 codes) and
"<name>.scales", as in a quantized layer checkpoint (deamoe_trt.quant, docs/quantization.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._io import read_json
from ..checkpoint import (
    CONFIG_FILE,
    DTYPES,
    ROUTER_BIAS,
    WEIGHTS_FILE,
    check_dtype,
    check_layer_count,
    check_tensors,
    check_version,
    dtype_name,
    read_tensors,
    write_files,
)
from ..checkpoint import FORMAT as LAYER_FORMAT
from ..errors import CheckpointError, UsageError
from ..safetensors_io import ST_NAMES, index_checkpoint
from .config import LMConfig
from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, default_tokenizer, tokenizer_from_dict

FORMAT = "deamoe-trt-lm"
FORMAT_VERSION = 1


def write_lm(
    state: dict[str, Any],
    config: LMConfig,
    dtype: torch.dtype,
    directory: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write a model's state dict (and its tokenizer) to directory; each file appears whole or not at all."""
    tokenizer = tokenizer or default_tokenizer(config.vocab_size)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in stored_state(state, config).items()}
    header = lm_header(config, dtype, tokenizer, training)
    if isinstance(tokenizer, HFTokenizer):
        Path(directory).mkdir(parents=True, exist_ok=True)
        tokenizer.save(directory)
    return write_files(directory, tensors, header)


def lm_header(
    config: LMConfig, dtype: torch.dtype, tokenizer: Tokenizer, training: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json of a model checkpoint (what write_lm writes)."""
    header: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dtype": dtype_name(dtype),
        "config": config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
    }
    if training:
        header["training"] = training
    return header


def checked_index(source: Path, expected: dict[str, Any], dtype: str) -> dict:
    """The checkpoint's tensors by name (safetensors_io.TensorInfo), each of expected (stored_state
    of a model of its config, on the meta device) checked (shape, dtype) from the header
    alone, before any tensor is read; dtype: the header's."""
    index = index_checkpoint(source)
    weights = source / WEIGHTS_FILE
    for name, want in expected.items():
        info = index.get(name)
        if info is None:
            raise UsageError(f"{weights} lacks {name}, which its config needs")
        if info.shape != tuple(want.shape):
            raise UsageError(f"{name} has shape {list(info.shape)} in {weights}, its config needs {list(want.shape)}")
        if info.dtype not in (ST_NAMES[want.dtype], ST_NAMES[DTYPES[dtype]]):
            raise UsageError(f"{name} is {info.dtype} in {weights}, its config says {dtype}")
    extra = sorted(set(index) - set(expected))
    if extra:
        raise UsageError(f"{weights} has {len(extra)} tensor(s) its config does not describe, first {extra[0]}")
    return index


def stored_state(state: dict[str, Any], config: LMConfig) -> dict[str, Any]:
    """The tensors a checkpoint stores: the state dict, without lm_head.weight when it is the
    embedding matrix (tie_word_embeddings: safetensors stores no aliases)."""
    if config.tie_word_embeddings:
        return {name: t for name, t in state.items() if name != "lm_head.weight"}
    return dict(state)


def is_lm_checkpoint(directory: str | Path) -> bool:
    """Whether directory holds a language-model checkpoint (its config.json says this format);
    commands taking layer and model checkpoints alike dispatch on it."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        return False
    header = read_json(path, CheckpointError)
    return isinstance(header, dict) and header.get("format") == FORMAT


def read_lm_header(directory: str | Path) -> dict[str, Any]:
    """config.json of a model checkpoint, checked; "config" and "tokenizer" parsed."""
    directory = Path(directory)
    if not directory.exists():
        raise CheckpointError(
            f"no model checkpoint at {directory}: it does not exist "
            "(the shipped one is deamoe_trt/lm/data/tiny-lm; make one with `deamoe-trt train-tiny`)"
        )
    if not directory.is_dir():
        raise CheckpointError(f"no model checkpoint at {directory}: not a directory (config.json + model.safetensors)")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; is it a deamoe-trt model checkpoint?")
    header = read_json(path, CheckpointError)
    if isinstance(header, dict) and header.get("format") == LAYER_FORMAT:
        raise CheckpointError(
            f"{directory} is a DeaMoE layer checkpoint, not a language model; "
            f"this needs a {FORMAT} checkpoint such as deamoe_trt/lm/data/tiny-lm"
        )
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f'{path} is not a deamoe-trt model checkpoint config (no "format": "{FORMAT}")')
    check_version(header, path, FORMAT_VERSION)
    check_dtype(header, path)
    try:
        header["config"] = LMConfig.from_dict(header.get("config"))
        header["tokenizer"] = tokenizer_from_dict(header.get("tokenizer"), directory)
    except (ValueError, TypeError, UsageError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    check_layer_count(directory / WEIGHTS_FILE, header["config"].num_layers, path)
    if isinstance(header["tokenizer"], ByteTokenizer) and header["tokenizer"].vocab_size != header["config"].vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer vocab_size {header['tokenizer'].vocab_size} differs from the model's "
            f"{header['config'].vocab_size}"
        )
    return header


def read_lm_tensors(directory: str | Path, header: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """The state dict stored in directory (header: read_lm_header's), each tensor checked against
    expected (stored_state of a model built from the header's config, on the meta device)."""
    weights = Path(directory) / WEIGHTS_FILE
    tensors = read_tensors(weights)
    check_tensors(tensors, expected, header["dtype"], weights)
    # Router biases are float32 (older checkpoints hold them in the model's dtype).
    tensors = {name: t.float() if name.endswith(ROUTER_BIAS) else t for name, t in tensors.items()}
    if header["config"].tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["embed_tokens.weight"]
    return tensors
