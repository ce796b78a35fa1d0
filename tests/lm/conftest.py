import pytest

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.lm import DeaMoELM, LMConfig

# Small enough that every test builds, runs and exports it in well under a second.
MICRO = LMConfig(
    vocab_size=256,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=48,
    moe=DeaMoEConfig(
        hidden_size=32,
        num_departments=2,
        experts_per_department=2,
        shared_intermediate_size=16,
        private_intermediate_size=8,
        top_k=2,
        top_departments=1,
    ),
)


@pytest.fixture
def micro_config():
    return MICRO


@pytest.fixture
def micro_model():
    return DeaMoELM.random(MICRO, seed=3).eval()


@pytest.fixture
def micro_checkpoint(tmp_path, micro_model):
    return micro_model.save_pretrained(tmp_path / "micro-lm")
