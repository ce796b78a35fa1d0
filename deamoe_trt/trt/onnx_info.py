"""What a build needs to know about an ONNX file before TensorRT parses it, read cheaply.

A model under 2 GB keeps its weights inside the .onnx file, so `onnx.load` would read all
of them (and hold them twice while TensorRT parses the same file) only to learn three
strings. `read_metadata` instead walks the top-level protobuf fields of ModelProto and
seeks past the graph, reading only metadata_props: constant time and memory, which
matters on an 8 GB Orin Nano.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..errors import UsageError

_GRAPH_FIELD = 7  # ModelProto.graph
_METADATA_FIELD = 14  # ModelProto.metadata_props
_PREFIX = "deamoe_trt."


@dataclass(frozen=True)
class ModelFacts:
    """The deamoe-trt export metadata a build uses; all None for a model from elsewhere."""

    form: str | None = None  # plugin | ort | onnx
    dtype: str | None = None  # fp32 | fp16 | bf16
    max_tokens: int | None = None
    has_graph: bool = True

    @property
    def is_export(self) -> bool:
        return self.form is not None


def _varint(f: io.BufferedReader) -> int | None:
    shift = result = 0
    while True:
        byte = f.read(1)
        if not byte:
            return None if shift == 0 else _truncated()
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise UsageError("not an ONNX model: malformed protobuf varint")


def _truncated():
    raise UsageError("not a complete ONNX model (truncated protobuf)")


def read_metadata(path: str | Path) -> dict[str, str]:
    """metadata_props of the ONNX model at path (plus "__has_graph__"), without reading its graph."""
    path = Path(path)
    meta: dict[str, str] = {}
    has_graph = False
    try:
        with path.open("rb") as f:
            while True:
                key = _varint(f)
                if key is None:
                    break
                field, wire = key >> 3, key & 7
                if wire == 0:
                    if _varint(f) is None:
                        _truncated()
                elif wire == 1:
                    f.seek(8, io.SEEK_CUR)
                elif wire == 5:
                    f.seek(4, io.SEEK_CUR)
                elif wire == 2:
                    length = _varint(f)
                    if length is None:
                        _truncated()
                    if field == _METADATA_FIELD:
                        entry = onnx.StringStringEntryProto()
                        data = f.read(length)
                        if len(data) != length:
                            _truncated()
                        entry.ParseFromString(data)
                        meta[entry.key] = entry.value
                    else:
                        has_graph = has_graph or field == _GRAPH_FIELD
                        f.seek(length, io.SEEK_CUR)
                else:
                    raise UsageError(f"{path} is not an ONNX model (protobuf wire type {wire})")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except Exception as exc:  # a protobuf DecodeError from a damaged metadata entry
        if isinstance(exc, UsageError):
            raise UsageError(f"{path}: {exc}") from None
        raise UsageError(f"{path} is not a readable ONNX model: {type(exc).__name__}: {exc}") from None
    meta["__has_graph__"] = "1" if has_graph else ""
    return meta


def model_facts(path: str | Path) -> ModelFacts:
    """The export facts of the model at path (see deamoe_trt/export/metadata.py for the keys)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a directory, not an ONNX model file (export one with `deamoe-trt export`)")
    if not path.is_file():
        raise UsageError(f"no model file at {path}")
    meta = read_metadata(path)
    text = meta.get(_PREFIX + "max_tokens")
    max_tokens: int | None
    try:
        max_tokens = int(text) if text else None
    except ValueError:
        max_tokens = None
    return ModelFacts(
        form=meta.get(_PREFIX + "form"),
        dtype=meta.get(_PREFIX + "dtype"),
        max_tokens=max_tokens,
        has_graph=bool(meta["__has_graph__"]),
    )
