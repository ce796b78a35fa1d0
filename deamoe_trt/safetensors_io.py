"""Safetensors read and written tensor by tensor, so a model bigger than memory can be converted.

Reading: a (possibly sharded) Hugging Face checkpoint is indexed from its
model.safetensors.index.json, or from the headers of its *.safetensors files; shapes, dtypes
and byte ranges come from the headers, so every tensor can be checked before any data is
read. Each tensor is then read with plain file reads into a buffer of its own, not through
a memory map: pages of a mapped shard that the conversion touches count in the process's
resident set until the map closes (measured: the whole block's shard pages), while read()
leaves them in the page cache only.

Writing: the header of a safetensors file lists every tensor's dtype, shape and byte range,
all known from the config before any weight is converted; the data is then appended in
header order, a tensor at a time or a slice at a time (an expert's rows), so the writer
holds no more than the piece it is given.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import BinaryIO

import torch

from .errors import UsageError

# safetensors dtype names <-> torch dtypes, for the dtypes a model's weights can have.
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
# Dtypes of packed (quantized) source tensors that an importer decodes itself, e.g. MXFP4 blocks.
RAW_DTYPES = {"U8": torch.uint8}
_WRITE_NAMES = {**ST_NAMES, **{v: k for k, v in RAW_DTYPES.items()}}
INDEX_FILE = "model.safetensors.index.json"
# The order safetensors.torch.save_file lays tensors out in: by dtype, widest first (this
# order), then by name. A StreamingWriter given a schema in this order writes save_file's bytes.
_SAVE_FILE_DTYPE_ORDER = ("F64", "F32", "BF16", "F16", "U8")


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    start: int = 0  # byte range in the file
    end: int = 0


def read_header(path: Path) -> dict:
    """The JSON header of a safetensors file (no tensor data read); each entry gets "start" and
    "end", its byte range in the file."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than its 8-byte header length")
            (size,) = struct.unpack("<Q", raw)
            if size > 100_000_000:
                raise ValueError(f"header length {size} is implausible")
            header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a readable safetensors file: {exc}") from None
    header.pop("__metadata__", None)
    try:
        for entry in header.values():
            begin, stop = (int(n) for n in entry["data_offsets"])
            entry["start"], entry["end"] = 8 + size + begin, 8 + size + stop
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UsageError(f"{path} has a malformed safetensors header (data_offsets)") from None
    end = max((v["end"] for v in header.values()), default=0)
    if path.stat().st_size < end:
        raise UsageError(f"{path} is truncated: its header describes {end} bytes, the file has {path.stat().st_size}")
    return header


