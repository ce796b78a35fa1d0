"""What an exported model says about itself (metadata_props), and reading it back from a file.

Keys written by build_model (all strings):
  deamoe_trt.format      "deamoe-trt-onnx"; deamoe_trt.format_version "1"
  deamoe_trt.form        plugin | ort | onnx
  deamoe_trt.dtype       fp32 | fp16 | bf16
  deamoe_trt.module      layer (output = layer(x)) | stack (x <- x + layer(x) per layer)
  deamoe_trt.layers      checkpoint indices of the exported layers, e.g. "0,1"
  deamoe_trt.config      the layers' DeaMoEConfig as JSON
  deamoe_trt.max_tokens  the largest T the deployment runs (for TensorRT profiles), if given
  deamoe_trt.ort_routing graph | moe-op (ort form: spec routing in ONNX ops, or MoE's own)
  deamoe_trt.quantization e.g. "int4-g64": FFN weights quantized so (quantized checkpoints only)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..config import DeaMoEConfig
from ..errors import UsageError, one_line
from .dtypes import DTYPES

PREFIX = "deamoe_trt."
FORMAT = "deamoe-trt-onnx"
FORMAT_VERSION = "1"
INPUT_NAME = "hidden_states"
OUTPUT_NAME = "output"


@dataclass(frozen=True)
class ExportInfo:
    form: str
    dtype: str
    module: str  # "layer" or "stack"
    layers: tuple[int, ...]
    config: DeaMoEConfig
    max_tokens: int | None = None
    ort_routing: str | None = None
    quantization: str | None = None  # quantization_tag of the exported checkpoint

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def to_metadata(self) -> dict[str, str]:
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "form": self.form,
            "dtype": self.dtype,
            "module": self.module,
            "layers": ",".join(str(i) for i in self.layers),
            "config": json.dumps(self.config.to_dict(), sort_keys=True),
        }
        if self.max_tokens is not None:
            meta["max_tokens"] = str(self.max_tokens)
        if self.ort_routing is not None:
            meta["ort_routing"] = self.ort_routing
        if self.quantization is not None:
            meta["quantization"] = self.quantization
        return {PREFIX + key: value for key, value in meta.items()}


def export_format(model: onnx.ModelProto) -> str | None:
    """The deamoe_trt.format a model's metadata names (this module's FORMAT for layers and
    stacks, another for other exports), or None."""
    return next((p.value for p in model.metadata_props if p.key == PREFIX + "format"), None)


def export_info(model: onnx.ModelProto, where: str = "the model") -> ExportInfo:
    """The ExportInfo a deamoe-trt export carries; UsageError saying what the model is otherwise."""
    props = {p.key: p.value for p in model.metadata_props}
    if props.get(PREFIX + "format") != FORMAT:
        raise UsageError(f"{where} is an ONNX model but not a deamoe-trt export: {describe(model)}")
    return info_from_metadata(props, where)


def info_from_metadata(props: dict[str, str], where: str) -> ExportInfo:
    """The ExportInfo of a layer/stack export's metadata_props (key -> value)."""
    meta = {key[len(PREFIX) :]: value for key, value in props.items() if key.startswith(PREFIX)}
    if meta.get("format") != FORMAT:
        raise UsageError(f"{where} does not describe a deamoe-trt layer or stack export")
    if meta.get("format_version") != FORMAT_VERSION:
        raise UsageError(
            f"{where} is a deamoe-trt export of format_version {meta.get('format_version')!r}; "
            f"this deamoe-trt reads {FORMAT_VERSION}"
        )
    try:
        config = DeaMoEConfig.from_json(meta.get("config", ""))
        layers = tuple(int(i) for i in meta["layers"].split(","))
        max_tokens = int(meta["max_tokens"]) if "max_tokens" in meta else None
        info = ExportInfo(
            form=meta["form"],
            dtype=meta["dtype"],
            module=meta["module"],
            layers=layers,
            config=config,
            max_tokens=max_tokens,
            ort_routing=meta.get("ort_routing"),
            quantization=meta.get("quantization"),
        )
    except (KeyError, ValueError) as exc:
        raise UsageError(f"{where} has damaged deamoe_trt metadata ({type(exc).__name__}: {exc})") from None
    if info.form not in ("plugin", "ort", "onnx") or info.dtype not in DTYPES or info.module not in ("layer", "stack"):
        raise UsageError(
            f"{where} has deamoe_trt metadata this deamoe-trt does not know: {info.form}/{info.dtype}/{info.module}"
        )
    return info


