"""ONNX Runtime sessions for deamoe-trt exports: the one way validation and tests open a model."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import onnx

from ..errors import MissingDependencyError, UsageError, one_line
from ..export import save as export_save
from ..export.metadata import load_model
from .plugin_op import for_reference, has_plugin_nodes, register_reference_ops

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


MATMULNBITS_ACCURACY = "session.qdq_matmulnbits_accuracy_level"


def session_options(threads: int | None = None, *, spinning: bool | None = None):
    """onnxruntime.SessionOptions as deamoe-trt uses them.

    threads: that many intra-op threads and one inter-op thread (default: ONNX Runtime's
    choice); spinning: whether idle intra-op threads spin (default: ONNX Runtime's).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: ORT's warnings about folded initializers are noise here
    # ONNX Runtime fuses DequantizeLinear -> MatMul (an LM's quantized projections) into MatMulNBits
    # and by default (4) runs it with int8 activations; 1 keeps them float32, as the graph computes.
    options.add_session_config_entry(MATMULNBITS_ACCURACY, "1")
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def make_session(model: str | Path | onnx.ModelProto, provider: str = "cpu", *, options=None):
    """An onnxruntime.InferenceSession for model (a path or a ModelProto) on provider.

    A ModelProto too large for one protobuf message is opened from a temporary copy with
    external data (and left as it was).

    The one way deamoe-trt opens a model on ONNX Runtime (validation, the LM, the bench).
    Plugin-form models run their DeaMoE nodes through the PyTorch reference op
    (plugin_op.for_reference); other forms run as written. A model whose weights sit in
    external data is opened from beside its file, so the data resolves as it does for users.
    options: from session_options() (default: session_options()).
    """
    import onnxruntime as ort

    providers = _providers(provider, ort.get_available_providers())
    options = options if options is not None else session_options()
    if isinstance(model, onnx.ModelProto) and _too_large_to_serialise(model):
        # Protobuf cannot serialise 2 GiB or more, so a model built in memory (generate and
        # bench-lm export on the fly) at that size is opened as users open it: written with
        # external data to a temporary directory. ONNX Runtime has read the weights once the
        # session exists, so the files can go, after the caller's model gets its weights back.
        with tempfile.TemporaryDirectory(prefix="deamoe-trt-session-") as tmp:
            path = export_save.save_model(model, Path(tmp) / "model.onnx")
            try:
                return make_session(path, provider, options=options)
            finally:
                onnx.external_data_helper.load_external_data_for_model(model, tmp)
    where = str(model) if not isinstance(model, onnx.ModelProto) else "the model"
    proto = model if isinstance(model, onnx.ModelProto) else load_model(model)
    try:
        if not has_plugin_nodes(proto):
            source = proto.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
            return ort.InferenceSession(source, options, providers=providers)
        rewritten = for_reference(proto)
        options.register_custom_ops_library(register_reference_ops())
        if isinstance(model, onnx.ModelProto) or not _has_external_data(proto):
            return ort.InferenceSession(rewritten.SerializeToString(), options, providers=providers)
        with _beside(Path(model), rewritten) as path:
            return ort.InferenceSession(str(path), options, providers=providers)
    except (UsageError, MissingDependencyError):
        raise
    except Exception as exc:
        raise UsageError(f"ONNX Runtime cannot load {where}: {one_line(exc, limit=500)}") from None


def _providers(provider: str, available: list[str]) -> list[str]:
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r}; choose one of: {', '.join(PROVIDERS)}")
    wanted = PROVIDERS[provider]
    if wanted[0] not in available:
        raise MissingDependencyError(
            f"this onnxruntime has no {wanted[0]} (it has {', '.join(available)}); "
            "for cuda install onnxruntime-gpu on a machine with a CUDA GPU"
        )
    return wanted


def _too_large_to_serialise(model: onnx.ModelProto) -> bool:
    """Whether model's weights pass the size at which exports move them to external data."""
    return export_save.initializer_bytes(model) > export_save.EXTERNAL_DATA_THRESHOLD


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


@contextlib.contextmanager
def _beside(original: Path, model: onnx.ModelProto):
    """model written as a hidden temporary file next to original (for its relative external data)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{original.name}.", suffix=".reference.onnx", dir=original.parent)
    os.close(fd)
    try:
        Path(tmp).write_bytes(model.SerializeToString())
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)
