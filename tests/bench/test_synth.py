"""Synthetic checkpoints of real models: transformers' own layout, importable, bounded, refused when bad."""

from __future__ import annotations

import json
import math

import pytest
import torch

from deamoe_trt.bench import synth
from deamoe_trt.errors import UsageError
from deamoe_trt.safetensors_io import INDEX_FILE, index_checkpoint

# Per shipped config: the same architecture shrunk to a few thousand weights (every switch kept).
TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
SHRINK = {
    "olmoe-1b-7b": {"intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "num_key_value_heads": 4},
    "qwen1.5-moe-a2.7b": {
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 48,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "num_key_value_heads": 4,
    },
    "qwen3-30b-a3b": {
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
    "deepseek-v2-lite": {
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "rope_scaling": {
            **synth.read_config("deepseek-v2-lite")["rope_scaling"],
            "original_max_position_embeddings": 64,
        },
    },
    "gpt-oss-20b": {
        "intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": 8,
        "rope_scaling": {**synth.read_config("gpt-oss-20b")["rope_scaling"], "original_max_position_embeddings": 64},
    },
}
LAYERS = {"deepseek-v2-lite": 3}  # its first block is dense


def tiny_config(name: str) -> dict:
    hf = synth.with_layers(synth.read_config(name), LAYERS.get(name, 2))
    return {**hf, **TINY, **SHRINK[name]}


def transformers_layout(hf: dict, tmp_path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the checkpoint transformers' save_pretrained writes for hf (MXFP4
    experts: the blocks and scales a gpt-oss download stores for each fused expert tensor)."""
    T = pytest.importorskip("transformers")
    mxfp4 = "quantization_config" in hf
    fields = {k: v for k, v in hf.items() if k not in ("quantization_config", "architectures", "model_type")}
    config = T.AutoConfig.for_model(hf["model_type"], **fields)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "hf")
    layout = {name: info.shape for name, info in index_checkpoint(tmp_path / "hf").items()}
    if mxfp4:
        for name in [n for n in layout if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            e, cols, rows = layout.pop(name)  # [E, in, out]: x @ W
            layout[name + "_blocks"] = (e, rows, cols // 32, 16)
            layout[name + "_scales"] = (e, rows, cols // 32)
    return layout


@pytest.mark.parametrize("name", sorted(SHRINK))
def test_synthetic_checkpoint_has_transformers_names_and_shapes_and_imports(name, tmp_path):
    from deamoe_trt.importers.hf_lm import import_hf_lm

    hf = tiny_config(name)
    out = tmp_path / "synth"
    summary = synth.synthesize(hf, out, shard_bytes=40_000)
    assert summary["shards"] > 1 and (out / INDEX_FILE).is_file()
    ours = {n: info.shape for n, info in index_checkpoint(out).items()}
    assert ours == transformers_layout(hf, tmp_path)
    config, imported = import_hf_lm(out, tmp_path / "lm")
    assert config.num_layers == hf["num_hidden_layers"] and imported["tensors"] > 0


def test_shipped_configs_are_the_five_models():
    assert synth.shipped_configs() == [
        "deepseek-v2-lite",
        "gpt-oss-20b",
        "olmoe-1b-7b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
    ]


def test_olmoe_full_size_layout_is_its_public_parameter_count_and_shards():
    # OLMoE-1B-7B: 6.92B parameters, 13.8 GB in bfloat16 (its model card and download).
    specs = synth.tensor_specs(synth.read_config("olmoe-1b-7b"))
    params = sum(math.prod(s.shape) for s in specs)
    assert 6.90e9 < params < 6.95e9
    assert len(synth.shards(specs, synth.DEFAULT_SHARD_BYTES)) == 3


def test_activations_stay_finite_and_bounded_over_depth(tmp_path):
    from deamoe_trt.importers.hf_lm import import_hf_lm
    from deamoe_trt.lm.checkpoint import load_lm

    hf = {**tiny_config("olmoe-1b-7b"), "num_hidden_layers": 24, "torch_dtype": "float32"}
    synth.synthesize(hf, tmp_path / "synth")
    import_hf_lm(tmp_path / "synth", tmp_path / "lm")
    lm = load_lm(tmp_path / "lm").model
    rms = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: rms.append(out[0].pow(2).mean().sqrt())) for b in lm.layers]
    with torch.no_grad():
        logits = lm(torch.arange(3, 67).reshape(2, 32)).logits
    for h in hooks:
        h.remove()
    assert bool(torch.isfinite(logits).all())
    assert len(rms) == 24 and max(float(r) for r in rms) < 4.0  # the stream grows, but slowly


def test_same_seed_writes_the_same_bytes_another_seed_other_weights(tmp_path):
    hf = tiny_config("qwen3-30b-a3b")
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        synth.synthesize(hf, tmp_path / name, seed=seed)
    a, b, c = ((tmp_path / n / "model.safetensors").read_bytes() for n in "abc")
    assert a == b and a != c and len(a) == len(c)


def test_layers_keeps_the_first_blocks_and_their_layer_types():
    hf = synth.with_layers(synth.read_config("gpt-oss-20b"), 3)
    assert hf["num_hidden_layers"] == 3 and hf["layer_types"] == [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    ]
    with pytest.raises(UsageError, match="--layers 25 must be in"):
        synth.with_layers(synth.read_config("gpt-oss-20b"), 25)


def test_too_little_disk_is_refused_before_writing_with_the_bytes_needed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(synth, "free_bytes", lambda _path: 10**6)
    out = tmp_path / "big"
    assert synth.main(["--config", "olmoe-1b-7b", "-o", str(out), "--layers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs" in err and "1,000,000 are free" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unknown_config_and_architecture_are_refused(tmp_path, capsys):
    assert synth.main(["--config", "no-such-model", "-o", str(tmp_path / "x")]) == 2
    assert "olmoe-1b-7b" in capsys.readouterr().err
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 8, "vocab_size": 8, "num_hidden_layers": 1}))
    with pytest.raises(UsageError, match="unknown architecture 'llama'"):
        synth.synthesize(synth.read_config(str(bad)), tmp_path / "y")
