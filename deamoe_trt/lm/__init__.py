"""A small decoder-only language model with DeaMoE FFNs: config, model, tokenizer, checkpoints,
training on a shipped text, and generation with a KV cache on PyTorch and ONNX Runtime."""

from .checkpoint import LoadedLM, load_lm, save_lm
from .config import LMConfig
from .model import DeaMoELM, KVCache, LMOutput
from .presets import LM_PRESETS, get_lm_preset
from .tokenizer import ByteTokenizer

__all__ = [
    "LM_PRESETS",
    "ByteTokenizer",
    "DeaMoELM",
    "KVCache",
    "LMConfig",
    "LMOutput",
    "LoadedLM",
    "get_lm_preset",
    "load_lm",
    "save_lm",
]