def index_checkpoint(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of the model in model_dir: name -> (file, dtype, shape).

    With an index file, every shard it names must exist and hold exactly the tensors it
    assigns to it; without one, the *.safetensors files are read and must not repeat names.
    """
    index_path = model_dir / INDEX_FILE
    files = sorted(model_dir.glob("*.safetensors"))
    tensors: dict[str, TensorInfo] = {}
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{index_path} is not a valid safetensors index: {exc}") from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise UsageError(
                f"{model_dir} is missing shard {missing[0]} named by {INDEX_FILE} "
                f"({len(missing)} of {len(shards)} shards missing); download the whole model"
            )
        for shard in shards:
            header = read_header(model_dir / shard)
            wanted = {name for name, file in weight_map.items() if file == shard}
            absent = sorted(wanted - set(header))
            if absent:
                raise UsageError(
                    f"shard {shard} lacks {absent[0]}, which {INDEX_FILE} says it holds "
                    "(shards from different versions of the model?)"
                )
            for name in sorted(wanted):
                tensors[name] = _info(model_dir / shard, name, header[name])
        return tensors
    for path in files:
        for name, entry in read_header(path).items():
            if name in tensors:
                raise UsageError(
                    f"{name} is in both {tensors[name].file.name} and {path.name}, and {model_dir} has no "
                    f"{INDEX_FILE} saying which to use"
                )
            tensors[name] = _info(path, name, entry)
    return tensors


def _info(path: Path, name: str, entry: dict) -> TensorInfo:
    try:
        return TensorInfo(
            path, str(entry["dtype"]), tuple(int(n) for n in entry["shape"]), entry["start"], entry["end"]
        )
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: the header entry of {name} is malformed") from None


class ShardReader:
    """Reads named tensors with plain reads (see the module docstring); files stay open until close()."""

    def __init__(self, index: dict[str, TensorInfo]):
        self.index = index
        self._open: dict[Path, FileIO] = {}

    def get(self, name: str) -> torch.Tensor:
        info = self.index[name]
        dtype = ST_DTYPES.get(info.dtype) or RAW_DTYPES[info.dtype]
        count = 1
        for n in info.shape:
            count *= n
        if count * dtype.itemsize != info.end - info.start:
            raise UsageError(f"{name} in {info.file} has {info.end - info.start} bytes for shape {list(info.shape)}")
        out = torch.empty(count, dtype=dtype)
        try:
            f = self._open.get(info.file)
            if f is None:
                f = self._open[info.file] = info.file.open("rb", buffering=0)
            f.seek(info.start)
            view = memoryview(out.view(torch.uint8).numpy())
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise OSError("unexpected end of file")
                done += got
        except OSError as exc:
            raise UsageError(f"cannot read {name} from {info.file}: {exc}") from None
        return out.reshape(info.shape)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def save_file_order(
    schema: dict[str, tuple[tuple[int, ...], torch.dtype]],
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """schema reordered as safetensors.torch.save_file orders the same tensors."""
    rank = {name: i for i, name in enumerate(_SAVE_FILE_DTYPE_ORDER)}
    return dict(sorted(schema.items(), key=lambda item: (rank[_WRITE_NAMES[item[1][1]]], item[0])))


class StreamingWriter:
    """A safetensors file written in header order: begin(name), append(pieces), ... ."""

    def __init__(self, f: BinaryIO, schema: dict[str, tuple[tuple[int, ...], torch.dtype]], metadata=None):
        self.f = f
        self.schema = schema
        self._order = list(schema)
        self._sizes = {}
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for name, (shape, dtype) in schema.items():
            size = dtype.itemsize
            for n in shape:
                size *= n
            header[name] = {"dtype": _WRITE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self._sizes[name] = size
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        self._next = 0
        self._current: str | None = None
        self._written = 0

    def begin(self, name: str) -> None:
        self._finish_current()
        if self._next >= len(self._order) or self._order[self._next] != name:
            expected = self._order[self._next] if self._next < len(self._order) else "nothing"
            raise AssertionError(f"writer expected {expected}, got {name}")
        self._current, self._written = name, 0
        self._next += 1

    def append(self, piece: torch.Tensor) -> None:
        current = self._current
        if current is None:
            raise AssertionError("writer got data before begin(name)")
        shape, dtype = self.schema[current]
        data = piece.detach().to("cpu", dtype).contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy()  # a view: written without another copy
        self._written += raw.nbytes
        if self._written > self._sizes[current]:
            raise AssertionError(f"{current}: more data than its shape {list(shape)}")
        self.f.write(memoryview(raw))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        self.begin(name)
        self.append(tensor)

    def skip(self, names: list[str]) -> None:
        """Move past names, the next ones in order, whose bytes the file already holds (what a
        killed run finished): the file position moves on by their sizes, nothing is written."""
        self._finish_current()
        for name in names:
            if self._next >= len(self._order) or self._order[self._next] != name:
                raise AssertionError(f"writer cannot skip {name} here")
            self.f.seek(self._sizes[name], 1)
            self._next += 1

    def _finish_current(self) -> None:
        if self._current is not None and self._written != self._sizes[self._current]:
            raise AssertionError(f"{self._current}: wrote {self._written} of {self._sizes[self._current]} bytes")
        self._current = None

    def close(self) -> None:
        self._finish_current()
        if self._next != len(self._order):
            raise AssertionError(f"writer closed before {self._order[self._next]}")
