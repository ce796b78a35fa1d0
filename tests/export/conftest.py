"""Shared configs and helpers for the export tests: small shapes of each routing family."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs import deepseek_style
from deamoe_trt import DeaMoEConfig, DeaMoELayer, get_preset
from deamoe_trt.inputs import random_hidden

# DeepSeek-V3-style: sigmoid scores, selection bias, sum_top2 department score, routed
# scaling, an ungated shared expert; f_s == d (the width ONNX Runtime's MoE could mistake
# for its legacy weight layout).
DEEPSEEK_STYLE = deepseek_style()

# Qwen2-MoE-style: softmax without renormalisation, a sigmoid-gated shared expert.
QWEN2_STYLE = DeaMoEConfig(
    hidden_size=48,
    num_departments=2,
    experts_per_department=4,
    shared_intermediate_size=16,
    private_intermediate_size=16,
    top_k=2,
    top_departments=1,
    score_func="softmax",
    department_score="sum",
    norm_topk_prob=False,
    shared_expert_intermediate_size=32,
    shared_expert_gate=True,
)

CONFIGS = {"tiny": get_preset("tiny"), "deepseek-style": DEEPSEEK_STYLE, "qwen2-style": QWEN2_STYLE}
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Largest error allowed against the reference, in units of max(1, max |reference|).
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
TOKENS = (1, 4, 17)


def layer_of(config: DeaMoEConfig, dtype: str = "fp32", seed: int = 0) -> DeaMoELayer:
    return DeaMoELayer.random(config, seed=seed).to(TORCH_DTYPES[dtype])


def feed(x: torch.Tensor) -> np.ndarray:
    """What a session takes for x: numpy in x's dtype, float32 for bf16."""
    return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()


def max_error(session, module, tokens: int, *, seed: int = 0) -> float:
    """Max |model - reference| on random hidden states of the given token count, in units of
    max(1, max |reference|) (a stack's residual stream grows well past 1)."""
    x = random_hidden(tokens, module.config.hidden_size, seed=seed).to(module.dtype)
    (y,) = session.run(None, {"hidden_states": feed(x)})
    with torch.no_grad():
        expected = module(x).float().numpy()
    assert y.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    return float(np.abs(y.astype(np.float32) - expected).max()) / scale


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A 2-layer tiny checkpoint on disk (fp32)."""
    from deamoe_trt import DeaMoEStack

    path = tmp_path_factory.mktemp("ckpt") / "tiny2"
    DeaMoEStack.random(get_preset("tiny"), 2, seed=7).save_pretrained(path)
    return path