# A TensorRT engine cannot carry metadata_props; `deamoe-trt build` writes its model's
# deamoe_trt.* metadata as JSON beside the engine, so validation knows what the engine holds.
ENGINE_METADATA_SUFFIX = ".deamoe.json"


def engine_metadata_path(engine: str | Path) -> Path:
    engine = Path(engine)
    return engine.with_name(engine.name + ENGINE_METADATA_SUFFIX)


def write_engine_metadata(engine: str | Path, props: dict[str, str]) -> Path | None:
    """Write the deamoe_trt.* entries of props beside engine (atomically); with none, remove a
    stale file of an earlier build instead. Returns the path written, if any."""
    from .._io import atomic_write_text

    path = engine_metadata_path(engine)
    ours = {key: value for key, value in props.items() if key.startswith(PREFIX)}
    if not ours:
        path.unlink(missing_ok=True)
        return None
    atomic_write_text(path, json.dumps(ours, indent=1, sort_keys=True) + "\n")
    return path


def engine_info(engine: str | Path) -> ExportInfo | None:
    """The ExportInfo of the model engine was built from, when its build wrote one beside it."""
    path = engine_metadata_path(engine)
    if not path.is_file():
        return None
    from .._io import read_json

    props = read_json(path)
    if not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values()):
        raise UsageError(f"{path} is not deamoe-trt engine metadata; rebuild the engine or delete it")
    return info_from_metadata(props, str(path))


def quantization_tag(quant) -> str | None:
    """ "int4-g64" for a QuantConfig of 4 bits and group size 64; None for float weights."""
    return None if quant is None else f"int{quant.bits}-g{quant.group_size}"


def describe(model: onnx.ModelProto) -> str:
    """One phrase on what an ONNX model is: producer, inputs and its most common ops."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1])[:4]) or "no nodes"
    producer = model.producer_name or "an unknown producer"
    inputs = ", ".join(i.name for i in model.graph.input[:3]) or "none"
    return f"made by {producer}, inputs {inputs}, {len(model.graph.node)} node(s) ({ops})"


def load_model(path: str | Path) -> onnx.ModelProto:
    """The ONNX model at path, without its external data; one-line UsageError for anything else."""
    path = Path(path)
    if path.is_dir():
        hint = (
            " (a deamoe-trt checkpoint: export it with `deamoe-trt export`)" if (path / "config.json").is_file() else ""
        )
        raise UsageError(f"{path} is a directory, not an ONNX model file{hint}")
    if not path.is_file():
        raise UsageError(f"no model file at {path}")
    with path.open("rb") as f:
        head = f.read(64)
    kind = _sniff(head)
    if kind:
        raise UsageError(f"{path} is not an ONNX model: it looks like {kind}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        reason = one_line(exc, first=True)
        raise UsageError(f"{path} is not a readable ONNX model (truncated or corrupt?): {reason}") from None
    if not model.HasField("graph") or not model.opset_import:
        # A protobuf cut at a field boundary still parses, minus what came after the cut.
        raise UsageError(f"{path} is not a complete ONNX model (no graph or opset imports: truncated?)")
    return model


def _sniff(head: bytes) -> str | None:
    """Name the file types people mistake for ONNX models (whose first byte is a protobuf tag, 0x08)."""
    stripped = head.lstrip()
    if len(head) >= 8 and int.from_bytes(head[:8], "little") < 100_000_000 and head[8:9] == b"{":
        return "a safetensors file (weights, not a model; export the checkpoint directory)"
    if stripped[:1] in (b"{", b"["):
        return "JSON text"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive (a PyTorch .pt/.pth file?)"
    if head[:2] == b"\x80\x02" or head[:1] == b"\x80":
        return "a Python pickle"
    if not head:
        return "an empty file"
    if all(32 <= c < 127 or c in b"\t\r\n" for c in head):
        return "text"
    return None
