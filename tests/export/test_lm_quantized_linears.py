"""export-lm of a language model whose attention, dense-MLP and head projections are stored
quantized (LMConfig.quantized_linears): every form keeps their codes packed in the file, in
the [in, out] layout a MatMul reads, and dequantizes them in the graph; ONNX Runtime's logits
against the PyTorch model with the same quantized weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto

from configs import LINEARS_MICRO_LM, QUANTIZABLE_MICRO_LM
from deamoe_trt.errors import UsageError
from deamoe_trt.export.lm import build_lm_model, export_lm
from deamoe_trt.lm import DeaMoELM
from deamoe_trt.quant import QuantConfig, unpack, zero_point
from deamoe_trt.runtimes.onnxruntime import OrtDecoder, session_options
from deamoe_trt.runtimes.torch import TorchDecoder
from deamoe_trt.validation.lm import validate_lm
from deamoe_trt.validation.report import ORT_CPU_INT8_TOLERANCE
from lm_reference import dequantized_model, logits_of

PARTS = ("attention", "dense", "head")
CONFIG = LINEARS_MICRO_LM
# fp32: DequantizeLinear computes (q - zero point) * scale in float32, exactly as quant.dequantize
# does, so the graph runs the PyTorch model's weights and only the order of sums differs.
FP32 = 1e-5
# fp16 activations and fp16 scales (rounded from the checkpoint's float32 ones).
FP16 = 2e-2

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def float_model():
    return DeaMoELM.random(CONFIG, seed=5).eval()


@pytest.fixture(scope="module", params=[4, 8], ids=["int4", "int8"])
def quantized(request, float_model):
    return float_model.quantized(QuantConfig(request.param, 16), linears=PARTS)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def projections(model: DeaMoELM) -> list[str]:
    """The weight names of the model's quantized projections ("<prefix>.weight")."""
    moe = tuple(f"layers.{i}.mlp." for i in model.moe_layers())
    return [
        n.removesuffix(".qweight")
        for n in model.state_dict()
        if n.endswith(".weight.qweight") and not n.startswith(moe)
    ]


def initializer_codes(tensor: onnx.TensorProto) -> np.ndarray:
    """The codes of an int4/uint4/int8/uint8 initializer as int16, in its shape (ONNX packs 4-bit
    types two a byte over the flattened tensor, low nibble first; signed types two's complement)."""
    raw = np.frombuffer(tensor.raw_data, dtype=np.uint8)
    count = int(np.prod(tensor.dims))
    if tensor.data_type in (TensorProto.UINT4, TensorProto.INT4):
        codes = np.stack((raw & 0x0F, raw >> 4), axis=-1).reshape(-1)[:count].astype(np.int16)
        bits = 4
    else:
        codes, bits = raw.astype(np.int16), 8
    if tensor.data_type in (TensorProto.INT4, TensorProto.INT8):
        codes = np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
    return codes.reshape(list(tensor.dims))


@pytest.mark.parametrize("form", ["ort", "onnx"])
def test_logits_match_the_pytorch_model_with_the_same_quantized_weights(quantized, form):
    want = logits_of(TorchDecoder(quantized))
    got = logits_of(OrtDecoder.from_model(quantized, form=form))
    bits = quantized.config.quantization.bits
    # The ort form's FFNs are QMoE, which runs 8-bit blocks with int8 activations (ONNX Runtime's
    # documented behaviour): the product's tolerance for it.
    tolerance = ORT_CPU_INT8_TOLERANCE[0] if form == "ort" and bits == 8 else FP32
    assert relative_error(got, want) <= tolerance


def test_the_reference_is_the_dequantized_float_model(quantized):
    """What the exports are held against: the quantized PyTorch model is quant.dequantize's weights."""
    np.testing.assert_allclose(
        logits_of(TorchDecoder(quantized)), logits_of(TorchDecoder(dequantized_model(quantized))), atol=1e-5, rtol=1e-5
    )


def test_plugin_form_runs_the_projections_from_signed_codes(quantized):
    """Each FFN stays one DeaMoE node (run here through the reference op); the projections are
    signed codes without a zero point, as TensorRT's DequantizeLinear takes them."""
    proto = build_lm_model(quantized, "plugin")
    assert sum(n.op_type == "DeaMoE" for n in proto.graph.node) == len(quantized.moe_layers())
    bits = quantized.config.quantization.bits
    dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dq) == len(projections(quantized)) and all(len(n.input) == 2 for n in dq)
    inits = {t.name: t for t in proto.graph.initializer}
    state = quantized.state_dict()
    for name in projections(quantized):
        codes = inits[f"{name}.qweight"]
        assert codes.data_type == (TensorProto.INT4 if bits == 4 else TensorProto.INT8)
        want = unpack(state[f"{name}.qweight"], bits).numpy().astype(np.int16).T - zero_point(bits)
        np.testing.assert_array_equal(initializer_codes(codes), want)
    got = logits_of(OrtDecoder.from_model(quantized, form="plugin"))
    assert relative_error(got, logits_of(TorchDecoder(quantized))) <= FP32


