"""`build_engine` against a fake TensorRT: what it asks TensorRT 10 and 11 for, and its failures."""

from __future__ import annotations

import io

import onnx
import pytest

from deamoe_trt import contract
from deamoe_trt.errors import DeaMoEError, MissingDependencyError, UsageError
from deamoe_trt.trt import builder as bld
from deamoe_trt.trt import targets as tg
from deamoe_trt.trt.builder import BuildOptions, build_engine, precision_plan

from . import fake_tensorrt
from .conftest import A40, AGX_ORIN, H200, ORIN_NANO, export_model

ORIN = tg.get_target("orin")
H200_PROFILE = tg.get_target("h200")


# --- precision_plan: pure ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "dtype", "target", "forced", "strong", "flags"),
    [
        # TensorRT 10: a reduced-precision model keeps its dtype exactly.
        ((10, 3), "fp16", ORIN, None, True, ()),
        ((10, 3), "bf16", H200_PROFILE, None, True, ()),
        # TensorRT 10: a float32 model for an fp16/bf16 target is lowered by flag.
        ((10, 3), "fp32", ORIN, None, False, ("FP16",)),
        ((10, 8), "fp32", H200_PROFILE, None, False, ("BF16",)),
        # Forced either way.
        ((10, 3), "fp32", ORIN, True, True, ()),
        ((10, 3), "fp16", ORIN, False, False, ("FP16",)),
        # A model from elsewhere: TensorRT 10's default, weakly typed, with the target's flag.
        ((10, 3), None, ORIN, None, False, ("FP16",)),
        # TensorRT 11: strongly typed, always.
        ((11, 1), "fp32", ORIN, None, True, ()),
        ((11, 0), "fp16", ORIN, True, True, ()),
        ((11, 1), None, H200_PROFILE, None, True, ()),
    ],
)
def test_precision_plan(version, dtype, target, forced, strong, flags):
    plan = precision_plan(version, dtype, target, forced)
    assert (plan.strongly_typed, plan.flags) == (strong, flags)


def test_precision_notes():
    assert precision_plan((10, 3), "fp16", ORIN, None).note is None
    assert "export with --dtype fp16" in precision_plan((10, 3), "fp32", ORIN, None).note
    assert "the engine runs fp32" in precision_plan((11, 1), "fp32", ORIN, None).note
    assert "the engine runs fp16" in precision_plan((10, 3), "fp16", H200_PROFILE, None).note


def test_tensorrt_11_refuses_weak_typing():
    with pytest.raises(UsageError, match="strongly typed networks only"):
        precision_plan((11, 1), "fp32", ORIN, False)


# --- build_engine on a fake TensorRT ----------------------------------------------------


@pytest.fixture
def plugin_loaded(monkeypatch):
    """Pretend the plugin library loads (ctypes cannot load a fake file)."""
    calls = []

    def fake_load(choice, trt=None):
        calls.append(choice)
        return str(choice.path) if choice.kind == "library" else "python (QDP deamoe_trt::DeaMoE)"

    monkeypatch.setattr(bld, "load_plugin", fake_load)
    return calls


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "libdeamoe_plugin.so"
    path.write_bytes(b"\x7fELF fake")
    return path


def options(model, tmp_path, **kw):
    kw.setdefault("output", tmp_path / "out" / "model.engine")
    kw.setdefault("timing_cache", str(tmp_path / "timing.cache"))
    return BuildOptions(model=model, **kw)


