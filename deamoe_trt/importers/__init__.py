"""Importers: existing MoE models as DeaMoE layers.

hf: Hugging Face transformers MoE blocks and models (Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V3) and local Hugging Face model directories. See docs/importers.md.
"""

from .hf import SUPPORTED_MODEL_TYPES, SUPPORTED_MODULES, find_moe_blocks, from_hf, from_hf_model

__all__ = ["SUPPORTED_MODEL_TYPES", "SUPPORTED_MODULES", "find_moe_blocks", "from_hf", "from_hf_model"]
