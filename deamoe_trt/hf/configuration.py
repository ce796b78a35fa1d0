"""The transformers configuration of a DeaMoE language model (model_type "deamoe"); config.json's
keys are deamoe_trt.hf.fields'. A top-level key that disagrees with "deamoe_lm" is refused in
one line rather than silently ignored."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from ..lm.config import LMConfig
from ..routing import LOAD_BALANCE_COEF
from .fields import MODEL_TYPE, check_derived, derived_fields, read_lm_config


class DeaMoEPretrainedConfig(PretrainedConfig):
    """A DeaMoE language model's config.json; lm_config() is the LMConfig the model builds."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        deamoe_lm: dict[str, Any] | None = None,
        use_cache: bool = True,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = LOAD_BALANCE_COEF,
        **kwargs: Any,
    ):
        self.deamoe_lm = deamoe_lm
        self.use_cache = use_cache
        # As Mixtral's: with output_router_logits, the loss adds router_aux_loss_coef times the
        # load-balancing term (deamoe_trt.routing.load_balance_loss, the mean over DeaMoE blocks).
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        if deamoe_lm is not None:
            config = self.lm_config()
            check_derived(config, kwargs)
            for key, value in derived_fields(config).items():
                kwargs.pop(key, None)
                if key != "tie_word_embeddings":
                    setattr(self, key, value)
            kwargs["tie_word_embeddings"] = config.tie_word_embeddings
        super().__init__(**kwargs)

    def lm_config(self) -> LMConfig:
        return read_lm_config(self.deamoe_lm)
