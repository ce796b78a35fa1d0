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

from transformers import PretrainedConfig

from ...errors import UsageError
from ...hf.fields import MODEL_TYPE
from ...lm.config import LMConfig
from .checks import (
    check_head_dim,
    check_quantized_platform,
    check_servable,
    check_vllm_version,
    platform_head_sizes,
    platform_name_and_amx,
)


class DeaMoEHFConfig(PretrainedConfig):
    """config.json of a vLLM model directory; lm_config() is the LMConfig the model class builds."""

    model_type = MODEL_TYPE

    def __init__(self, deamoe_lm: dict[str, Any] | None = None, **kwargs: Any):
        self.deamoe_lm = deamoe_lm
        if deamoe_lm is not None:
            self.lm_config()  # checks it (one line, before any engine starts)
        super().__init__(**kwargs)

    def lm_config(self) -> LMConfig:
        if not isinstance(self.deamoe_lm, dict):
            raise UsageError('config.json has no "deamoe_lm" object; write the directory with `deamoe-trt export-vllm`')
        try:
            config = LMConfig.from_dict(dict(self.deamoe_lm))
        except (TypeError, UsageError) as exc:
            raise UsageError(f"config.json deamoe_lm: {exc}") from None
        check_servable(config)
        if "vllm" in sys.modules:  # read by vLLM: also its version and its attention's head sizes
            check_engine(config)
        return config


def check_engine(config: LMConfig) -> None:
    """The installed vLLM's version, config's head_dim on its platform's attention, and its
    quantized weights on the platform's quantized methods."""
    import vllm

    check_vllm_version(vllm.__version__)
    sizes = platform_head_sizes()
    if sizes is not None:
        check_head_dim(config.head_dim, sizes[1], sizes[0])
    check_quantized_platform(config, *platform_name_and_amx())
