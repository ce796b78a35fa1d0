"""config.json of a DeaMoE language model in Hugging Face form (model_type "deamoe").

It holds the Hugging Face keys that tools read for sizes (hidden_size, num_hidden_layers,
num_attention_heads, ...), each derived from the LMConfig, and the whole LMConfig under
"deamoe_lm", which is what the model builds from. No top-level sliding_window or layer_types:
transformers would give every block the window (or size its caches by it); each block takes
its own window from the LMConfig. Needs no transformers (the importer reads it too).
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..lm.config import LMConfig

MODEL_TYPE = "deamoe"
ARCHITECTURE = "DeaMoEForCausalLM"


def hf_fields(config: LMConfig) -> dict[str, Any]:
    """The Hugging Face keys of config.json derived from config, "deamoe_lm" included."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        **derived_fields(config),
        "deamoe_lm": config.to_dict(),
    }


def derived_fields(config: LMConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def read_lm_config(deamoe_lm: Any, where: str = "config.json") -> LMConfig:
    """The LMConfig under config.json's "deamoe_lm", or a one-line UsageError."""
    if not isinstance(deamoe_lm, dict):
        raise UsageError(f'{where} has no "deamoe_lm" object; write the directory with `deamoe-trt export-hf`')
    try:
        return LMConfig.from_dict(dict(deamoe_lm))
    except (TypeError, UsageError) as exc:
        raise UsageError(f"{where} deamoe_lm: {exc}") from None


def check_derived(config: LMConfig, given: dict[str, Any], where: str = "config.json") -> None:
    """A one-line UsageError when a top-level key of given disagrees with config."""
    for key, value in derived_fields(config).items():
        if key in given and given[key] != value:
            raise UsageError(
                f"{where} {key} is {given[key]!r} but deamoe_lm says {value!r}; "
                "the sizes under deamoe_lm are the model's: correct or remove the top-level key"
            )
