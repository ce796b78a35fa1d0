"""A DeaMoE model in Hugging Face form (`deamoe-trt export-hf`, model_type "deamoe") read back.

config.json carries the LMConfig itself under "deamoe_lm" (deamoe_trt.hf.fields), and every
tensor is the LM checkpoint's under its Hugging Face name (behind "model."), copied as stored.
The directory's remote code is never run: only config.json and the safetensors are read.
"""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from ...hf.fields import check_derived, read_lm_config
from ...lm.config import LMConfig


def lm_config(hf: dict[str, Any], where: str) -> LMConfig:
    config = read_lm_config(hf.get("deamoe_lm"), where)
    check_derived(config, hf, where)
    if config.quantization is not None:
        raise UsageError(f"{where} deamoe_lm is quantized; export-hf directories hold floating-point models")
    return config


def block_sources(hf: dict[str, Any], config: LMConfig, index: dict, i: int) -> dict[str, Any]:
    from ...lm.model import Block

    names = Block(config, i, device="meta").state_dict()
    return {name: f"model.layers.{i}.{name}" for name in names}
