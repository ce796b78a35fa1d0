"""ONNX Runtime (CPU) as a runtime: a layer's `ort` export form (deamoe_trt.export), one session;
a language model's export (deamoe_trt.export.lm) decoded with its cache fed back each step.

The vanilla anchor is the `ort` form of DeaMoELayer.vanilla(): router logits straight into
com.microsoft.MoE, which does its own softmax top-k routing (deamoe_trt/export/ort_form.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..dtypes import BY_NAME, DTYPES
from ..errors import MissingDependencyError, UsageError
from ..export.lm import INPUT_IDS, LOGITS, LMExportInfo, build_lm_model, lm_export_info, past_names, present_names
from ..export.metadata import load_model
from ..lm.model import DeaMoELM
from ..lm.tokenizer import Tokenizer
from .base import DecoderPool, Prepared, RuntimeBase, state_bytes

if TYPE_CHECKING:
    import onnx

# ONNX Runtime's CPU MoE has no bf16 kernel.
ONNX_DTYPES = {d.torch: d.name for d in DTYPES if d.name != "bf16"}
# Initializers at least this big are handed to ONNX Runtime as in-memory arrays.
_IN_MEMORY_MIN_BYTES = 1 << 16
BUILDER = "deamoe_trt.export.build_model"


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


def make_session(model, threads: int | None, *, spinning: bool | None = False) -> OrtModel:
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

        from ..validation.session import make_session as make_validation_session
        from ..validation.session import session_options
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
    return OrtModel(make_validation_session(model, options=options), arrays)


class OnnxRuntime(RuntimeBase):
    name = "ort"
    label = "ONNX Runtime CPU"
    dtypes = tuple(ONNX_DTYPES)

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
        session = make_session(model, threads, spinning=spinning)
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
        (make_session); spinning None: ONNX Runtime's default."""
        self.require()
        proto = build_lm_model(model.twin(twin), form, dtype, tokenizer=tokenizer, twin=twin)
        info = lm_export_info(proto, directory=getattr(tokenizer, "directory", None))
        session = make_session(proto, threads, spinning=spinning)
        del proto
        decoder = OrtDecoder(session.session, info)
        decoder.keep_alive = session
        return decoder

    def decoder_pool(self, model, *, threads=None, size=1, **options) -> DecoderPool:
        shared = self.decoder(model, threads=threads, **options)
        return DecoderPool(lambda: OrtDecoder(shared.session, shared.info), keep_alive=shared)


NUMPY_DTYPES = {name: BY_NAME[name].numpy for name in ("fp32", "fp16")}


def make_lm_session(model: onnx.ModelProto | str | Path, *, threads: int | None = None):
    """An ONNX Runtime CPU session for an exported language model, with intra_op_num_threads =
    threads when given (plugin form: each DeaMoE node runs the PyTorch reference, for
    checking, not speed)."""
    from ..validation.session import make_session, session_options

    return make_session(model, options=session_options(threads))


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
        proto = load_model(path)
        info = lm_export_info(proto, where=str(path), directory=Path(path).parent)
        return cls(make_lm_session(path, threads=threads), info)

    def run(self, ids: np.ndarray, cache: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """logits [B, T, V] and the extended cache for ids [B, T] after cache (2 arrays per block)."""
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
