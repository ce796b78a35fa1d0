"""generate --runtime cpu: the language model with its DeaMoE FFNs on deamoe-trt's CPU kernel
decodes the same tokens as the PyTorch reference, and the CLI streams them with TTFT/TPOT."""

from __future__ import annotations

import pytest
import torch

from deamoe_trt.cli.main import main
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.runtimes.cpu_kernel import CpuDecoder
from deamoe_trt.runtimes.decode import generate
from deamoe_trt.runtimes.torch import TorchDecoder

SAMPLE = str(TINY_LM)


# Tiny models: PyTorch's intra-op threads only add fork/join waits on a small machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def test_cpu_decoder_matches_the_reference_logits_and_tokens():
    model = load_lm(SAMPLE).model
    ids = list(b"The tiny model ")
    cpu, ref = CpuDecoder(model, threads=1), TorchDecoder(model)
    a, b = cpu.prefill(ids), ref.prefill(ids)
    assert abs(a - b).max() <= 1e-4 * abs(b).max()
    for token in b"says":
        a, b = cpu.step(token), ref.step(token)
        assert abs(a - b).max() <= 1e-4 * abs(b).max()
    for twin in ("deamoe", "vanilla"):
        m = model.twin(twin)
        assert generate(CpuDecoder(m, threads=1), ids, 24).new_ids == generate(TorchDecoder(m), ids, 24).new_ids


def test_generate_runtime_cpu_streams_text_and_times_it(capsys):
    code = main(["generate", SAMPLE, "--prompt", "The cat", "--max-new-tokens", "12", "--runtime", "cpu"])
    out = capsys.readouterr().out
    assert code == 0
    loaded = load_lm(SAMPLE)
    want = generate(TorchDecoder(loaded.model), list(b"The cat"), 12).new_ids
    assert "The cat" + loaded.tokenizer.decode(want) in out
    assert "cpu" in out and "TPOT ms" in out and "TTFT ms" in out


def test_cpu_decoder_leaves_dense_blocks_to_pytorch():
    from deamoe_trt.lm.config import LMConfig
    from deamoe_trt.lm.model import DeaMoELM

    config = load_lm(SAMPLE).model.config.replace(dense_layers=(1,), dense_intermediate_size=48)
    model = DeaMoELM.random(LMConfig.from_dict(config.to_dict()), seed=3)
    decoder = CpuDecoder(model, threads=1)
    assert sorted(decoder.ffns) == [0, 2]
    ids = [5, 9, 77, 31]
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0, -1].numpy()
    got = decoder.prefill(ids)
    assert abs(got - want).max() <= 1e-4 * abs(want).max()


def test_the_cpu_runtime_decodes_on_the_native_step_where_it_can():
    from deamoe_trt import runtimes
    from deamoe_trt.cpu.model_step import NativeDecoder
    from deamoe_trt.errors import UsageError
    from deamoe_trt.lm.model import DeaMoELM

    runtime = runtimes.get("cpu")
    model = load_lm(SAMPLE).model
    ids = list(b"The tiny model ")
    for twin in ("deamoe", "expanded", "vanilla"):
        native = runtime.decoder(model, threads=1, twin=twin)
        assert isinstance(native, NativeDecoder)
        want = generate(TorchDecoder(model.twin(twin)), ids, 24).new_ids
        assert generate(native, ids, 24).new_ids == want
    assert isinstance(runtime.decoder(model, threads=1, step="torch"), CpuDecoder)
    mla = model.config.replace(
        num_key_value_heads=model.config.num_heads,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        head_dim=8,
    )
    assert isinstance(runtime.decoder(DeaMoELM.random(mla, seed=1), threads=1), CpuDecoder)
    with pytest.raises(UsageError, match="step must be one of native, torch"):
        runtime.decoder(model, threads=1, step="fast")


def test_native_decoders_of_a_pool_share_weights_and_keep_their_own_caches():
    from deamoe_trt import runtimes

    model = load_lm(SAMPLE).model
    pool = runtimes.get("cpu").decoder_pool(model, threads=1)
    a, b = pool.acquire(), pool.acquire()
    assert a.model is b.model
    ref = TorchDecoder(model)
    want = ref.prefill(list(b"Once"))
    b.prefill(list(b"Other text"))
    got = a.prefill(list(b"Once"))
    b.step(5)
    step = ref.step(7)
    assert abs(a.step(7) - step).max() <= 1e-5 * abs(step).max()
    assert abs(got - want).max() <= 1e-5 * abs(want).max()
