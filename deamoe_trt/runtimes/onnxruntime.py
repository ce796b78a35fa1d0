"""ONNX Runtime (CPU) as a runtime: a layer's `ort` export form (deamoe_trt.export), one session;
a language model's export (deamoe_trt.export.lm) decoded with its cache fed back each step.

`make_session` here is the one place deamoe-trt opens a model on ONNX Runtime (validation,
the decoders, the benchmarks); `load` and `load_decoder` open an exported file.

The vanilla anchor is the `ort` form of DeaMoELayer.vanilla(): router logits straight into
com.microsoft.MoE, which does its own softmax top-k routing (deamoe_trt/export/ort_form.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..dtypes import BY_NAME, DTYPES
from ..errors import MissingDependencyError, UsageError, one_line
from .base import (
    Capabilities,
    DecoderPool,
    Prepared,
    RuntimeBase,
    SerialBatchDecoder,
    as_numpy,
    load_lm_model,
    state_bytes,
)

if TYPE_CHECKING:
    import onnx

    from ..export.lm import LMExportInfo
    from ..lm.model import DeaMoELM
    from ..lm.tokenizer import Tokenizer

# ONNX Runtime's CPU MoE has no bf16 kernel.
ONNX_DTYPES = {d.torch: d.name for d in DTYPES if d.name != "bf16"}
# Initializers at least this big are handed to ONNX Runtime as in-memory arrays.
_IN_MEMORY_MIN_BYTES = 1 << 16
BUILDER = "deamoe_trt.export.build_model"

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
    (deamoe_trt.validation.plugin_op.for_reference); other forms run as written. A model whose
    weights sit in external data is opened from beside its file, so the data resolves as it
    does for users. options: from session_options() (default: session_options()).
    """
    try:
        import onnx
        import onnxruntime as ort

        from ..export import save as export_save
        from ..export.metadata import load_model
        from ..validation.plugin_op import for_reference, has_plugin_nodes, register_reference_ops
    except ImportError as exc:
        raise MissingDependencyError(f"needs onnx and onnxruntime (pip install onnxruntime): {exc}") from None

    providers = _providers(provider, ort.get_available_providers())
    options = options if options is not None else session_options()
    too_large = isinstance(model, onnx.ModelProto) and (
        export_save.initializer_bytes(model) > export_save.EXTERNAL_DATA_THRESHOLD
    )
    if too_large:
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


def _has_external_data(model: onnx.ModelProto) -> bool:
    import onnx

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


def build_ort_model(layer):
    """The layer's `ort` form as a ModelProto."""
    from ..export import build_model

    dtype = ONNX_DTYPES.get(layer.dtype)
    if dtype is None:
        raise UsageError(f"the ort form runs fp32 or fp16 here, not {layer.dtype}")
    return build_model(layer, "ort", dtype=dtype)


class OrtModel:
    """An ONNX Runtime CPU session and the arrays that hold its weights (kept alive with it)."""

    def __init__(self, session, arrays: dict):
        self.session = session
        self.arrays = arrays
        self.input_name = session.get_inputs()[0].name
        self.output_name = session.get_outputs()[0].name

    def run(self, x):
        return self.session.run([self.output_name], {self.input_name: x})[0]


