"""Whole-model import of the families whose layout differs from Qwen/Mixtral/OLMoE's, one
module per family (its config.json mapping and where its tensors are).

Each family gives lm_config(hf config dict, where) -> LMConfig (refusing, in one line naming
the field, every variant it cannot represent exactly) and block_sources(hf, config, index, i) ->
{our tensor name under layers.{i}.: source recipe} as deamoe_trt.importers.hf_lm reads them;
optionally ignored(hf) -> prefixes of stored tensors that are not part of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...lm.config import LMConfig
from . import deamoe, deepseek, ernie, granite


@dataclass(frozen=True)
class Family:
    name: str
    lm_config: Callable[[dict[str, Any], str], LMConfig]
    block_sources: Callable[[dict[str, Any], LMConfig, dict, int], dict[str, Any]]
    # name prefixes of checkpoint tensors that are not part of the model (not refused as dropped)
    ignored: Callable[[dict[str, Any]], tuple[str, ...]] = lambda hf: ()


FAMILIES: dict[str, Family] = {
    "granitemoe": Family("Granite MoE", granite.lm_config, granite.block_sources),
    "granitemoeshared": Family("Granite MoE Shared", granite.lm_config, granite.block_sources),
    "ernie4_5_moe": Family("ERNIE-4.5-MoE", ernie.lm_config, ernie.block_sources),
    "deepseek_v2": Family("DeepSeek-V2", deepseek.lm_config, deepseek.block_sources),
    "deepseek_v3": Family("DeepSeek-V3", deepseek.lm_config, deepseek.block_sources, deepseek.ignored),
    "deamoe": Family("DeaMoE (export-hf)", deamoe.lm_config, deamoe.block_sources),
}
