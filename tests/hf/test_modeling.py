"""DeaMoEForCausalLM in transformers: an export-hf directory loaded through AutoModelForCausalLM
(deamoe-trt imported, so registered) gives the reference model's logits and greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch

from deamoe_trt.errors import UsageError
from deamoe_trt.export.hf import write_hf_dir
from deamoe_trt.lm.tokenizer import default_tokenizer

from .models import NEW_TOKENS, PROMPT_TOKENS, model, prompt, reference_greedy

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # transformers loads and generates: seconds each


def export(tmp_path, variant: str, **options):
    lm = model(variant)
    return lm, write_hf_dir(lm, default_tokenizer(lm.config.vocab_size), tmp_path / variant, **options)


# Every variant runs through the remote code in test_remote_code; these load the registered class.
@pytest.mark.parametrize("variant", ["sliding_window_tied_head", "mla", "shared_expert_dense_block"])
def test_auto_model_matches_the_reference_logits_and_greedy_tokens(tmp_path, variant):
    lm, directory = export(tmp_path, variant, max_shard_bytes=8192)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    assert type(hf).__module__ == "deamoe_trt.hf.modeling"
    ids = prompt()
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, lm(ids).logits, atol=1e-5, rtol=0)
        out = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=torch.ones_like(ids))
    assert out[0, PROMPT_TOKENS:].tolist() == reference_greedy(lm, ids)


def test_decoding_in_steps_through_a_dynamic_cache_equals_one_forward(tmp_path):
    lm, directory = export(tmp_path, "sliding_window_tied_head")
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory)
    ids = torch.cat((prompt(), prompt(1)), dim=1)  # 16 tokens: four times the window
    cache = transformers.DynamicCache()
    with torch.no_grad():
        first = hf(ids[:, :5], cache=cache, use_cache=True)
        steps = [hf(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(5, ids.shape[1])]
        whole = lm(ids).logits
    assert cache.get_seq_length() == ids.shape[1]
    assert torch.allclose(torch.cat((first.logits, *steps), dim=1), whole, atol=1e-5, rtol=0)


def test_the_tied_head_is_stored_once_and_shared_after_loading(tmp_path):
    lm, directory = export(tmp_path, "sliding_window_tied_head")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"] and "model.embed_tokens.weight" in index["weight_map"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert torch.equal(hf.lm_head.weight, lm.embed_tokens.weight)


def test_labels_give_the_next_token_cross_entropy(tmp_path):
    lm, directory = export(tmp_path, "gqa")
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory)
    ids = prompt()
    with torch.no_grad():
        loss = hf(ids, labels=ids).loss
        logits = lm(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert torch.allclose(loss, expected, atol=1e-6)


def test_sizes_that_do_not_match_the_tensors_are_refused_in_one_line(tmp_path):
    _, directory = export(tmp_path, "gqa")
    config = json.loads((directory / "config.json").read_text())
    config["deamoe_lm"]["moe"]["private_intermediate_size"] = 16  # the tensors hold 8
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"mlp\.experts\.gate_up has shape \[4, 16, 32\], but config\.json implies"):
        transformers.AutoModelForCausalLM.from_pretrained(directory)


def test_a_top_level_size_that_disagrees_with_the_model_is_refused_in_one_line(tmp_path):
    _, directory = export(tmp_path, "gqa")
    config = json.loads((directory / "config.json").read_text())
    config["hidden_size"] = 64
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"hidden_size is 64 but deamoe_lm says 32") as info:
        transformers.AutoConfig.from_pretrained(directory)
    assert "\n" not in str(info.value)


def test_padded_batches_are_refused(tmp_path):
    _, directory = export(tmp_path, "gqa")
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory)
    ids = prompt()
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(UsageError, match="unpadded"):
        hf(ids, attention_mask=mask)
