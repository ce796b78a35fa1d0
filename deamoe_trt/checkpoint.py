"""Layer and stack checkpoints: a directory with config.json and model.safetensors. Never pickle.

config.json:  {"format": "deamoe-trt", "format_version": 1, "num_layers": L,
               "dtype": "float32", "router_dtype": "float32",
               "config": {DeaMoEConfig fields}, "source": {...},
               "quantization": {"bits": 4, "group_size": 64, ...} (quantized checkpoints only)}
model.safetensors: for each layer i, the spec's canonical tensors as "layers.{i}.<name>";
in a quantized checkpoint each FFN weight <name> is "<name>.qweight" (uint8 codes) and
"<name>.scales" (deamoe_trt.quant, docs/quantization.md).

This module is the file format only (tensors, headers, checks): it never imports the layer.
DeaMoELayer/DeaMoEStack.save_pretrained and from_pretrained (layer.py) build on it; the
language-model format (lm/checkpoint_format.py) reuses its writers and checks; a directory of
either is read by deamoe_trt.lm.checkpoint.read, which says which artifact it holds.

"dtype" is the FFN weights' dtype; "router_dtype" the router weight's, written only when it
differs (absent: the same as "dtype"). router.bias is float32; checkpoints written before
the router kept its own precision hold it in "dtype", and load upcast (losslessly).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from . import dtypes
from ._io import atomic_path, atomic_write_text, read_json
from .config import DeaMoEConfig
from .errors import CheckpointError, UsageError, one_line
from .quant import QuantConfig

FORMAT = "deamoe-trt"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DTYPES = {d.long_name: d.torch for d in dtypes.DTYPES}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # any dtype: a corrupt file may hold int64


def stack_header(
    config: DeaMoEConfig,
    num_layers: int,
    dtype: torch.dtype,
    router_dtype: torch.dtype,
    quant: QuantConfig | None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json of a layer checkpoint (router_dtype written only when it differs)."""
    header: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "num_layers": num_layers,
        "dtype": dtype_name(dtype),
        "config": config.to_dict(),
    }
    if router_dtype != dtype:
        header["router_dtype"] = dtype_name(router_dtype)
    if source:
        header["source"] = source
    if quant is not None:
        header["quantization"] = quant.to_dict()
    return header


def layer_tensors(tensors: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """Layer index's tensors under their state_dict names; a legacy router.bias upcast to float32."""
    prefix = f"layers.{index}."
    return {
        name[len(prefix) :]: t.float() if name.endswith(ROUTER_BIAS) else t
        for name, t in tensors.items()
        if name.startswith(prefix)
    }


def write_files(directory: str | Path, tensors: dict[str, torch.Tensor], header: dict[str, Any]) -> Path:
    """model.safetensors and config.json into directory (layer and language-model checkpoints).

    Weights first, config last: a config.json only ever describes weights already in place."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"cannot write a checkpoint to {directory}: it exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    atomic_write_text(directory / CONFIG_FILE, json.dumps(header, indent=2) + "\n")
    return directory


def write_files_streamed(
    directory: str | Path,
    schema: dict[str, tuple[tuple[int, ...], torch.dtype]],
    tensor: Callable[[str], torch.Tensor],
    header: dict[str, Any],
) -> Path:
    """write_files for a checkpoint too large to hold: tensor(name) makes each tensor of
    schema (name -> shape, dtype) when its turn comes, in save_file's order, so the files are
    write_files' bytes while only one tensor is held. Weights first, config last."""
    from .safetensors_io import StreamingWriter, save_file_order

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"cannot write a checkpoint to {directory}: it exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / WEIGHTS_FILE) as tmp, tmp.open("wb") as f:
        writer = StreamingWriter(f, save_file_order(schema), metadata={"format": "pt"})
        for name in writer.schema:
            writer.write(name, tensor(name))
        writer.close()
    atomic_write_text(directory / CONFIG_FILE, json.dumps(header, indent=2) + "\n")
    return directory


def read_header(directory: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint, checked; the layer config parsed under "config"."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no checkpoint at {directory}: not a directory (make one with `deamoe-trt init`)")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory} has no {CONFIG_FILE}; is it a deamoe-trt checkpoint?")
    header = read_json(path, CheckpointError)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f'{path} is not a deamoe-trt checkpoint config (no "format": "{FORMAT}")')
    check_version(header, path, FORMAT_VERSION)
    num_layers = header.get("num_layers")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise CheckpointError(f"{path}: num_layers must be an integer >= 1, got {num_layers!r}")
    check_layer_count(directory / WEIGHTS_FILE, num_layers, path)
    check_dtype(header, path)
    header.setdefault("router_dtype", header["dtype"])
    if header["router_dtype"] not in ("float32", header["dtype"]):
        raise CheckpointError(
            f"{path}: router_dtype must be float32 or {header['dtype']}, got {header['router_dtype']!r}"
        )
    try:
        header["config"] = DeaMoEConfig.from_dict(header.get("config"))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if "quantization" in header:
        try:
            header["quantization"] = QuantConfig.from_dict(header["quantization"])
        except UsageError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
    else:
        header["quantization"] = None
    return header