def in_memory_session(model, threads: int | None, *, spinning: bool | None = False) -> OrtModel:
    """An ONNX Runtime CPU session for model (consumed: its weights are moved out of it).

    The weights reach ONNX Runtime as in-memory initializers (numpy arrays it uses in place),
    not in a serialized model, a measured fix: protobuf cannot hold more than 2 GB, and
    weights saved as external data are memory-mapped from the file, where a host that
    reclaims cold page cache (DAMON pageout, as on this project's CI VMs) drops them and
    steps then read them from disk.
    """
    try:
        import onnx
        import onnxruntime as ort
        from onnx import external_data_helper, numpy_helper
    except ImportError as exc:
        raise MissingDependencyError(f"ONNX Runtime contenders need onnx and onnxruntime: {exc}") from None

    arrays: dict[str, np.ndarray] = {}

    def to_memory(tensor) -> None:
        arrays[tensor.name] = np.ascontiguousarray(numpy_helper.to_array(tensor))
        external_data_helper.set_external_data(tensor, location="deamoe-bench-in-memory")
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL

    # numpy has no 4-bit type to hand ONNX Runtime (quantized LM projections): those stay in the model.
    packed = (onnx.TensorProto.UINT4, onnx.TensorProto.INT4)
    for tensor in model.graph.initializer:
        if (
            tensor.data_location != onnx.TensorProto.EXTERNAL
            and len(tensor.raw_data) >= _IN_MEMORY_MIN_BYTES
            and tensor.data_type not in packed
        ):
            to_memory(tensor)

    # Spinning threads keep a core busy after each run; in an interleaved benchmark they
    # would steal it from the next contender.
    options = session_options(threads, spinning=spinning)
    if arrays:
        names = list(arrays)
        options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(arrays[n]) for n in names])
    return OrtModel(make_session(model, options=options), arrays)


