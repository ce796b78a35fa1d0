"""Models for the vLLM tests: the shipped tiny and converted LMs, an imported tiny Qwen3-MoE
(built in code with transformers), and their vLLM model directories.

Engine tests need vLLM (scripts/setup_vllm.sh makes .venv-vllm, and .ci/run runs
`.venv-vllm/bin/python -m pytest tests/integrations/vllm`); elsewhere they skip with the reason
setup_vllm.sh recorded, or say how to run them. The writer, grouping and refusal tests need
no vLLM and run in every environment.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deamoe_trt.lm import shipped

# No traffic off this machine: no usage reports, no Hugging Face Hub look-ups (engine
# subprocesses inherit these).
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[3]
TINY_LM = shipped.TINY_LM
CONVERTED_LM = shipped.TINY_LM_CONVERTED
# The CPU engine reserves this fraction of the machine's memory for its KV cache (its
# --gpu-memory-utilization); the tiny models need far less than the default 0.92.
CPU_MEMORY_FRACTION = 0.15


def vllm_or_skip():
    """vllm, or a skip saying why it is missing (the reason setup_vllm.sh recorded)."""
    recorded = ROOT / ".venv-vllm" / "SKIP_REASON"
    reason = (
        f"vLLM could not be installed: {recorded.read_text().strip()}"
        if recorded.is_file()
        else "vllm is not installed here; run scripts/setup_vllm.sh, then "
        ".venv-vllm/bin/python -m pytest tests/integrations/vllm"
    )
    return pytest.importorskip("vllm", reason=reason)


def qwen3_moe_config():
    """A Qwen3-MoE with head_dim 32 (vLLM's CPU attention has no smaller kernels), q/k norms,
    attention biases, a dense block, YaRN and a sliding window shorter than the prompts."""
    import transformers as T

    return T.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=3,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        attention_bias=True,
        use_sliding_window=True,
        sliding_window=8,
        max_position_embeddings=128,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        initializer_range=0.1,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
    )


@pytest.fixture(scope="session")
def qwen3_moe_checkpoint(tmp_path_factory) -> Path:
    """The tiny Qwen3-MoE saved as Hugging Face would, imported with `deamoe-trt import`."""
    pytest.importorskip("transformers", reason="building the Hugging Face model needs transformers")
    from importers.hf_lm_models import build_hf_model

    from deamoe_trt.importers.hf_lm import import_hf_lm

    hf_dir = tmp_path_factory.mktemp("qwen3-moe-hf")
    build_hf_model("qwen3_moe", hf_dir, seed=3, config=qwen3_moe_config())
    checkpoint = tmp_path_factory.mktemp("qwen3-moe") / "ckpt"
    import_hf_lm(hf_dir, checkpoint)
    return checkpoint
