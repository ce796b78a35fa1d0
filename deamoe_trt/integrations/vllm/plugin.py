"""The `vllm.general_plugins` entry point: registers DeaMoE's config and model class with vLLM.

vLLM calls `register()` in every process it starts (the front end, the engine core, each
worker), so `vllm serve DIR` and `vllm.LLM(DIR)` find the architecture without an import in
user code. The model class is named by path, so vLLM imports it (and torch's kernels) only
where a DeaMoE model is loaded.
"""

from __future__ import annotations

import contextlib

ARCHITECTURE_PATH = "deamoe_trt.integrations.vllm.model:DeaMoEForCausalLM"


def register() -> None:
    from transformers import AutoConfig
    from vllm import ModelRegistry

    from ...hf.fields import ARCHITECTURE, MODEL_TYPE
    from .hf_config import DeaMoEHFConfig

    with contextlib.suppress(ValueError):  # already registered in this process
        AutoConfig.register(MODEL_TYPE, DeaMoEHFConfig)
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, ARCHITECTURE_PATH)