def test_codes_stay_packed_in_the_layout_a_matmul_reads(quantized):
    """Each projection's codes [out, in] go in as the [in, out] weight of its MatMul, still two
    int4 codes a byte, with its scales [in / group, out] and DequantizeLinear along axis 0."""
    quant = quantized.config.quantization
    proto = build_lm_model(quantized, "onnx")
    inits = {t.name: t for t in proto.graph.initializer}
    dq = {n.input[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    state = quantized.state_dict()
    names = projections(quantized)
    assert len(names) == 3 * 4 + 3 + 1  # q/k/v/o of 3 blocks, the dense block's gate/up/down, the head
    for name in names:
        assert name not in inits  # no float copy
        codes, scales = inits[f"{name}.qweight"], inits[f"{name}.scales"]
        out_features, groups = state[f"{name}.scales"].shape
        in_features = groups * quant.group_size
        assert codes.data_type == (TensorProto.UINT4 if quant.bits == 4 else TensorProto.UINT8)
        assert list(codes.dims) == [in_features, out_features]
        assert len(codes.raw_data) == in_features * out_features * quant.bits // 8
        want = unpack(state[f"{name}.qweight"], quant.bits).numpy().T
        np.testing.assert_array_equal(initializer_codes(codes), want)
        assert scales.raw_data == state[f"{name}.scales"].T.contiguous().numpy().tobytes()
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq[codes.name].attribute}
        assert attrs == {"axis": 0, "block_size": quant.group_size}


def test_onnx_runtime_reads_the_packed_codes_through_matmulnbits(quantized, tmp_path):
    """ONNX Runtime fuses each projection's DequantizeLinear and MatMul into MatMulNBits, which
    keeps the codes packed, rather than dequantizing every weight on every run."""
    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(
        build_lm_model(quantized, "onnx").SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    ops = [n.op_type for n in onnx.load(tmp_path / "optimized.onnx").graph.node]
    assert ops.count("MatMulNBits") == len(projections(quantized))


def test_the_file_saves_what_packed_codes_save_over_float_projections(float_model, tmp_path):
    """The int4 file is smaller than the FFN-only int4 file by the projections' float32 bytes less
    their packed codes, scales and zero points, less the names and DequantizeLinear node each
    adds (under 400 bytes each, 6.4 KB in all; codes stored a byte each would cost 10 KB more)."""
    quant = QuantConfig(4, 16)
    ffn_only, full = float_model.quantized(quant), float_model.quantized(quant, linears=PARTS)
    sizes = {}
    for label, model in (("ffn", ffn_only), ("full", full)):
        sizes[label] = export_lm(model, tmp_path / f"{label}.onnx", "onnx").stat().st_size
    saved = 0
    for name in projections(full):
        n = full.state_dict()[f"{name}.qweight"].numel() * 2  # weights: two int4 codes a byte
        groups = n // quant.group_size
        saved += 4 * n - (n // 2 + 4 * groups + (groups + 1) // 2)
    assert saved - 400 * len(projections(full)) <= sizes["ffn"] - sizes["full"] <= saved


def test_fp16_export_runs_close_to_the_quantized_model(float_model):
    quantized = float_model.quantized(QuantConfig(4, 16), linears=PARTS)
    got = logits_of(OrtDecoder.from_model(quantized, form="onnx", dtype="fp16"))
    assert relative_error(got, logits_of(TorchDecoder(quantized))) <= FP16


def test_latent_attention_projections_are_dequantized_in_the_graph():
    """DeepSeek's latent attention: kv_b_proj's codes stay packed and its absorbed halves are
    cut from the dequantized weight in the graph."""
    mla = QUANTIZABLE_MICRO_LM.replace(
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        q_lora_rank=16,
        attention_multiplier=16**-0.5,
    )
    quantized = DeaMoELM.random(mla, seed=1).eval().quantized(QuantConfig(4, 16), linears=("attention", "head"))
    proto = build_lm_model(quantized, "onnx")
    inits = {t.name for t in proto.graph.initializer}
    assert "layers.0.self_attn.kv_b_proj.weight.qweight" in inits
    assert not any("absorbed" in n for n in inits)
    got = logits_of(OrtDecoder.from_model(quantized, form="onnx"))
    assert relative_error(got, logits_of(TorchDecoder(quantized))) <= FP32


def test_validate_passes_and_names_a_checkpoint_whose_head_differs(quantized, float_model, tmp_path):
    quantized.save_pretrained(tmp_path / "q")
    path = export_lm(quantized, tmp_path / "q.onnx", "onnx")
    assert validate_lm(path, tmp_path / "q", tokens=(3,)).passed
    other = DeaMoELM.random(CONFIG, seed=6).quantized(quantized.config.quantization, linears=PARTS)
    with pytest.raises(UsageError, match=r"lm_head\.weight\.scales differs"):
        validate_lm(path, other.save_pretrained(tmp_path / "other"), tokens=(3,))


def test_an_opset_below_21_is_refused_in_one_line(quantized):
    refused = r"^quantized attention/dense/head projections in the ort form need opset >= 21"
    with pytest.raises(UsageError, match=refused):
        build_lm_model(quantized, "ort", opset=17)
    assert build_lm_model(quantized, "ort").opset_import[0].version == 21
    assert onnx.checker.check_model(build_lm_model(quantized, "plugin")) is None
