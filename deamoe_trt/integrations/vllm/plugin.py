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
    register_attention_kind()


def register_attention_kind() -> None:
    """vLLM picks MLA (its latent cache and MLA backends) by a list of model types; a DeaMoE
    directory's config says it itself: MLA exactly when its LMConfig's attention is latent."""
    from vllm.transformers_utils import model_arch_config_convertor as convertors

    from ...hf.fields import MODEL_TYPE

    class DeaMoEArchConvertor(convertors.ModelArchConfigConvertorBase):
        def is_deepseek_mla(self) -> bool:
            return self.hf_text_config.lm_config().is_mla

    convertors.MODEL_ARCH_CONFIG_CONVERTORS.setdefault(MODEL_TYPE, DeaMoEArchConvertor)
