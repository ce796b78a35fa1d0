"""A DeaMoE language model as the Hugging Face Qwen3-MoE directory Edge-LLM's exporter reads.

Edge-LLM's exporter takes a Hugging Face checkpoint. The DeaMoE LM is shown to it as one:
config.json says Qwen3-MoE with the LM's attention, norms, rotary embeddings, dense layers
and head; model.safetensors holds every tensor outside the MoE layers under its Hugging
Face name; the tokenizer files and chat template are the LM directory's. The MoE layers'
tensors are not in it: the DeaMoE family (family.py) hands them to the model directly, so
the experts' width and count in config.json describe nothing Edge-LLM builds (its runtime
config copies them; its runtime reads neither).

`check_representable` is the list of what Edge-LLM's Qwen3-MoE graph can say; anything else is
refused in one line before any work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...lm.config import LMConfig
from ...lm.tokenizer import HF_FILES, HFTokenizer, Tokenizer

MODEL_TYPE = "qwen3_moe"
ARCHITECTURE = "Qwen3MoeForCausalLM"
DTYPES = ("fp16",)  # Edge-LLM's LLM graphs are fp16 (it casts bf16 checkpoints to fp16)
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def check_representable(config: LMConfig, where: str = "the LM") -> None:
    """A one-line UsageError when Edge-LLM's Qwen3-MoE graph cannot express config's non-MoE parts."""

    def refuse(what: str) -> None:
        raise UsageError(
            f"{where}: {what}; Edge-LLM export covers Qwen3-MoE attention (per-head q/k RMSNorm, "
            "default rotary embeddings, full attention, no clipping)"
        )

    if config.quantized_linears:
        # Edge-LLM reads everything outside the MoE layers from the Hugging Face checkpoint, as its
        # own quantized Linears: int4 as GPTQ/AWQ words (a symmetric GPTQ repacking of the codes
        # would carry ours exactly; not written yet), int8 only as SmoothQuant, whose
        # activations are quantized too, so int8 weight-only projections have no form there.
        assert config.quantization is not None
        why = (
            "Edge-LLM has no weight-only int8 form for them (its int8 is SmoothQuant, which quantizes activations)"
            if config.quantization.bits == 8
            else "Edge-LLM would read them only repacked as symmetric GPTQ int4, which this export does not write yet"
        )
        raise UsageError(
            f"{where}: its {', '.join(config.quantized_linears)} projections are quantized and {why}; "
            "quantize the LM without --linears (its FFNs only) for Edge-LLM, or export-lm it to ONNX"
        )
    if config.qk_norm != "head":
        refuse(f"qk_norm is {config.qk_norm!r}, not 'head'")
    if config.qkv_bias != config.o_bias:
        refuse("q/k/v biases without an output-projection bias (or the reverse) have no Qwen3 form")
    if config.clip_qkv:
        refuse(f"clip_qkv {config.clip_qkv} has no Qwen3 form")
    if config.sliding_window:
        refuse(f"sliding-window attention (window {config.sliding_window}) is not exported")
    if config.rope_scaling:
        refuse(
            f"rope scaling {config.rope_scaling.get('rope_type', config.rope_scaling.get('type'))!r} is not exported"
        )


def chat_template_source(directory: Path) -> Path | None:
    """Where the LM directory keeps its chat template (chat_template.jinja, or tokenizer_config.json's)."""
    if (directory / CHAT_TEMPLATE_FILE).is_file():
        return directory / CHAT_TEMPLATE_FILE
    settings = directory / "tokenizer_config.json"
    if settings.is_file():
        try:
            if json.loads(settings.read_text()).get("chat_template"):
                return settings
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return None
    return None


def check_tokenizer(tokenizer: Tokenizer, directory: Path) -> None:
    """Edge-LLM's runtime tokenizes with tokenizer.json and renders a chat template: both must be there."""
    if not isinstance(tokenizer, HFTokenizer):
        raise UsageError(
            f"{directory} has a {tokenizer.describe()}, not a Hugging Face tokenizer.json, which Edge-LLM's "
            "runtime needs; import the model with `deamoe-trt import-hf` from a directory that has one"
        )
    if chat_template_source(directory) is None:
        raise UsageError(
            f"{directory} has no chat template (chat_template.jinja or tokenizer_config.json's chat_template), "
            "which Edge-LLM's export needs; add the source model's chat_template.jinja to the LM directory"
        )


def hf_config(config: LMConfig, eos_token_id: Any, bos_token_id: Any) -> dict[str, Any]:
    """The Qwen3-MoE config.json that describes config's non-MoE parts as transformers 5 writes it."""
    moe = config.moe
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "rms_norm_eps": config.rms_norm_eps,
        "attention_bias": config.qkv_bias,
        "hidden_act": "silu",
        "tie_word_embeddings": config.tie_word_embeddings,
        "intermediate_size": config.dense_intermediate_size,
        "mlp_only_layers": list(config.dense_layers),
        "decoder_sparse_step": 1,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.shared_intermediate_size + moe.private_intermediate_size,
        "norm_topk_prob": moe.norm_topk_prob,
        "use_sliding_window": False,
        "sliding_window": None,
        "eos_token_id": eos_token_id,
        "bos_token_id": bos_token_id,
    }


def _token_ids(directory: Path, tokenizer: HFTokenizer) -> tuple[Any, Any]:
    """(eos, bos) token ids: generation_config.json's when the LM directory has one, else the tokenizer's."""
    generation = directory / "generation_config.json"
    settings: dict[str, Any] = {}
    if generation.is_file():
        try:
            settings = json.loads(generation.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UsageError(f"{generation} is not valid JSON") from None
    eos = settings.get("eos_token_id")
    if eos is None:
        eos = next(iter(tokenizer.eos_ids()), None)
    bos = settings.get("bos_token_id")
    if bos is None:
        token = tokenizer.settings.get("bos_token")
        bos = tokenizer.tokenizer.token_to_id(token) if isinstance(token, str) else None
    return eos, bos


def hf_name(name: str) -> str:
    """The Hugging Face name of a DeaMoE LM tensor outside the MoE layers."""
    return name if name == "lm_head.weight" else f"model.{name}"


def write_hf_dir(model, tokenizer: HFTokenizer, lm_dir: Path, out: Path) -> dict[int, Any]:
    """Write the Hugging Face view of model (a DeaMoELM loaded from lm_dir) into out (a fresh
    folder); returns the model's DeaMoE layers by block index."""
    from safetensors.torch import save_file

    config: LMConfig = model.config
    layers = {i: block.mlp for i, block in enumerate(model.layers) if block.is_moe}
    moe_prefixes = tuple(f"layers.{i}.mlp." for i in layers)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name.startswith(moe_prefixes) or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        tensors[hf_name(name)] = tensor.detach().contiguous()
    out.mkdir(parents=True, exist_ok=False)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    eos, bos = _token_ids(lm_dir, tokenizer)
    document = hf_config(config, eos, bos) | {"dtype": str(model.embed_tokens.weight.dtype).removeprefix("torch.")}
    (out / "config.json").write_text(json.dumps(document, indent=2) + "\n")
    for name in HF_FILES:
        if (lm_dir / name).is_file():
            shutil.copyfile(lm_dir / name, out / name)
    return layers
