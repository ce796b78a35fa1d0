import pytest
import torch

from deamoe_trt.config import ConfigError
from deamoe_trt.errors import UsageError
from deamoe_trt.lm import LM_PRESETS, DeaMoELM, LMConfig, get_lm_preset


def test_cache_reproduces_the_full_forward(micro_model):
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = micro_model(ids).logits
        out = micro_model(ids[:, :9])
        pieces, cache = [out.logits], out.past_key_values
        for t in range(9, 17):
            out = micro_model(ids[:, t : t + 1], cache)
            pieces.append(out.logits)
            cache = out.past_key_values
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    c = micro_model.config
    assert cache[0][0].shape == (2, c.num_key_value_heads, 17, c.head_dim)


def test_empty_cache_is_the_same_as_no_cache(micro_model):
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(micro_model(ids, micro_model.empty_cache()).logits, micro_model(ids).logits)


def test_attention_is_causal(micro_model):
    a, b = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 99]])
    with torch.no_grad():
        torch.testing.assert_close(micro_model(a).logits[:, :3], micro_model(b).logits[:, :3])


def test_expanded_twin_has_the_same_logits_and_vanilla_routes_differently(micro_model):
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = micro_model(ids)
        expanded = micro_model.expanded()
        torch.testing.assert_close(expanded(ids).logits, ref.logits, atol=1e-5, rtol=1e-5)
        vanilla = micro_model.vanilla()
        assert vanilla.config.moe.num_departments == 1
        assert vanilla(ids).logits.shape == ref.logits.shape
    assert expanded.config.moe.shared_intermediate_size == 0
    assert expanded.layers[0].mlp.departments is None
    # Non-FFN weights are shared, not copied.
    assert expanded.embed_tokens.weight.data_ptr() == micro_model.embed_tokens.weight.data_ptr()
    assert micro_model.twin("deamoe") is micro_model
    with pytest.raises(UsageError, match="unknown twin"):
        micro_model.twin("other")


def test_context_overflow_is_a_usage_error(micro_model):
    n = micro_model.config.max_position_embeddings
    with pytest.raises(UsageError, match="exceed the model's context of 48"):
        micro_model(torch.zeros(1, n + 1, dtype=torch.long))


def test_state_dict_uses_hf_names_and_canonical_moe_tensors(micro_model):
    names = set(micro_model.state_dict())
    assert {"embed_tokens.weight", "norm.weight", "lm_head.weight", "layers.1.self_attn.k_proj.weight"} <= names
    assert "layers.0.mlp.departments.gate_up" in names
    assert not any("rope" in n for n in names)


def test_config_json_round_trip_and_validation(micro_config):
    assert LMConfig.from_dict(micro_config.to_dict()) == micro_config
    with pytest.raises(ConfigError, match=r"moe\.hidden_size"):
        micro_config.replace(hidden_size=64, num_heads=4)
    with pytest.raises(ConfigError, match="multiple of num_key_value_heads"):
        micro_config.replace(num_key_value_heads=3)
    with pytest.raises(ConfigError, match="unknown LM config field"):
        LMConfig.from_dict({**micro_config.to_dict(), "bogus": 1})


def test_presets():
    tiny = get_lm_preset("tiny-lm")
    assert tiny.moe.shared_intermediate_size == 2 * tiny.moe.private_intermediate_size
    big = LM_PRESETS["moe-7b-4l"]
    assert (big.hidden_size, big.num_heads, big.num_layers) == (4096, 32, 4)
    with pytest.raises(UsageError, match="unknown language-model preset"):
        get_lm_preset("nope")
    model = DeaMoELM(big, device="meta")
    params = sum(p.numel() for p in model.parameters())
    assert 2.0e9 < params < 2.4e9
