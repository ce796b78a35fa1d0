"""Decoding on ONNX Runtime (CPU): the exported graph of deamoe_trt.lm.onnx_export, cache fed back each step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ..dtypes import BY_NAME
from ..errors import UsageError
from ..export.metadata import load_model
from .model import DeaMoELM
from .onnx_export import INPUT_IDS, LOGITS, LMExportInfo, build_lm_model, lm_export_info, past_names, present_names
from .tokenizer import Tokenizer

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
        proto = build_lm_model(model, form, dtype, tokenizer=tokenizer)
        info = lm_export_info(proto, directory=getattr(tokenizer, "directory", None))
        return cls(make_lm_session(proto, threads=threads), info)

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