def test_tensorrt_10_fp16_model_on_orin(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt("10.3.0")
    progress = io.StringIO()
    result = build_engine(
        options(tiny_fp16, tmp_path, target="orin", plugin=str(plugin_file), gpu=AGX_ORIN), progress=progress
    )
    network, config = trt.networks[0], trt.configs[0]
    assert network.flags == 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert config.flags == set()
    assert config.pools == {trt.MemoryPoolType.WORKSPACE: ORIN.workspace_bytes}
    assert config.builder_optimization_level == ORIN.optimization_level
    # max tokens from the export's metadata (32), opt decode-sized (1 on Orin)
    assert config.profiles[0].shapes == {"hidden_states": ((1, 64), (1, 64), (32, 64))}
    assert trt.parsed == [("file", str(tiny_fp16), None)]
    assert result.engine.read_bytes().startswith(b"ENGINE:")
    assert result.tokens == (1, 1, 32) and result.strongly_typed and result.target == "orin"
    assert (tmp_path / "timing.cache").read_bytes() == b"+tuned"
    assert not list(result.engine.parent.glob(".*.tmp"))  # atomic write left nothing behind
    assert plugin_loaded[0].path == plugin_file.resolve()
    text = progress.getvalue()
    assert "target orin on Orin (sm_87)" in text and "Tactic selection" in text
    assert "wrote" in result.lines()[0]


def test_tensorrt_10_fp32_model_is_lowered_by_flag(fake_trt, tiny_fp32, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt("10.8.0", network_inputs=[("hidden_states", (-1, 64), fake_tensorrt.DataType.FLOAT)])
    result = build_engine(
        options(tiny_fp32, tmp_path, plugin=str(plugin_file), gpu=A40, max_tokens=8), progress=io.StringIO()
    )
    assert trt.networks[0].flags == 0
    assert trt.configs[0].flags == {trt.BuilderFlag.FP16}
    assert trt.configs[0].profiles[0].shapes["hidden_states"] == ((1, 64), (4, 64), (8, 64))
    assert not result.strongly_typed and result.precision == "fp32, fp16"
    assert any("BuilderFlag.FP16" in note for note in result.notes)


def test_tensorrt_11_is_strongly_typed(fake_trt, tiny_fp32, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt("11.1.0")
    assert not hasattr(trt.BuilderFlag, "FP16")
    result = build_engine(
        options(tiny_fp32, tmp_path, target="h200", plugin=str(plugin_file), gpu=H200), progress=io.StringIO()
    )
    assert trt.networks[0].flags == 0  # the flag is deprecated and ignored in 11: not set
    assert trt.configs[0].flags == set()
    assert result.strongly_typed
    assert any("the engine runs fp32" in note for note in result.notes)
    with pytest.raises(UsageError, match="strongly typed networks only"):
        build_engine(options(tiny_fp32, tmp_path, plugin=str(plugin_file), gpu=H200, strongly_typed=False))


def test_gpu_mismatch_is_refused_before_building(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt()
    with pytest.raises(UsageError, match="not portable"):
        build_engine(options(tiny_fp16, tmp_path, target="orin", plugin=str(plugin_file), gpu=A40))
    assert trt.networks == [] and not plugin_loaded


def test_max_tokens_checked_against_the_picked_target(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    fake_trt()
    with pytest.raises(UsageError, match="orin-nano target's limit of 256"):
        build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=ORIN_NANO, max_tokens=1000))


def test_model_max_tokens_above_the_limit(fake_trt, tmp_path, plugin_loaded, plugin_file):
    fake_trt()
    model = export_model(tmp_path, max_tokens=512)
    with pytest.raises(UsageError, match="--max-tokens 512 is above the orin-nano"):
        build_engine(options(model, tmp_path, plugin=str(plugin_file), gpu=ORIN_NANO))


def test_explicit_target_checks_need_no_tensorrt(tiny_fp16, tmp_path):
    # Without TensorRT (this machine), the numbers are still checked first: a usage error, exit 2.
    with pytest.raises(UsageError, match="limit of 1024"):
        build_engine(options(tiny_fp16, tmp_path, target="orin", max_tokens=4096))
    with pytest.raises(MissingDependencyError, match="TensorRT is not installed"):
        build_engine(options(tiny_fp16, tmp_path, target="orin"))


def test_plugin_model_without_a_plugin(fake_trt, tiny_fp16, tmp_path, no_plugin_search):
    fake_trt()
    with pytest.raises(
        MissingDependencyError, match=r"has DeaMoE plugin nodes but no plugin was found.*cmake -S plugins"
    ):
        build_engine(options(tiny_fp16, tmp_path, gpu=AGX_ORIN))


def test_ort_form_is_refused(tmp_path):
    model = export_model(tmp_path, form="ort", dtype="fp32")
    with pytest.raises(UsageError, match="TensorRT cannot parse"):
        build_engine(options(model, tmp_path))


def test_parse_errors(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    fake_trt(parse_errors=["In node 0 (importFallbackPluginImporter): Plugin not found, are the plugin name DeaMoE"])
    with pytest.raises(MissingDependencyError, match="no usable DeaMoE plugin"):
        build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN))
    fake_trt(parse_errors=["bad opset", "second"])
    with pytest.raises(UsageError, match=r"could not parse .*: bad opset \(and 1 more\)"):
        build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN))


