"""Model repositories: configs parse against Triton's schema and describe the exported graph."""

from pathlib import Path

import onnx
import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.errors import UsageError
from deamoe_trt.export import build_model, save_model
from deamoe_trt.integrations.triton import repo as triton
from deamoe_trt.layer import DeaMoEStack
from deamoe_trt.lm.shipped import TINY_LM
from deamoe_trt.presets import get_preset

pytest.importorskip("tritonclient.grpc", reason="tritonclient (the test extra) holds Triton's model config schema")
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

TRITON_TYPE = {onnx.TensorProto.FLOAT: model_config_pb2.TYPE_FP32, onnx.TensorProto.FLOAT16: model_config_pb2.TYPE_FP16}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exports")
    stack = DeaMoEStack.random(get_preset("tiny"), num_layers=1, seed=0)
    paths = {}
    for form, dtype, max_tokens in (("ort", "fp32", None), ("plugin", "fp16", 64)):
        model = build_model(stack, form, dtype, max_tokens=max_tokens)
        paths[form] = save_model(model, folder / f"layer-{form}.onnx")
    (folder / "layer.plan").write_bytes(b"an engine from `deamoe-trt build` (not read: no TensorRT here)")
    return folder, paths


def parse(path: Path):
    config = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def assert_matches_graph(config, onnx_path: Path, batched: bool):
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    for ours, theirs in ((config.input, graph.input), (config.output, graph.output)):
        assert [t.name for t in ours] == [v.name for v in theirs]
        for t, v in zip(ours, theirs, strict=True):
            shape = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            assert list(t.dims) == (shape[1:] if batched else shape)
            assert t.data_type == TRITON_TYPE[v.type.tensor_type.elem_type]


@pytest.mark.slow  # loads the tiny LM checkpoint and imports torch: ~5 s on the shared machine
def test_cli_writes_all_three_models_and_they_parse_against_triton_schema(exports, tmp_path, capsys):
    folder, paths = exports
    out = tmp_path / "repo"
    plugin = "/opt/deamoe/lib/libdeamoe_plugin.so"
    args = [
        "triton-repo",
        "-o",
        str(out),
        "--engine",
        str(folder / "layer.plan"),
        "--engine-onnx",
        str(paths["plugin"]),
    ]
    args += ["--plugin", plugin, "--ort", str(paths["ort"]), "--lm", str(TINY_LM), "--instances", "2", "--gpus", "0,1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.count("checked against Triton's model config schema") == 3
    assert f'--backend-config=tensorrt,plugins="{plugin}"' in printed
    assert f'plugins="{plugin}"' in (out / "README.md").read_text()

    engine = parse(out / "deamoe_trt" / "config.pbtxt")
    assert engine.platform == "tensorrt_plan" and (out / "deamoe_trt" / "1" / "model.plan").read_bytes().startswith(
        b"an"
    )
    # The plugin export records max_tokens 64 and its tokens dimension leads every tensor: Triton batches tokens.
    assert engine.max_batch_size == 64 and engine.HasField("dynamic_batching")
    assert_matches_graph(engine, paths["plugin"], batched=True)
    group = engine.instance_group[0]
    assert (group.count, group.kind, list(group.gpus)) == (2, model_config_pb2.ModelInstanceGroup.KIND_GPU, [0, 1])

    ort = parse(out / "deamoe_ort" / "config.pbtxt")
    assert ort.platform == "onnxruntime_onnx" and ort.max_batch_size == 0 and not ort.HasField("dynamic_batching")
    assert_matches_graph(ort, paths["ort"], batched=False)
    assert onnx.load(str(out / "deamoe_ort" / "1" / "model.onnx")).graph == onnx.load(str(paths["ort"])).graph

    lm = parse(out / "tiny_lm" / "config.pbtxt")
    assert lm.backend == "python" and lm.model_transaction_policy.decoupled
    assert {i.name for i in lm.input if not i.optional} == {"text_input"}
    assert {o.name for o in lm.output} == {"text_output", "token_ids", "finish_reason"}
    assert lm.parameters["runtime"].string_value == "ort"
    assert (out / "tiny_lm" / "1" / "checkpoint" / "model.safetensors").read_bytes() == (
        TINY_LM / "model.safetensors"
    ).read_bytes()
    assert (
        "from deamoe_trt.integrations.triton.decode_model import TritonPythonModel"
        in (out / "tiny_lm" / "1" / "model.py").read_text()
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "deamoe_ort",
        "deamoe_trt",
        "tiny_lm",
    ]  # no staging left


def test_rewriting_a_model_replaces_it_whole(exports, tmp_path):
    _, paths = exports
    out = tmp_path / "repo"
    triton.write_onnxruntime_model(out, paths["ort"], name="m", kind="cpu", threads=2)
    (out / "m" / "1" / "stale.txt").write_text("from an older write")
    triton.write_onnxruntime_model(out, paths["ort"], name="m", kind="gpu")
    assert not (out / "m" / "1" / "stale.txt").exists()
    assert parse(out / "m" / "config.pbtxt").instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_bad_inputs_are_one_line_errors(exports, tmp_path, capsys):
    folder, paths = exports
    out = tmp_path / "repo"
    cases = [
        (["--ort", str(paths["plugin"])], "plugin form"),
        (["--engine", str(folder / "layer.plan")], "go together"),
        ([], "nothing to write"),
        (["--ort", str(folder / "layer.plan")], "not"),
        (["--ort", str(paths["ort"]), "--max-batch-size", "8", "--ort-name", "x"], None),
    ]
    for extra, message in cases:
        code = main(["triton-repo", "-o", str(out), *extra])
        err = capsys.readouterr().err
        if message is None:
            assert code == 0
        else:
            assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (out / "deamoe_ort").exists()
    with pytest.raises(UsageError, match="model name"):
        triton.write_onnxruntime_model(out, paths["ort"], name="../escape")


def test_validate_config_names_the_schema_problem():
    good = triton.lm_config("m")
    assert triton.validate_config(good).model_transaction_policy.decoupled
    with pytest.raises(UsageError, match="schema"):
        triton.validate_config(good.replace("TYPE_STRING", "TYPE_TEXT"))
    with pytest.raises(UsageError, match="schema"):
        triton.validate_config(good + "max_tokens_per_day: 3\n")
    with pytest.raises(UsageError, match="dynamic batching"):
        triton.validate_config(good + "dynamic_batching { }\n")


def test_the_decode_service_runs_the_registrys_decoding_runtimes_and_the_older_trt_name(tmp_path):
    from deamoe_trt import runtimes
    from deamoe_trt.integrations.triton.lm_runtimes import lm_runtimes
    from deamoe_trt.lm.shipped import TINY_LM

    assert set(lm_runtimes()) == set(runtimes.names(can="decoding", emulated=False)) | {"trt"}
    assert set(lm_runtimes(gpu=False)) == {"torch", "cpu", "ort"}
    written = triton.write_lm_model(tmp_path / "gpu", TINY_LM, name="m", runtime="cuda")  # a runtime that needs a GPU
    config = (tmp_path / "gpu" / "m" / "config.pbtxt").read_text()
    assert written and "kind: KIND_GPU" in config and 'string_value: "cuda"' in config
    for name in ("trt", "tensorrt"):  # the repository must carry the engine, whichever name is used
        with pytest.raises(UsageError, match=f"the {name} runtime needs --engine"):
            triton.write_lm_model(tmp_path / "repo", TINY_LM, name="m", runtime=name)
    with pytest.raises(UsageError, match="unknown runtime 'cuda-emulated'"):
        triton.lm_config("m", runtime="cuda-emulated")
