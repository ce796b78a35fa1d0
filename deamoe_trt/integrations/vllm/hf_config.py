"""config.json of a vLLM model directory as a transformers config (model_type "deamoe").

vLLM reads a model's sizes from the usual Hugging Face keys (hidden_size, num_attention_heads,
head_dim, max_position_embeddings, ...), which export.hf_fields writes; the whole LMConfig travels
under "deamoe_lm" and is what the model class builds from. Constructing the config checks the
model (deamoe_trt.integrations.vllm.checks) and the vLLM version, so bad input is refused in one
line when vLLM reads config.json, before an engine starts.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from transformers import PretrainedConfig

from ...errors import UsageError
from ...hf.fields import MODEL_TYPE
from ...lm.config import LMConfig
from .checks import (
    check_head_dim,
    check_latent_sizes,
    check_quantized_platform,
    check_servable,
    check_vllm_version,
    platform_head_sizes,
    platform_name_and_amx,
)

DTYPE_NAMES = ("float32", "float16", "bfloat16")
# DeepSeek-V2's config keys, as vLLM's MLA layers and cache read them.
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class DeaMoEHFConfig(PretrainedConfig):
    """config.json of a vLLM model directory; lm_config() is the LMConfig the model class builds."""

    model_type = MODEL_TYPE

    def __init__(self, deamoe_lm: dict[str, Any] | None = None, **kwargs: Any):
        self.deamoe_lm = deamoe_lm
        if deamoe_lm is not None:
            # Checks it (one line, before any engine starts) at the dtype vLLM serves by default.
            config = self.lm_config(kwargs.get("dtype") or kwargs.get("torch_dtype"))
            if config.is_mla:  # the keys vLLM sizes an MLA model's latent cache by
                kwargs.update({name: getattr(config, name) for name in MLA_KEYS})
        super().__init__(**kwargs)

    def lm_config(self, dtype: str | None = None) -> LMConfig:
        """The LMConfig, checked (with vLLM imported, on its engine too, at dtype where given)."""
        if not isinstance(self.deamoe_lm, dict):
            raise UsageError('config.json has no "deamoe_lm" object; write the directory with `deamoe-trt export-vllm`')
        try:
            config = LMConfig.from_dict(dict(self.deamoe_lm))
        except (TypeError, UsageError) as exc:
            raise UsageError(f"config.json deamoe_lm: {exc}") from None
        check_servable(config)
        if "vllm" in sys.modules:  # read by vLLM: also its version and its attention's head sizes
            check_engine(config, dtype)
        return config


def check_engine(config: LMConfig, dtype: str | None = None) -> None:
    """The installed vLLM's version, config's head_dim on its platform's attention, and its
    quantized weights on the platform's quantized methods at dtype (a torch dtype's name; None:
    not known yet, checked again when the model is built)."""
    import vllm

    check_vllm_version(vllm.__version__)
    sizes = platform_head_sizes(mla=config.is_mla)
    if sizes is not None and config.is_mla:
        check_latent_sizes(config, sizes[1], sizes[0])
    elif sizes is not None:
        check_head_dim(config.head_dim, sizes[1], sizes[0])
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype in DTYPE_NAMES else None
    check_quantized_platform(config, *platform_name_and_amx(), dtype=torch_dtype)
