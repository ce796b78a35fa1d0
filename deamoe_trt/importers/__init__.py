"""Importers: existing MoE models as DeaMoE layers.

- hf: Hugging Face transformers MoE blocks and loaded models as DeaMoE layers and stacks;
- hf_layers: the MoE layers of a local Hugging Face model directory, through transformers
  (`import-hf --layers-only`);
- hf_lm: a whole Hugging Face MoE language model directory as a language-model checkpoint,
  streamed from safetensors without transformers (`import-hf`), with its families in families/;
- hf_directory: the checks of a model directory both directory imports share.
See docs/importers.md.
"""

from .hf import SUPPORTED_MODEL_TYPES, SUPPORTED_MODULES, find_moe_blocks, from_hf, from_hf_model

__all__ = ["SUPPORTED_MODEL_TYPES", "SUPPORTED_MODULES", "find_moe_blocks", "from_hf", "from_hf_model"]
