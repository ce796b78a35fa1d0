"""Tiny random Hugging Face MoE language models, built in code and saved like a downloaded one
(config.json + safetensors + tokenizer.json), for the whole-model import's parity tests.

Each family turns on the options deamoe-trt must reproduce: Qwen3-MoE explicit head_dim,
q/k RMSNorm, attention biases, a dense (mlp_only) layer, YaRN and a sliding window; Qwen2-MoE
q/k/v biases, the gated shared expert, decoder_sparse_step, linear rope scaling and sliding
layers; Mixtral a sliding window and a tied head; OLMoE full-width q/k norms and clip_qkv.
Norm weights and biases are randomised so that a wrong or missing one shows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 96
WORDS = [f"w{i}" for i in range(VOCAB - 4)]
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> w1 {% endif %}"
)


def hf_config(family: str):
    import transformers as T

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.1,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "qwen3_moe":
        return T.Qwen3MoeConfig(
            **common,
            num_hidden_layers=3,
            head_dim=16,
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            attention_bias=True,
            use_sliding_window=True,
            sliding_window=8,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
    if family == "qwen2_moe":
        return T.Qwen2MoeConfig(
            **common,
            num_hidden_layers=4,
            intermediate_size=40,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=3,
            decoder_sparse_step=2,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=3,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        )
    if family == "mixtral":
        return T.MixtralConfig(
            **common,
            num_hidden_layers=2,
            intermediate_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            tie_word_embeddings=True,
        )
    if family == "olmoe":
        return T.OlmoeConfig(
            **common,
            num_hidden_layers=2,
            intermediate_size=16,
            num_experts=8,
            num_experts_per_tok=2,
            clip_qkv=0.5,
        )
    raise ValueError(family)


FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return tokenizer


def build_hf_model(family: str, directory: Path, *, seed: int = 0, dtype=torch.float32, config=None):
    """A random HF causal LM of family (or of the given transformers config) saved in directory;
    returns the model (eval, fp32)."""
    import transformers as T

    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(config or hf_config(family), attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model = model.to(dtype).eval()
    model.save_pretrained(directory)
    make_tokenizer().save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": CHAT_TEMPLATE,
                "eos_token": "</s>",
                "bos_token": "<s>",
            }
        )
    )
    return model


def prompt_ids(length: int = 7, seed: int = 1) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (length,), generator=gen).tolist()
