"""`export-vllm` of int4/int8 checkpoints: compressed-tensors' pack-quantized layout whose
weights, unpacked and dequantized by compressed-tensors' own decompressor, are the
checkpoint's bit for bit; the re-packing undone gives the checkpoint's tensors back.

The decompressor test needs compressed-tensors (vLLM brings it: .venv-vllm); the rest runs
everywhere."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from deamoe_trt.integrations.vllm.compressed import checkpoint_state, compressed_state, scheme
from deamoe_trt.integrations.vllm.export import write_lm_dir
from deamoe_trt.lm import load_lm
from deamoe_trt.lm.checkpoint import stored_state
from deamoe_trt.quant import QuantConfig, dequantize

from .conftest import TINY_LM

# Both widths, FFNs alone and with quantized attention, dense-free head quantized too.
CASES = {
    "int4 g16": (QuantConfig(4, 16), ()),
    "int8 g32 + attention, head": (QuantConfig(8, 32), ("attention", "head")),
}


def quantized_tiny(quant: QuantConfig, linears: tuple[str, ...], dtype=torch.bfloat16):
    """The shipped tiny LM in dtype (its routers too), quantized round to nearest."""
    loaded = load_lm(TINY_LM)
    model = loaded.model.to(dtype)
    for i in model.moe_layers():
        model.layers[i].mlp.router.cast_weight(dtype)
    return model.quantized(quant, linears=linears), loaded.tokenizer


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    quant, linears = CASES[request.param]
    model, tokenizer = quantized_tiny(quant, linears)
    directory = write_lm_dir(model, tokenizer, tmp_path_factory.mktemp("vllm") / "q")
    return model, directory


def test_config_carries_llm_compressors_quantization_config(exported):
    model, directory = exported
    quant = model.config.quantization
    hf = json.loads((directory / "config.json").read_text())
    qc = hf["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    weights = qc["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (quant.bits, quant.group_size, True)
    assert weights["strategy"] == "group" and qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    quantized_attention = "attention" in model.config.quantized_linears
    assert ("layers.0.self_attn.q_proj" in qc["ignore"]) != quantized_attention
    assert ("lm_head" in qc["ignore"]) != ("head" in model.config.quantized_linears)


def test_each_group_is_three_packed_projections_per_expert(exported):
    model, directory = exported
    c, quant = model.config, model.config.quantization
    tensors = load_file(str(directory / "model.safetensors"))
    d, f_p, per_word = c.hidden_size, c.moe.private_intermediate_size, 32 // quant.bits
    for e in (0, c.moe.num_experts - 1):
        gate = tensors[f"layers.1.mlp.experts.{e}.gate_proj.weight_packed"]
        assert gate.dtype == torch.int32 and gate.shape == (f_p, d // per_word)
        assert tensors[f"layers.1.mlp.experts.{e}.down_proj.weight_scale"].shape == (d, f_p // quant.group_size)
        assert tensors[f"layers.1.mlp.experts.{e}.up_proj.weight_shape"].tolist() == [f_p, d]
    assert not [n for n in tensors if n.endswith(".qweight") and ".mlp.experts." in n]


def test_undoing_the_repacking_gives_the_checkpoints_tensors(exported):
    model, directory = exported
    tensors = load_file(str(directory / "model.safetensors"))
    original = stored_state(model.state_dict(), model.config)
    back = checkpoint_state(tensors, model.config)
    assert back.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name
    assert checkpoint_state(compressed_state(original, model.config), model.config).keys() == original.keys()


def test_compressed_tensors_decompressor_gives_the_checkpoints_weights_bit_for_bit(exported):
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors comes with vLLM (.venv-vllm)")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    del ct
    model, directory = exported
    quant = model.config.quantization
    ct_scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**scheme(quant)))
    tensors = load_file(str(directory / "model.safetensors"))
    state = model.state_dict()
    modules = sorted({n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed")})
    assert any(".mlp.departments." in m for m in modules) and any(".mlp.experts." in m for m in modules)

    def checkpoint_weight(module: str) -> torch.Tensor:
        """The module's weight as deamoe-trt's dequantize reads the checkpoint."""
        parts = module.split(".")
        if parts[-1] in ("gate_proj", "up_proj", "down_proj") and parts[-2].isdigit():
            stack, group, proj = ".".join(parts[:-2]), int(parts[-2]), parts[-1]
            kind = "down" if proj == "down_proj" else "gate_up"
            weight = dequantize(
                state[f"{stack}.{kind}.qweight"][group],
                state[f"{stack}.{kind}.scales"][group],
                quant.bits,
                quant.group_size,
            )
            if kind == "gate_up":
                half = weight.shape[0] // 2
                weight = weight[:half] if proj == "gate_proj" else weight[half:]
            return weight
        return dequantize(
            state[f"{module}.weight.qweight"], state[f"{module}.weight.scales"], quant.bits, quant.group_size
        )

    for module in modules:
        local = {s: tensors[f"{module}.{s}"] for s in ("weight_packed", "weight_scale", "weight_shape")}
        weight = PackedQuantizationCompressor.decompress(local, ct_scheme)["weight"]
        assert weight.dtype == torch.bfloat16
        assert torch.equal(weight, checkpoint_weight(module)), module