def check_version(header: dict[str, Any], path: Path, version: int) -> None:
    """A CheckpointError unless config.json (path) has the format_version this release reads."""
    if header.get("format_version") != version:
        raise CheckpointError(
            f"{path} has format_version {header.get('format_version')!r}; this deamoe-trt reads {version}"
        )


def check_dtype(header: dict[str, Any], path: Path) -> None:
    """A CheckpointError unless config.json (path) names one of the weight dtypes."""
    if header.get("dtype") not in DTYPES:
        raise CheckpointError(f"{path}: dtype must be one of {', '.join(DTYPES)}, got {header.get('dtype')!r}")


ROUTER_BIAS = "router.bias"


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], dtype: str, path: Path) -> None:
    """Every expected tensor present with its shape and dtype, nothing else, all finite.

    Expected dtypes are the config's, except a quantized checkpoint's codes (uint8) and the
    router's (router_dtype; router.bias float32, or the checkpoint's dtype in checkpoints
    written before it was always float32)."""
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{path} lacks {len(missing)} tensor(s) its config needs, first {missing[0]}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{path} has {len(unexpected)} tensor(s) its config does not describe, first {unexpected[0]}"
        )
    for name, want in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"{name} has shape {list(got.shape)} but its config needs {list(want.shape)} ({path})"
            )
        legacy_bias = name.endswith(ROUTER_BIAS) and got.dtype == DTYPES[dtype]
        if got.dtype != want.dtype and not legacy_bias:
            reason = "quantized codes are" if want.dtype == torch.uint8 else "config.json says"
            raise CheckpointError(f"{name} is {dtype_name(got.dtype)} but {reason} {dtype_name(want.dtype)}")
        if not bool(torch.isfinite(got).all()):
            raise CheckpointError(f"{name} contains NaN or Inf ({path})")


def check_layer_count(weights: Path, num_layers: int, config_path: Path) -> None:
    """A CheckpointError when config_path claims more layers than weights holds tensors of,
    found from the safetensors header alone: a claim of a billion layers is refused before
    a model of that size is built, even on the meta device. Nothing is said of a missing or
    unreadable file here; the tensor checks that follow report those in their own words."""
    if not weights.is_file():
        return
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = list(f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return
    held = {name.split(".", 2)[1] for name in names if name.startswith("layers.") and name.count(".") >= 2}
    if num_layers > len(held):
        raise CheckpointError(
            f"{config_path}: num_layers is {num_layers:,} but {weights.name} holds {len(held)} layer(s); "
            "it lacks the tensors of the rest"
        )


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has {CONFIG_FILE} but no {WEIGHTS_FILE}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        reason = one_line(exc, first=True)
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): {reason}") from None
