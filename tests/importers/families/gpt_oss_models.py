"""A tiny random gpt-oss (GptOssForCausalLM) built with transformers and saved like a
downloaded one: both layer types (sliding blocks 0 and 2, a full block 1), sinks, biases on
every projection and expert, YaRN without truncation, and a SwiGLU limit small enough that
the clamp acts on many neurons. With mxfp4=True its experts are stored as MXFP4 blocks and
scales (deamoe_trt.importers.mxfp4.encode_mxfp4, round to nearest) and the returned model holds the values
transformers' own dequantization gives."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deamoe_trt.importers.mxfp4 import encode_mxfp4

from ..hf_lm_models import CHAT_TEMPLATE, VOCAB, make_tokenizer

LIMIT = 0.3  # the experts' gate/up pre-activations here spread over about +-1


def gpt_oss_config():
    import transformers as T

    return T.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        max_position_embeddings=128,
        initializer_range=0.1,
        swiglu_limit=LIMIT,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 32,
        },
        bos_token_id=1,
        eos_token_id=2,
    )


def build_gpt_oss(directory: Path, *, seed: int = 0, mxfp4: bool = False):
    """The random model saved in directory; returns it (eval, fp32, MXFP4 values when mxfp4)."""
    import transformers as T
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(gpt_oss_config(), attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith(("bias", "sinks")):
                param.copy_((1.0 if name.endswith("sinks") else 0.1) * torch.randn_like(param))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model = model.eval()
    model.save_pretrained(directory)
    if mxfp4:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors

        state = load_file(directory / "model.safetensors")
        for i, layer in enumerate(model.model.layers):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{i}.mlp.experts.{proj}"
                blocks, scales = encode_mxfp4(state.pop(name).transpose(1, 2))  # stored as [E, rows, cols]
                state[name + "_blocks"], state[name + "_scales"] = blocks, scales
                with torch.no_grad():
                    decoded = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                    getattr(layer.mlp.experts, proj).copy_(decoded)
        save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((directory / "config.json").read_text())
        config["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn"],
        }
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    make_tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE, "eos_token": "</s>"})
    )
    return model
