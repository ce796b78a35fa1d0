"""GGUF export of the vanilla twin: what the gguf package reads back, and what llama.cpp
computes from the file (its own perplexity tool) against the PyTorch reference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from deamoe_trt.config import DeaMoEConfig
from deamoe_trt.errors import UsageError
from deamoe_trt.integrations.llamacpp.export import byte_token_texts, write_gguf
from deamoe_trt.lm import DeaMoELM, LMConfig

gguf = pytest.importorskip("gguf")

# Qwen3-MoE's block at a size llama.cpp runs in milliseconds: per-head q/k norm, 2 KV heads
# for 4 query heads, a DeaMoE FFN whose vanilla twin has 8 experts of 32, top 2; 64 padding ids.
TINY = LMConfig(
    vocab_size=320,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    qk_norm="head",
    max_position_embeddings=256,
    rope_theta=10000.0,
    moe=DeaMoEConfig(
        hidden_size=64,
        num_departments=2,
        experts_per_department=4,
        shared_intermediate_size=16,
        private_intermediate_size=16,
        top_k=2,
        top_departments=1,
    ),
)


@pytest.fixture(scope="module")
def vanilla():
    return DeaMoELM.random(TINY, seed=3, dtype=torch.float16).vanilla()


@pytest.fixture(scope="module")
def f16_file(vanilla, tmp_path_factory):
    return write_gguf(vanilla, tmp_path_factory.mktemp("gguf") / "tiny-f16.gguf")


def test_file_holds_every_qwen3moe_tensor_with_the_twins_values(vanilla, f16_file):
    reader = gguf.GGUFReader(f16_file)
    tensors = {t.name: t for t in reader.tensors}
    # The architecture's tensor list as the gguf package (and llama.cpp's converter) defines it.
    kinds = gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE]
    expected = set()
    for kind in kinds:
        pattern = gguf.TENSOR_NAMES[kind]
        blocks = range(TINY.num_layers) if "{bid}" in pattern else [None]
        expected |= {pattern.format(bid=i) + ".weight" for i in blocks}
    assert set(tensors) == expected

    def values(name):
        t = tensors[name]
        return torch.from_numpy(np.array(t.data)).reshape([int(n) for n in reversed(t.shape)])

    layer = vanilla.layers[1]
    gate, up = layer.mlp.experts.gate_up.chunk(2, dim=1)
    assert torch.equal(values("blk.1.ffn_gate_exps.weight"), gate)
    assert torch.equal(values("blk.1.ffn_up_exps.weight"), up)
    assert torch.equal(values("blk.1.ffn_down_exps.weight"), layer.mlp.experts.down)
    assert torch.equal(values("blk.1.attn_k.weight"), layer.self_attn.k_proj.weight)
    assert values("blk.1.ffn_gate_inp.weight").dtype == torch.float32  # the router stays F32, as converted
    assert torch.equal(values("blk.1.ffn_gate_inp.weight"), layer.mlp.router.weight.float())
    assert torch.equal(values("output.weight"), vanilla.lm_head.weight)

    fields = reader.fields
    assert fields["general.architecture"].contents() == "qwen3moe"
    assert fields["qwen3moe.expert_count"].contents() == 8
    assert fields["qwen3moe.expert_used_count"].contents() == 2
    assert fields["qwen3moe.expert_feed_forward_length"].contents() == 32
    assert fields["qwen3moe.attention.head_count_kv"].contents() == 2
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False


def test_vocabulary_spells_bytes_as_gpt2_byte_level_bpe():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    texts = byte_token_texts(300)
    assert texts[:256] == [bytes_to_unicode()[b] for b in range(256)]
    assert len(set(texts)) == 300 and texts[256] == "[PAD256]"


def test_models_qwen3moe_cannot_express_are_refused_in_one_line(tmp_path):
    deamoe = DeaMoELM.random(TINY, seed=0)
    with pytest.raises(UsageError, match=r"^this model cannot be written as GGUF qwen3moe: .*DeaMoE departments") as e:
        write_gguf(deamoe, tmp_path / "x.gguf")
    assert "\n" not in str(e.value)
    no_norm = DeaMoELM.random(TINY.replace(qk_norm="none", qkv_bias=True), seed=0).vanilla()
    with pytest.raises(UsageError, match=r"q/k norm 'none'.*; attention biases"):
        write_gguf(no_norm, tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


N_CTX, CHUNKS = 64, 2


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    from deamoe_trt.bench.lm_bench import held_out_ids
    from deamoe_trt.lm.tokenizer import ByteTokenizer

    ids = held_out_ids(TINY.vocab_size)[: N_CTX * CHUNKS + 7]
    path = tmp_path_factory.mktemp("text") / "held-out.txt"
    path.write_text(ByteTokenizer(vocab_size=TINY.vocab_size).decode(ids.tolist()))
    return ids, path


def test_llama_cpp_computes_the_pytorch_reference_from_the_f16_file(vanilla, f16_file, held_out, tmp_path):
    """llama.cpp's log-probabilities at every position llama-perplexity counts match the
    PyTorch model's (float32 math on the same fp16 weights) within fp16 rounding, so its
    greedy next token is ours wherever ours is not a near tie; its perplexity is ours."""
    from llama_cpp_tools import llama_tools

    from deamoe_trt.integrations.llamacpp.bench import chunk_log_probs, chunked_perplexity, perplexity, read_logits

    tools = llama_tools()
    ids, text = held_out
    logits_file = tmp_path / "logits.bin"
    ppl = perplexity(tools, f16_file, text, n_ctx=N_CTX, threads=1, chunks=CHUNKS, logits=logits_file)
    theirs = read_logits(logits_file)
    # llama.cpp tokenized the text into exactly the byte tokenizer's ids, with no BOS.
    assert np.array_equal(theirs.tokens.reshape(-1), ids[: N_CTX * CHUNKS].numpy())

    reference = copy.deepcopy(vanilla).float().eval()
    ours = chunk_log_probs(reference, ids, N_CTX, CHUNKS).numpy()
    above = ~theirs.floored
    assert above.mean() > 0.99  # a random model spreads its probability: few entries at the 16-nat floor
    error = np.abs(theirs.log_probs - ours)[above]
    assert error.max() < 5e-3, error.max()  # measured 6e-4; the file's 16-bit steps are 1e-4
    top2 = np.sort(ours, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 1e-2
    assert clear.mean() > 0.9
    assert np.array_equal(theirs.log_probs.argmax(-1)[clear], ours.argmax(-1)[clear])
    assert ppl == pytest.approx(chunked_perplexity(reference, ids, N_CTX, CHUNKS), rel=2e-4)


def test_llama_quantize_files_count_their_own_block_sizes(f16_file, tmp_path):
    """Bytes per token of each file: every tensor at its ggml type's block size, the experts
    at top_k / N, one embedding row (the gguf package's block table as the expectation)."""
    from llama_cpp_tools import llama_tools

    from deamoe_trt.integrations.llamacpp.bench import bytes_per_token, quantize

    tools = llama_tools()
    d, vocab, f, n, k = 64, 320, 32, 8, 2
    attention = d * 64 + 2 * d * 32 + 64 * d
    f16 = TINY.num_layers * (2 * attention + 2 * 16 * 4 + 4 * 2 * d + n * d * 4 + k * 3 * d * f * 2) + d * 2
    f16 += vocab * d * 2 + 4 * d
    assert bytes_per_token(f16_file) == f16
    q4 = quantize(tools, f16_file, tmp_path / "q4.gguf", "Q4_0", threads=1)
    reader = gguf.GGUFReader(q4)
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_down_exps.weight"] == gguf.GGMLQuantizationType.Q4_0
    assert types["blk.0.ffn_gate_inp.weight"] == gguf.GGMLQuantizationType.F32  # llama.cpp keeps the router

    def size(name, count):
        block, nbytes = gguf.GGML_QUANT_SIZES[types[name]]
        return count // block * nbytes

    expected = size("token_embd.weight", d) + size("output.weight", vocab * d) + 4 * d
    for i in range(TINY.num_layers):
        b = f"blk.{i}."
        expected += sum(size(b + f"attn_{p}.weight", c) for p, c in (("q", 64 * d), ("k", 32 * d), ("v", 32 * d)))
        expected += size(b + "attn_output.weight", 64 * d) + 2 * 16 * 4 + 4 * 2 * d + n * d * 4
        expected += sum(size(b + f"ffn_{p}_exps.weight", n * d * f) for p in ("gate", "up", "down")) * k // n
    assert bytes_per_token(q4) == expected < f16 / 2


def test_llama_quantize_files_run_with_errors_in_the_order_of_their_bits(f16_file, held_out, tmp_path):
    """Q8_0 and Q4_0 files of the twin run through llama.cpp; against the F16 file's
    log-probabilities, Q4_0's error is several times Q8_0's, and both stay small."""
    from llama_cpp_tools import llama_tools

    from deamoe_trt.integrations.llamacpp.bench import perplexity, quantize, read_logits

    tools = llama_tools()
    _, text = held_out

    def log_probs(path):
        logits = tmp_path / f"{path.stem}.logits"
        perplexity(tools, path, text, n_ctx=N_CTX, threads=1, chunks=CHUNKS, logits=logits)
        return read_logits(logits).log_probs

    base = log_probs(f16_file)
    errors = {}
    for kind in ("Q8_0", "Q4_0"):
        quantized = quantize(tools, f16_file, tmp_path / f"tiny-{kind}.gguf", kind, threads=1)
        errors[kind] = float(np.abs(log_probs(quantized) - base).mean())
    assert errors["Q8_0"] < 0.01 and errors["Q4_0"] < 0.2
    assert errors["Q4_0"] > 4 * errors["Q8_0"], errors
