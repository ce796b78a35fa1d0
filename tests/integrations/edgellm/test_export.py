"""`deamoe-trt export-edgellm` against TensorRT Edge-LLM's own exporter, on the CPU.

A tiny random Qwen3-MoE (transformers, with a chat template and a tokenizer made in code) is
exported by Edge-LLM itself (the anchor) and, imported as a DeaMoE LM (f_s = 0), by us; so are
its int8 form and a converted (D = 2, f_s > 0) int4 form, whose non-MoE tensors are the
source's. Every export must equal the anchor apart from the MoE layers (graph, initializers,
config and tokenizer files), and each DeaMoE node, cut out, must match the checkpoint's layer
on ONNX Runtime through the reference op. Edge-LLM runs in its own venv (scripts/setup.sh);
where it is absent these tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
import torch
from importers.hf_lm_models import CHAT_TEMPLATE, make_tokenizer

from deamoe_trt.cli.main import main as cli
from deamoe_trt.errors import DeaMoEError, MissingDependencyError, UsageError
from deamoe_trt.integrations.edgellm import SIDECAR, check_version, edgellm_python, export_edgellm
from deamoe_trt.integrations.edgellm.validate import LLM, MODEL, deamoe_nodes, graph_differences, node_checks, signature
from deamoe_trt.lm.shipped import TINY_LM

try:
    EDGELLM_PYTHON, WHY = edgellm_python(), ""
except MissingDependencyError as exc:
    EDGELLM_PYTHON, WHY = None, str(exc)
needs_edgellm = pytest.mark.skipif(EDGELLM_PYTHON is None, reason=WHY)


def build_qwen3_moe(directory: Path, *, chat_template: bool = True) -> None:
    """A random 3-block Qwen3-MoE (block 1 dense) saved like a downloaded one. Widths are
    multiples of 64 (Edge-LLM's Fp16MoePlugin layout); norm weights are randomised so that
    a misplaced one shows."""
    import transformers as T

    torch.manual_seed(0)
    config = T.Qwen3MoeConfig(
        vocab_size=96,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_hidden_layers=3,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        mlp_only_layers=[1],
        norm_topk_prob=True,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.1,
    )
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
    model.save_pretrained(directory)
    make_tokenizer().save(str(directory / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "bos_token": "<s>"}
    if chat_template:
        settings["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))


# Each export is a process of its own that spends most of its time importing and tracing on one
# core: the fixtures run two at a time, one per core of a two-core CI machine.
EXPORTS_AT_ONCE = 2


def edgellm_export(hf_dir: Path, out: Path) -> None:
    """Edge-LLM's own `tensorrt-edgellm-export` of hf_dir."""
    script = "import sys; from tensorrt_edgellm.scripts.export import main; sys.exit(main())"
    result = subprocess.run(
        [str(EDGELLM_PYTHON), "-c", script, str(hf_dir), str(out)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def save_variant(source: Path, out: Path, kind: str) -> Path:
    """The imported LM at source as an int8 LM, or converted to two departments and int4."""
    from deamoe_trt.convert.core import ConvertSettings, convert_layer
    from deamoe_trt.lm import DeaMoELM, load_lm
    from deamoe_trt.lm.checkpoint import save_lm
    from deamoe_trt.quant import QuantConfig

    loaded = load_lm(source)
    model = loaded.model
    if kind == "converted-int4":
        gen = torch.Generator().manual_seed(1)
        hidden = torch.randn(512, model.config.hidden_size, generator=gen)
        settings = ConvertSettings(departments=2, top_departments=1, shared_size=32)
        layers = {i: convert_layer(b.mlp, hidden, settings).layer for i, b in enumerate(model.layers) if b.is_moe}
        converted = DeaMoELM(model.config.replace(moe=next(iter(layers.values())).config))
        state = {
            k: v for k, v in model.state_dict().items() if not any(k.startswith(f"layers.{i}.mlp.") for i in layers)
        }
        for i, layer in layers.items():
            state |= {f"layers.{i}.mlp.{k}": v for k, v in layer.state_dict().items()}
        converted.load_state_dict(state)
        model = converted.quantized(QuantConfig(4, 32))
    else:
        model = model.quantized(QuantConfig(8, 64))
    save_lm(model, out, tokenizer=loaded.tokenizer)
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{"vanilla": Edge-LLM's export, "lm"/"int8"/"converted-int4": (LM dir, our export)}."""
    root = tmp_path_factory.mktemp("edgellm")
    hf = root / "hf"
    build_qwen3_moe(hf)
    from deamoe_trt.importers.hf_lm import import_hf_lm

    with ThreadPoolExecutor(max_workers=EXPORTS_AT_ONCE) as pool:
        vanilla = pool.submit(edgellm_export, hf, root / "vanilla")
        import_hf_lm(hf, root / "lm")
        lms = {"lm": root / "lm"}
        for kind in ("int8", "converted-int4"):
            lms[kind] = save_variant(root / "lm", root / f"lm-{kind}", kind)
        ours = {kind: pool.submit(export_edgellm, lm, root / f"ours-{kind}") for kind, lm in lms.items()}
        vanilla.result()
        return {"vanilla": root / "vanilla"} | {kind: (lm, ours[kind].result()) for kind, lm in lms.items()}


KINDS = ("lm", "int8", "converted-int4")


@needs_edgellm
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_export_equals_edgellms_own_apart_from_the_moe_nodes(exports, kind):
    _, ours = exports[kind]
    assert graph_differences(ours, exports["vanilla"]) == []
    ours_model = onnx.load(ours / LLM / MODEL)
    vanilla_model = onnx.load(exports["vanilla"] / LLM / MODEL)
    assert signature(ours_model).moe_layers == 2
    assert len(deamoe_nodes(ours_model)) == 2 and not deamoe_nodes(vanilla_model)
    assert not any(n.op_type.endswith("MoePlugin") for n in ours_model.graph.node)


@needs_edgellm
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_each_deamoe_node_matches_the_reference_on_onnx_runtime(exports, kind):
    lm, ours = exports[kind]
    checks = node_checks(ours, lm)
    assert [c.layer for c in checks] == [0, 2]
    for check in checks:
        assert check.weights_match, check
        assert check.max_abs_error <= check.tolerance, check


@needs_edgellm
@pytest.mark.slow
def test_quantized_nodes_carry_the_checkpoints_bits_and_departments(exports):
    _, ours = exports["converted-int4"]
    node = deamoe_nodes(onnx.load(ours / LLM / MODEL, load_external_data=False))[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["weight_bits"], attrs["weight_group_size"]) == (4, 32)
    assert (attrs["num_departments"], attrs["shared_intermediate_size"]) == (2, 32)
    sidecar = json.loads((ours / SIDECAR).read_text())
    assert sidecar["weight_bits"] == 4 and sidecar["moe_layers"] == [0, 2]
    assert sidecar["plugin"]["op_type"] == node.op_type == "DeaMoE"


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_gptq_source(hf: Path, out: Path, group_size: int) -> None:
    """hf with its attention and dense-MLP projections as a symmetric int4 GPTQ checkpoint, as GPTQ tools write
    one: codes round to nearest (deamoe_trt.quant.quantize_rtn, what `quantize --linears` stores),
    eight 4-bit codes per int32 along the input (input 8i + k in bits 4k..4k+3), zero point 8
    stored as such, fp16 scales [groups, out], g_idx; quantization_config says so."""
    import shutil

    import numpy as np
    from safetensors.torch import load_file, save_file

    from deamoe_trt.quant import QuantConfig, quantize_rtn, unpack

    shutil.copytree(hf, out)
    tensors = load_file(str(hf / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(QUANTIZED_WEIGHTS)]:
        weight = tensors.pop(name)
        qweight, scales = quantize_rtn(weight, QuantConfig(4, group_size))
        codes = unpack(qweight, 4).numpy().astype(np.uint32).T  # [in, out]
        words = np.zeros((codes.shape[0] // 8, codes.shape[1]), np.uint32)
        for k in range(8):
            words |= codes[k::8] << np.uint32(4 * k)
        groups = codes.shape[0] // group_size
        prefix = name.removesuffix(".weight")
        tensors[f"{prefix}.qweight"] = torch.from_numpy(words.view(np.int32))
        zeros = np.full((groups, codes.shape[1] // 8), 0x88888888, np.uint32)
        tensors[f"{prefix}.qzeros"] = torch.from_numpy(zeros.view(np.int32))
        tensors[f"{prefix}.scales"] = scales.T.to(torch.float16).contiguous()
        tensors[f"{prefix}.g_idx"] = torch.arange(codes.shape[0], dtype=torch.int32) // group_size
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((hf / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "sym": True,
        "desc_act": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))


# Attention and the dense block's MLP (the MoE blocks' experts are under mlp.experts.).
QUANTIZED_WEIGHTS = tuple(f"{part}.{p}.weight" for part in ("self_attn", "layers.1.mlp") for p in PROJECTIONS)


@pytest.fixture(scope="module")
def gptq_exports(tmp_path_factory):
    """(Edge-LLM's export of a GPTQ int4 checkpoint of the source's attention and dense MLP, the
    imported LM quantized with --linears attention,dense at int4, our export of it)."""
    from deamoe_trt.importers.hf_lm import import_hf_lm
    from deamoe_trt.lm import load_lm
    from deamoe_trt.lm.checkpoint import save_lm
    from deamoe_trt.quant import QuantConfig

    root = tmp_path_factory.mktemp("edgellm-gptq")
    build_qwen3_moe(root / "hf")
    write_gptq_source(root / "hf", root / "hf-gptq", 64)
    with ThreadPoolExecutor(max_workers=EXPORTS_AT_ONCE) as pool:
        vanilla = pool.submit(edgellm_export, root / "hf-gptq", root / "vanilla")
        import_hf_lm(root / "hf", root / "lm")
        loaded = load_lm(root / "lm")
        save_lm(
            loaded.model.quantized(QuantConfig(4, 64), linears=("attention", "dense")),
            root / "lm-q",
            tokenizer=loaded.tokenizer,
        )
        ours = export_edgellm(root / "lm-q", root / "ours")
        vanilla.result()
    return root / "vanilla", root / "lm-q", ours


@needs_edgellm
@pytest.mark.slow
def test_int4_projections_export_as_edgellms_own_export_of_a_gptq_checkpoint(gptq_exports):
    vanilla, lm, ours = gptq_exports
    assert graph_differences(ours, vanilla) == []
    model = onnx.load(ours / LLM / MODEL)
    gemms = [n for n in model.graph.node if n.op_type.startswith("Int4GroupwiseGemm")]
    assert len(gemms) == 3 * 4 + 3  # q/k/v/o of 3 blocks, the dense block's gate/up/down
    # Each int4 GEMM's scales are the LM's, [groups, out] in fp16: every projection got its weights.
    from deamoe_trt.lm import load_lm

    state = load_lm(lm).model.state_dict()
    scales = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith(".scales")}
    moe = ("layers.0.mlp.", "layers.2.mlp.")
    projections = [n for n in state if n.endswith(".weight.scales") and not n.startswith(moe)]
    assert len(projections) == len(gemms)
    for name in projections:
        graph_name = f"_model.model.{name.removesuffix('.weight.scales')}.scales"
        assert (scales[graph_name] == state[name].T.half().numpy()).all(), name


@needs_edgellm
@pytest.mark.slow
def test_graph_comparison_sees_a_changed_norm_weight(exports):
    _, ours = exports["lm"]
    model = onnx.load(ours / LLM / MODEL)
    before = signature(model)
    norm = next(t for t in model.graph.initializer if t.name.startswith("q_norm_gamma"))
    array = onnx.numpy_helper.to_array(norm).copy()
    array[0] += 1
    norm.CopyFrom(onnx.numpy_helper.from_array(array, norm.name))
    assert signature(model).initializers != before.initializers


def test_lm_without_a_chat_template_is_refused_and_nothing_is_written(tmp_path, capsys):
    hf = tmp_path / "hf"
    build_qwen3_moe(hf, chat_template=False)
    from deamoe_trt.importers.hf_lm import import_hf_lm

    import_hf_lm(hf, tmp_path / "lm")
    capsys.readouterr()  # transformers' progress bars
    assert cli(["export-edgellm", str(tmp_path / "lm"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no chat template" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "lm"]


def test_lm_edgellm_cannot_represent_is_refused_in_one_line(capsys, tmp_path):
    tiny = TINY_LM  # no q/k norm, byte tokenizer
    assert cli(["export-edgellm", str(tiny), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "qk_norm is 'none'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("bits", "linears", "why"),
    [
        (8, ("attention", "dense"), "no weight-only int8 form"),
        (4, ("attention",), "but not its dense MLPs"),
        (4, ("attention", "dense"), "widths 16, 32, not multiples of 64"),  # Edge-LLM's int4 GEMM: 64
    ],
    ids=["int8", "without-dense", "narrow"],
)
def test_lm_with_quantized_projections_edgellm_cannot_take_is_refused_in_one_line(capsys, tmp_path, bits, linears, why):
    from configs import QUANTIZABLE_MICRO_LM
    from deamoe_trt.lm import DeaMoELM, save_lm
    from deamoe_trt.quant import QuantConfig

    model = DeaMoELM.random(QUANTIZABLE_MICRO_LM.replace(dense_intermediate_size=32), seed=0)
    save_lm(model.quantized(QuantConfig(bits, 16), linears=linears), tmp_path / "lm")
    assert cli(["export-edgellm", str(tmp_path / "lm"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert why in err and "--linears" in err
    assert not (tmp_path / "out").exists()


def test_edgellm_versions_outside_the_tested_range_are_refused():
    check_version("0.11.0")
    for version in ("0.10.2", "0.12.0", "1.0.0"):
        with pytest.raises(UsageError, match="outside the tested range"):
            check_version(version)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorrt_edgellm") is not None, reason="this Python has Edge-LLM")
def test_failed_export_leaves_no_partial_directory(tmp_path):
    """A Python without Edge-LLM: the driver fails, and -o stays absent."""
    hf = tmp_path / "hf"
    build_qwen3_moe(hf)
    from deamoe_trt.importers.hf_lm import import_hf_lm

    import_hf_lm(hf, tmp_path / "lm")
    with pytest.raises(DeaMoEError, match="needs tensorrt_edgellm"):
        export_edgellm(tmp_path / "lm", tmp_path / "out", python=sys.executable)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "lm"]


EAGER_SCRIPT = """
import torch
from deamoe_trt import DeaMoELayer, get_preset
from deamoe_trt.integrations.edgellm.family import DeaMoEBlock
from deamoe_trt.quant import QuantConfig

for quant in (None, QuantConfig(4, 16)):
    layer = DeaMoELayer.random(get_preset("tiny"), seed=3)
    layer = layer.quantized(quant) if quant else layer
    x = (torch.randn(9, 64, generator=torch.Generator().manual_seed(4)) * 0.5).half()
    got = DeaMoEBlock(layer)(x).float()
    half = layer.to(torch.float16)
    want = half.forward_routed(x, half.route(x)).float()
    print(float((got - want).abs().max()))
"""


@needs_edgellm
@pytest.mark.slow
def test_the_custom_ops_eager_kernel_is_the_reference():
    """Edge-LLM may run the model eagerly (its quantizer does): the op then computes the layer."""
    root = Path(__file__).resolve().parents[3]
    env = {"PYTHONPATH": str(root), "OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [str(EDGELLM_PYTHON), "-c", EAGER_SCRIPT], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    errors = [float(line) for line in result.stdout.split()]
    assert len(errors) == 2 and max(errors) <= 1e-3