class OnnxRuntime(RuntimeBase):
    name = "ort"
    label = "ONNX Runtime CPU"
    capabilities = Capabilities(
        decoding=True,
        stacks=False,
        dtypes=tuple(ONNX_DTYPES),
        needs=frozenset({"onnxruntime"}),
        files=("checkpoint", "onnx"),
    )

    def available(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            return f"needs onnx and onnxruntime: {exc}"
        return None

    def prepare(self, module, *, dtype=None, device=None, threads=None, spinning: bool = False, **options) -> Prepared:
        """One session over the layer's `ort` form (a stack: not exported as one graph here)."""
        from ..layer import DeaMoEStack

        if isinstance(module, DeaMoEStack):
            raise UsageError(f"{self.label} runs one layer's export; a stack is not exported as one graph")
        self.require()
        module = self.cast(module, dtype)
        model = build_ort_model(module)
        session = in_memory_session(model, threads, spinning=spinning)
        del model
        info = {"builder": BUILDER, "threads": threads, "spinning": spinning, "execution_mode": "sequential"}
        return Prepared(
            self.name,
            session.run,
            to_input=lambda x: x.numpy(),
            to_torch=torch.from_numpy,
            memory_bytes=state_bytes(module),
            info=info,
            keep_alive=session,
        )

    def decoder(
        self,
        model,
        *,
        threads=None,
        twin="deamoe",
        form: str = "ort",
        dtype: str = "fp32",
        tokenizer=None,
        spinning: bool | None = None,
        **options,
    ) -> OrtDecoder:
        """The twin's export (form, dtype) in one session holding its weights in memory
        (in_memory_session); spinning None: ONNX Runtime's default."""
        from ..export.lm import build_lm_model, lm_export_info

        self.require()
        proto = build_lm_model(model.twin(twin), form, dtype, tokenizer=tokenizer, twin=twin)
        info = lm_export_info(proto, directory=getattr(tokenizer, "directory", None))
        session = in_memory_session(proto, threads, spinning=spinning)
        del proto
        decoder = OrtDecoder(session.session, info)
        decoder.keep_alive = session
        return decoder

    def decoder_pool(self, model, *, threads=None, size=1, **options) -> DecoderPool:
        shared = self.decoder(model, threads=threads, **options)
        return DecoderPool(lambda: OrtDecoder(shared.session, shared.info), keep_alive=shared)

    def load(self, path, *, threads=None, spinning: bool | None = None, provider: str = "cpu", **options) -> Prepared:
        """A layer's export (an .onnx file of any form) in one session on provider (PROVIDERS);
        a checkpoint directory as prepare() runs it."""
        if Path(path).is_dir():
            return super().load(path, threads=threads, spinning=spinning, **options)
        self.require()
        session = make_session(path, provider, options=session_options(threads, spinning=spinning))
        first, output = session.get_inputs()[0], session.get_outputs()[0].name
        dtype = np.float16 if first.type == "tensor(float16)" else np.float32

        def run(x: np.ndarray) -> np.ndarray:
            return session.run([output], {first.name: x})[0]

        return Prepared(
            self.name,
            run,
            to_input=lambda x: np.ascontiguousarray(as_numpy(x).astype(dtype)),
            to_torch=torch.from_numpy,
            info={"model": str(path), "threads": threads, "provider": provider},
            keep_alive=session,
        )

    def load_decoder(self, path, *, threads=None, **options) -> OrtDecoder:
        """An exported language model (`deamoe-trt export-lm`) in one session, read from its
        file; a checkpoint directory exported in memory as decoder() does."""
        if Path(path).is_dir():
            return self.decoder(load_lm_model(path), threads=threads, **options)
        session, info = self._lm_session(path, threads)
        return OrtDecoder(session, info)

    def load_batch_decoder(self, path, *, max_sequences: int, threads=None, **options):
        """Sequences of an exported language model stepped in turn, over one session."""
        if Path(path).is_dir():
            return self.batch_decoder(load_lm_model(path), max_sequences=max_sequences, threads=threads, **options)
        session, info = self._lm_session(path, threads)
        return SerialBatchDecoder(DecoderPool(lambda: OrtDecoder(session, info), keep_alive=session), max_sequences)

    def _lm_session(self, path, threads: int | None):
        from ..export.lm import lm_export_info
        from ..export.metadata import load_model

        self.require()
        info = lm_export_info(load_model(path), where=str(path), directory=Path(path).parent)
        return make_session(path, options=session_options(threads)), info


NUMPY_DTYPES = {name: BY_NAME[name].numpy for name in ("fp32", "fp16")}


class OrtDecoder:
    """Prefill + decode through one exported graph; present.* become the next past_key_values.*."""

    name = "ort"
    keep_alive: object = None  # what the session's in-memory weights live in

    def __init__(self, session, info: LMExportInfo):
        self.session, self.info = session, info
        c = info.config
        self.max_context = c.max_position_embeddings
        if info.dtype not in NUMPY_DTYPES:
            raise UsageError(f"ONNX Runtime decoding supports fp32 and fp16 exports, not {info.dtype}")
        self.np_dtype = NUMPY_DTYPES[info.dtype]
        from ..export.lm import LOGITS, present_names

        self.output_names = [LOGITS] + [n for i in range(c.num_layers) for n in present_names(i)]
        self.cache: list[np.ndarray] = []
        if info.form == "plugin":
            self.name = "ort (plugin form, reference op)"

    @classmethod
    def from_model(
        cls,
        model: DeaMoELM,
        *,
        form: str = "ort",
        dtype: str = "fp32",
        threads: int | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> OrtDecoder:
        return RUNTIME.decoder(model, form=form, dtype=dtype, threads=threads, tokenizer=tokenizer)

    @classmethod
    def from_file(cls, path: str | Path, *, threads: int | None = None) -> OrtDecoder:
        return RUNTIME.load_decoder(path, threads=threads)

    def run(self, ids: np.ndarray, cache: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """logits [B, T, V] and the extended cache for ids [B, T] after cache (2 arrays per block)."""
        from ..export.lm import INPUT_IDS, past_names

        feeds = {INPUT_IDS: ids.astype(np.int64)}
        for i in range(self.info.config.num_layers):
            key, value = past_names(i)
            feeds[key], feeds[value] = cache[2 * i], cache[2 * i + 1]
        outputs = self.session.run(self.output_names, feeds)
        return outputs[0], outputs[1:]

    def empty_cache(self, batch: int = 1) -> list[np.ndarray]:
        c = self.info.config
        shapes = [(batch, heads, 0, width) for heads, width in c.cache_shapes()]
        return [np.zeros(shapes[j % 2], dtype=self.np_dtype) for j in range(2 * c.num_layers)]

    def prefill(self, ids: list[int]) -> np.ndarray:
        logits, self.cache = self.run(np.asarray([ids], dtype=np.int64), self.empty_cache())
        return logits[0, -1]

    def step(self, token: int) -> np.ndarray:
        logits, self.cache = self.run(np.asarray([[token]], dtype=np.int64), self.cache)
        return logits[0, -1]


RUNTIME = OnnxRuntime()
