"""A DeaMoE language model as the Hugging Face Qwen3-MoE directory Edge-LLM's exporter reads.

Edge-LLM's exporter takes a Hugging Face checkpoint. The DeaMoE LM is shown to it as one:
config.json says Qwen3-MoE with the LM's attention, norms, rotary embeddings, dense layers
and head; model.safetensors holds every tensor outside the MoE layers under its Hugging
Face name; the tokenizer files and chat template are the LM directory's. The MoE layers'
tensors are not in it: the DeaMoE family (family.py) hands them to the model directly, so
the experts' width and count in config.json describe nothing Edge-LLM builds (its runtime
config copies them; its runtime reads neither).

Projections quantized outside the FFNs (LMConfig.quantized_linears) at int4 go in as a
symmetric GPTQ int4 checkpoint (gptq_tensors, quantization_config), which Edge-LLM reads
into its own int4 GEMM: the same codes, zero point 8, the scales in fp16 as the FFN nodes get
them. int8 ones have no Edge-LLM form (its int8 is SmoothQuant, with int8 activations).

`check_representable` is the list of what Edge-LLM's Qwen3-MoE graph can say; anything else is
refused in one line before any work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ...errors import UsageError
from ...hf.fields import derived_fields
from ...lm.config import LMConfig
from ...lm.tokenizer import HF_FILES, HFTokenizer, Tokenizer

MODEL_TYPE = "qwen3_moe"
ARCHITECTURE = "Qwen3MoeForCausalLM"
DTYPES = ("fp16",)  # Edge-LLM's LLM graphs are fp16 (it casts bf16 checkpoints to fp16)
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# int4 projections outside the MoE layers go to Edge-LLM as a symmetric GPTQ checkpoint (gptq_tensors),
# whose int4 GEMM (the cuteDSL plugin, Edge-LLM's default) needs both widths in multiples of 64.
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "sym": True, "desc_act": False}
GPTQ_ALIGN = 64


def check_representable(config: LMConfig, where: str = "the LM") -> None:
    """A one-line UsageError when Edge-LLM's Qwen3-MoE graph cannot express config's non-MoE parts."""

    def refuse(what: str) -> None:
        raise UsageError(
            f"{where}: {what}; Edge-LLM export covers Qwen3-MoE attention (per-head q/k RMSNorm, "
            "default rotary embeddings, full attention, no clipping)"
        )

    if config.quantized_linears:
        assert config.quantization is not None
        if config.quantization.bits == 8:
            raise UsageError(
                f"{where}: its {', '.join(config.quantized_linears)} projections are int8, and Edge-LLM has no "
                "weight-only int8 form for them (its int8 is SmoothQuant, which quantizes activations); quantize "
                "them at --bits 4, or the LM without --linears (its FFNs only), or export-lm it to ONNX"
            )
        parts = ",".join(config.quantized_linears)
        if config.dense_layers and "dense" not in config.quantized_linears:
            # Its dense MLPs carry no module name Edge-LLM could exclude from the checkpoint's
            # quantization: they would be built as int4 and left without their weights.
            raise UsageError(
                f"{where}: its {parts} projections are quantized but not its dense MLPs, which Edge-LLM's "
                f"Qwen3-MoE builds as quantized whenever projections are; quantize with --linears {parts},dense"
            )
        off = sorted({w for w in projection_widths(config) if w % GPTQ_ALIGN})
        if off:
            raise UsageError(
                f"{where}: its quantized projections have widths {', '.join(map(str, off))}, not multiples of "
                f"{GPTQ_ALIGN}, which Edge-LLM's int4 GEMM needs; quantize fewer parts with --linears, or none"
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


def projection_widths(config: LMConfig) -> set[int]:
    """The input and output widths of config's quantized projections (LMConfig.quantized_linears)."""
    parts = config.quantized_linears
    widths = set()
    if "attention" in parts:
        widths |= {config.hidden_size, config.num_heads * config.head_dim, config.num_key_value_heads * config.head_dim}
    if "dense" in parts and config.dense_layers:
        widths |= {config.hidden_size, config.dense_intermediate_size}
    if "head" in parts:
        widths |= {config.hidden_size, config.vocab_size}
    return widths


def gptq_tensors(prefix: str, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """A projection's int4 codes (deamoe_trt.quant: [out, in / 2] bytes, zero point 8) and scales
    [out, in / group] as the symmetric GPTQ tensors Edge-LLM reads: qweight [in / 8, out] int32
    (input 8i + k in bits 4k..4k+3), qzeros [in / group, out / 8] of 8s (which Edge-LLM takes as
    the actual zero point), scales [in / group, out] fp16, g_idx (each input's group).

    A row's bytes already hold its codes two a byte along the input, low nibble first, so four
    of them read as a little-endian int32 are GPTQ's word of eight: no code is unpacked."""
    inputs = qweight.shape[1] * 2
    words = qweight.contiguous().view(torch.int32).t()  # [in / 8, out]
    zeros = torch.full((inputs // group_size, qweight.shape[0] // 8), 0x88888888 - 2**32, dtype=torch.int32)
    return {
        f"{prefix}.qweight": words.contiguous(),
        f"{prefix}.qzeros": zeros,
        f"{prefix}.scales": scales.t().to(torch.float16).contiguous(),
        f"{prefix}.g_idx": torch.arange(inputs, dtype=torch.int32) // group_size,
    }


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
        what = tokenizer.describe()
        what = what if what.startswith("no ") else f"a tokenizer of {what}"
        raise UsageError(
            f"{directory} has {what}, not a Hugging Face tokenizer.json, which Edge-LLM's "
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
        **derived_fields(config),
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "attention_bias": config.qkv_bias,
        "hidden_act": "silu",
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
    tensors: dict[str, torch.Tensor] = {}
    state = model.state_dict()
    for name, tensor in state.items():
        if name.startswith(moe_prefixes) or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        if name.endswith(".weight.scales"):
            continue
        if name.endswith(".weight.qweight"):  # a quantized projection (check_representable: int4)
            base = name.removesuffix(".qweight")
            assert config.quantization is not None
            prefix = hf_name(base).removesuffix(".weight")
            tensors |= gptq_tensors(prefix, tensor, state[f"{base}.scales"], config.quantization.group_size)
            continue
        tensors[hf_name(name)] = tensor.detach().contiguous()
    out.mkdir(parents=True, exist_ok=False)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    eos, bos = _token_ids(lm_dir, tokenizer)
    document = hf_config(config, eos, bos) | {"dtype": str(model.embed_tokens.weight.dtype).removeprefix("torch.")}
    if config.quantized_linears:
        assert config.quantization is not None
        document["quantization_config"] = GPTQ_CONFIG | {"group_size": config.quantization.group_size}
    (out / "config.json").write_text(json.dumps(document, indent=2) + "\n")
    for name in HF_FILES:
        if (lm_dir / name).is_file():
            shutil.copyfile(lm_dir / name, out / name)
    return layers
