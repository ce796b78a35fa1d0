"""Writing a model file: whole or not at all, weights beside it once it would pass protobuf's 2 GB."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import onnx

from .._io import atomic_path
from ..errors import UsageError

# Protobuf cannot serialise a message of 2 GiB or more; keep 64 MiB for the graph itself.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26
# Tensors this small stay inside the model even when the rest goes out (constants, biases).
MIN_EXTERNAL_TENSOR = 1024
# Large tensors start on 64 KiB boundaries so runtimes can memory-map them (onnx's default).
ALIGN_THRESHOLD, ALIGNMENT = 2**20, 2**16


def data_path(path: Path) -> Path:
    """Where the external weights of the model at path go: <model file name>.data beside it."""
    return path.with_name(path.name + ".data")


def initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save_model(
    model: onnx.ModelProto, path: str | Path, *, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD
) -> Path:
    """Write model to path; if its weights pass external_data_threshold bytes, they go to path.data.

    Both files appear whole or not at all: the data file lands first, the model (which names
    it) last. The model's large initializers are moved out in place (model is modified).
    A stale path.data from an earlier export is removed when the new model needs none.
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write the model to {path}: it is a directory")
    external = initializer_bytes(model) > external_data_threshold
    data = data_path(path)
    with atomic_path(path) as model_tmp:
        if external:
            with atomic_path(data) as data_tmp:
                _move_out(model, data_tmp, data.name)
                _write(model, model_tmp)
        else:
            _write(model, model_tmp)
    if not external:
        data.unlink(missing_ok=True)
    return path


class ExternalData:
    """A model's data file written as its initializers are made: add(tensor, raw) appends a
    large tensor's bytes (64 KiB-aligned past 1 MiB) and points it at location, a small one
    keeps them as raw_data. The one layout of save_model's data files, whether moved out at
    the end (take) or streamed (GraphBuilder(external=...))."""

    def __init__(self, f: BinaryIO, location: str):
        self.f, self.location = f, location
        self.initializer_bytes = 0  # of every tensor added, moved out or not (initializer_bytes)

    def add(self, tensor: onnx.TensorProto, raw: bytes) -> None:
        """tensor's bytes: to the file, never into the proto (whose arena would keep them
        after ClearField), or, when small, into raw_data."""
        self.initializer_bytes += len(raw)
        if len(raw) < MIN_EXTERNAL_TENSOR:
            tensor.raw_data = raw
            return
        if len(raw) >= ALIGN_THRESHOLD:
            self.f.seek(-self.f.tell() % ALIGNMENT, 1)
        offset = self.f.tell()
        self.f.write(raw)
        # onnx.external_data_helper.set_external_data's entries; it insists on raw_data being set.
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset), ("length", len(raw))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)

    def take(self, tensor: onnx.TensorProto) -> None:
        """add() for a tensor already holding its bytes: large ones move out."""
        raw = tensor.raw_data
        if len(raw) >= MIN_EXTERNAL_TENSOR:
            tensor.ClearField("raw_data")
        self.add(tensor, raw)


def save_model_streamed(
    build: Callable[[ExternalData], onnx.ModelProto],
    path: str | Path,
    *,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> Path:
    """save_model(build(...), path) without holding the weights: build gets the ExternalData
    its initializers go to as they are made (GraphBuilder(external=...)). The files are
    save_model's, byte for byte: a model whose initializers stay under the threshold gets
    them back inline and no data file. Whole or not at all, the data file first."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write the model to {path}: it is a directory")
    data = data_path(path)
    with atomic_path(path) as model_tmp, atomic_path(data) as data_tmp:
        with data_tmp.open("w+b") as f:
            external = ExternalData(f, data.name)
            model = build(external)
            inline = external.initializer_bytes <= external_data_threshold
            if inline:
                for tensor in model.graph.initializer:
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        _bring_back(tensor, f)
        if inline:
            data_tmp.write_bytes(b"")  # not needed: the model holds its weights (removed below)
        _write(model, model_tmp)
    if inline:
        data.unlink(missing_ok=True)
    return path


def _bring_back(tensor: onnx.TensorProto, f: BinaryIO) -> None:
    """tensor's bytes from the data file f back into raw_data, as if never moved out."""
    where = {entry.key: entry.value for entry in tensor.external_data}
    f.seek(int(where["offset"]))
    tensor.raw_data = f.read(int(where["length"]))
    tensor.ClearField("external_data")
    tensor.ClearField("data_location")


def _move_out(model: onnx.ModelProto, data_file: Path, location: str) -> None:
    """Append large initializers' bytes to data_file and point the tensors at location."""
    with data_file.open("wb") as f:
        external = ExternalData(f, location)
        for tensor in model.graph.initializer:
            external.take(tensor)


def _write(model: onnx.ModelProto, path: Path) -> None:
    try:
        path.write_bytes(model.SerializeToString())
    except ValueError as exc:  # protobuf's own limit, should the threshold be set above it
        raise UsageError(
            f"the model is too large for one protobuf file ({exc}); lower the external data threshold"
        ) from None
