"""Whole Hugging Face MoE models imported as lm checkpoints decode exactly as transformers does.

For each family a tiny random model is built in code and saved (see hf_lm_models); the
import must give fp32 logits within 1e-5 relative of transformers' forward and the same 32
greedy tokens as transformers' generate (KV cache) in PyTorch and with the FFNs on the CPU
kernel (generate --runtime cpu), and, in the slow part, on
ONNX Runtime after export-lm in the ort and onnx forms and in the plugin form (its DeaMoE
nodes through the reference op).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from deamoe_trt.importers.hf_lm import import_hf_lm
from deamoe_trt.lm import load_lm
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.onnxruntime import OrtDecoder
from deamoe_trt.runtimes.torch import TorchDecoder

from .hf_lm_models import FAMILIES, build_hf_model, prompt_ids

NEW_TOKENS = 32


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request, tmp_path_factory):
    """(family, HF model, loaded lm checkpoint, transformers' 32 greedy tokens)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = build_hf_model(request.param, root / "hf")
    import_hf_lm(root / "hf", root / "lm")
    prompt = torch.tensor([prompt_ids()])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return request.param, hf, load_lm(root / "lm"), expected[0, prompt.shape[1] :].tolist()


def test_logits_match_transformers(imported):
    family, hf, loaded, _ = imported
    ids = torch.tensor([prompt_ids(48, seed=2), prompt_ids(48, seed=3)])
    with torch.no_grad():
        want = hf(ids).logits
        got = loaded.model(ids).logits
        # and through the cache: 40 tokens, then 8 one at a time
        cache = loaded.model(ids[:, :40]).past_key_values
        steps = []
        for t in range(40, 48):
            out = loaded.model(ids[:, t : t + 1], cache)
            cache = out.past_key_values
            steps.append(out.logits)
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 1e-5, family
    assert (torch.cat(steps, dim=1) - want[:, 40:]).abs().max() / scale < 1e-5, family


def test_the_import_keeps_the_architecture_transformers_built(imported):
    family, hf, loaded, _ = imported
    config = loaded.model.config
    for i, layer in enumerate(hf.model.layers):
        assert config.is_dense(i) == (not hasattr(layer.mlp, "gate")), (family, i)
        window = getattr(layer.self_attn, "sliding_window", None) or 0
        if family == "mixtral":
            window = hf.config.sliding_window or 0
        assert config.window(i) == window, (family, i)
    assert config.tie_word_embeddings == (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr())


def test_greedy_generation_equals_transformers_generate(imported):
    family, _, loaded, expected = imported
    result = generate(TorchDecoder(loaded.model), prompt_ids(), NEW_TOKENS)
    assert result.new_ids == expected, family


def test_greedy_generation_on_the_cpu_kernel_equals_transformers(imported):
    from deamoe_trt.runtimes.cpu_kernel import CpuDecoder

    family, _, loaded, expected = imported
    result = generate(CpuDecoder(loaded.model, threads=1), prompt_ids(), NEW_TOKENS)
    assert result.new_ids == expected, family


@pytest.mark.slow
@pytest.mark.parametrize("form", ["ort", "onnx", "plugin"])
def test_greedy_generation_on_onnx_runtime_equals_transformers(imported, form):
    family, _, loaded, expected = imported
    decoder = OrtDecoder.from_model(loaded.model, form=form, tokenizer=loaded.tokenizer)
    result = generate(decoder, prompt_ids(), NEW_TOKENS)
    assert result.new_ids == expected, (family, form)


def test_sharded_checkpoint_imports_to_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    hf = build_hf_model("qwen2_moe", tmp_path / "hf")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 3
    (tmp_path / "sharded" / "tokenizer.json").write_bytes((tmp_path / "hf" / "tokenizer.json").read_bytes())
    import_hf_lm(tmp_path / "hf", tmp_path / "one")
    import_hf_lm(tmp_path / "sharded", tmp_path / "many")
    one, many = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "many" / "model.safetensors")
    assert one.keys() == many.keys()
    for name, tensor in one.items():
        assert torch.equal(tensor, many[name]), name


def test_import_to_bf16_rounds_every_weight_once(tmp_path):
    hf = build_hf_model("qwen3_moe", tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "lm", dtype=torch.bfloat16)
    model = load_lm(tmp_path / "lm").model
    assert model.dtype == torch.bfloat16
    want = hf.model.layers[0].self_attn.q_norm.weight.to(torch.bfloat16)
    assert torch.equal(model.layers[0].self_attn.q_norm.weight, want)
    gate_up = hf.model.layers[0].mlp.experts.gate_up_proj.to(torch.bfloat16)
    assert torch.equal(model.layers[0].mlp.experts.gate_up, gate_up)


def test_a_killed_import_of_a_sharded_model_resumes_after_its_finished_blocks(tmp_path, monkeypatch, capsys):
    from deamoe_trt.importers import hf_lm

    hf = build_hf_model("qwen2_moe", tmp_path / "hf")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    (tmp_path / "sharded" / "tokenizer.json").write_bytes((tmp_path / "hf" / "tokenizer.json").read_bytes())
    import_hf_lm(tmp_path / "sharded", tmp_path / "whole")
    write = hf_lm._write_tensor
    written: list[str] = []

    def killed_in_block_1(writer, reader, name, recipe):  # after some of its tensors are written
        if name.startswith("layers.1.") and any(n.startswith("layers.1.") for n in written):
            raise KeyboardInterrupt
        written.append(name)
        write(writer, reader, name, recipe)

    monkeypatch.setattr(hf_lm, "_write_tensor", killed_in_block_1)
    with pytest.raises(KeyboardInterrupt):
        import_hf_lm(tmp_path / "sharded", tmp_path / "lm")
    assert not (tmp_path / "lm").exists() and (tmp_path / "lm.work").is_dir()
    finished = {n for n in written if not n.startswith("layers.1.")}  # the blocks before the kill
    written.clear()
    monkeypatch.setattr(hf_lm, "_write_tensor", lambda w, r, n, p: (written.append(n), write(w, r, n, p)))
    import_hf_lm(tmp_path / "sharded", tmp_path / "lm")
    assert "resuming" in capsys.readouterr().err
    assert written and finished and not finished & set(written)  # no finished block written again
    names = sorted(p.name for p in (tmp_path / "lm").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "whole").iterdir())
    for name in names:
        assert (tmp_path / "lm" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert not (tmp_path / "lm.work").exists()


def test_the_work_of_a_killed_import_with_other_arguments_is_set_aside(tmp_path, monkeypatch, capsys):
    from deamoe_trt.importers import hf_lm

    build_hf_model("qwen2_moe", tmp_path / "hf")
    import_hf_lm(tmp_path / "hf", tmp_path / "whole", dtype=torch.bfloat16)
    write = hf_lm._write_tensor

    def killed_in_block_1(writer, reader, name, recipe):
        if name.startswith("layers.1."):
            raise KeyboardInterrupt
        write(writer, reader, name, recipe)

    monkeypatch.setattr(hf_lm, "_write_tensor", killed_in_block_1)
    with pytest.raises(KeyboardInterrupt):
        import_hf_lm(tmp_path / "hf", tmp_path / "lm")  # fp32: another run's bytes
    monkeypatch.setattr(hf_lm, "_write_tensor", write)
    import_hf_lm(tmp_path / "hf", tmp_path / "lm", dtype=torch.bfloat16)
    assert "starting over" in capsys.readouterr().err
    weights = [(tmp_path / folder / "model.safetensors").read_bytes() for folder in ("lm", "whole")]
    assert weights[0] == weights[1]