def test_failed_build_leaves_the_old_engine(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    fake_trt(build_fails=True)
    output = tmp_path / "model.engine"
    output.write_bytes(b"old")
    with pytest.raises(DeaMoEError, match="could not build the engine"):
        build_engine(options(tiny_fp16, tmp_path, output=output, plugin=str(plugin_file), gpu=AGX_ORIN))
    assert output.read_bytes() == b"old"
    assert not list(tmp_path.glob(".*.tmp"))


def test_progress_without_a_progress_monitor(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt(progress=False)
    build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN), progress=io.StringIO())
    assert trt.configs[0].progress_monitor is None


def test_timing_cache_choices(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fake_trt()
    result = build_engine(
        options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN, timing_cache=None), progress=io.StringIO()
    )
    assert result.timing_cache.endswith("deamoe-trt/timing/orin-sm_87-trt10.3.cache")
    result = build_engine(
        options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN, timing_cache="none"),
        progress=io.StringIO(),
    )
    assert result.timing_cache is None
    stale = tmp_path / "stale.cache"
    stale.write_bytes(b"other-gpu")
    progress = io.StringIO()
    build_engine(
        options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN, timing_cache=str(stale)), progress=progress
    )
    assert "does not match this GPU" in progress.getvalue()
    assert stale.read_bytes() == b"+tuned"


def test_workspace_override(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    trt = fake_trt()
    build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=AGX_ORIN, workspace_mib=64))
    assert trt.configs[0].pools[trt.MemoryPoolType.WORKSPACE] == 64 << 20


def test_python_plugin_route_parses_the_retargeted_model(fake_trt, tiny_fp16, tmp_path, plugin_loaded):
    trt = fake_trt("10.8.0")
    build_engine(options(tiny_fp16, tmp_path, plugin="python", gpu=AGX_ORIN), progress=io.StringIO())
    kind, path, data = trt.parsed[0]
    assert kind == "bytes" and path == str(tiny_fp16)  # external data resolves next to the original
    node = next(n for n in onnx.load_from_string(data).graph.node if n.op_type == "DeaMoE")
    assert len(node.input) == len(contract.INPUTS)  # every input, absent ones as placeholders
    namespace = next(a for a in node.attribute if a.name == "plugin_namespace")
    assert namespace.s == b"deamoe_trt"


def test_output_checks(tiny_fp16, tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        build_engine(options(tiny_fp16, tmp_path, output=tmp_path))
    with pytest.raises(UsageError, match="overwrite the ONNX model"):
        build_engine(options(tiny_fp16, tmp_path, output=tiny_fp16))
    with pytest.raises(UsageError, match="no model file"):
        build_engine(options(tmp_path / "missing.onnx", tmp_path))
    not_onnx = tmp_path / "config.json"
    not_onnx.write_text('{"a": 1}')
    with pytest.raises(UsageError):
        build_engine(options(not_onnx, tmp_path))


def test_the_export_metadata_lands_beside_the_engine(fake_trt, tiny_fp16, tmp_path, plugin_loaded, plugin_file):
    import onnx

    from deamoe_trt.export.metadata import engine_info, engine_metadata_path, export_info

    fake_trt("10.8.0")
    result = build_engine(options(tiny_fp16, tmp_path, plugin=str(plugin_file), gpu=A40), progress=io.StringIO())
    assert engine_info(result.engine) == export_info(onnx.load(str(tiny_fp16), load_external_data=False))
    # A later build of a model from elsewhere leaves no stale metadata behind.
    plain = tmp_path / "plain.onnx"
    model = onnx.load(str(tiny_fp16), load_external_data=False)
    del model.metadata_props[:]
    onnx.save(model, str(plain))
    build_engine(options(plain, tmp_path, plugin=str(plugin_file), gpu=A40), progress=io.StringIO())
    assert not engine_metadata_path(result.engine).exists() and engine_info(result.engine) is None
