"""Triton model repositories: config.pbtxt, version folder and files for each way we serve.

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.plan       (tensorrt_plan: an engine of the plugin form)
    REPO/<name>/1/model.onnx       (onnxruntime_onnx: the ort export, stock contrib ops)
    REPO/<name>/1/model.py         (python: the decoupled LM decode service) + 1/checkpoint/
    REPO/README.md                 the tritonserver command line for this repository

Triton treats every folder in REPO as a model and ignores plain files, so README.md can sit
at the top. Each model folder is written beside its final place and renamed onto it, so a
repository never holds half a model.

The TensorRT and ONNX Runtime configs take their inputs and outputs from the ONNX graph
(the engine was built from it and TensorRT keeps its tensor names): a symbolic dimension is
-1. When every input and output starts with the same symbolic dimension (a DeaMoE layer's
`tokens`), that dimension is Triton's batch dimension: max_batch_size is the export's
max_tokens and Triton's dynamic batcher merges the tokens of concurrent requests into one
forward, which is exact for an FFN layer since tokens do not interact.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from ... import runtimes
from ..._io import atomic_write_text, temporary_folder
from ...errors import MissingDependencyError, UsageError
from ...export.metadata import PREFIX, load_model
from ...export.save import data_path
from ...validation.plugin_op import has_plugin_nodes
from .lm_runtimes import check_lm_runtime, needs_engine

TRITON_TYPES: dict[int, str] = {
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.BFLOAT16: "TYPE_BF16",
    TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.BOOL: "TYPE_BOOL",
}

# The decode service's request and response tensors (see decode_model.py).
LM_INPUTS = (
    ("text_input", "TYPE_STRING", "[ 1 ]", False),
    ("max_tokens", "TYPE_INT32", "[ 1 ]", True),
    ("temperature", "TYPE_FP32", "[ 1 ]", True),
    ("top_p", "TYPE_FP32", "[ 1 ]", True),
    ("top_k", "TYPE_INT32", "[ 1 ]", True),
    ("random_seed", "TYPE_INT64", "[ 1 ]", True),
    ("stop_words", "TYPE_STRING", "[ -1 ]", True),
    ("stream", "TYPE_BOOL", "[ 1 ]", True),
)
LM_OUTPUTS = (
    ("text_output", "TYPE_STRING", "[ 1 ]"),
    ("token_ids", "TYPE_INT32", "[ -1 ]"),
    ("finish_reason", "TYPE_STRING", "[ 1 ]"),
)

KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str
    dims: tuple[int, ...]
    first_dim: str | None  # the symbol of the first dimension, if symbolic


def graph_tensors(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs (less initializers) and outputs of an ONNX graph as Triton sees them."""
    initializers = {t.name for t in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor = value.type.tensor_type
        data_type = TRITON_TYPES.get(tensor.elem_type)
        if data_type is None:
            raise UsageError(f"{value.name} has ONNX type {tensor.elem_type}, which this writer does not map to Triton")
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        first = tensor.shape.dim[0] if tensor.shape.dim else None
        symbol = first.dim_param or "?" if first is not None and not first.HasField("dim_value") else None
        return TensorSpec(value.name, data_type, dims, symbol)

    inputs = [spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v) for v in model.graph.output]
    if not inputs or not outputs:
        raise UsageError("the ONNX graph has no inputs or no outputs to serve")
    return inputs, outputs


def batch_size(
    model: onnx.ModelProto, inputs: list[TensorSpec], outputs: list[TensorSpec], requested: int | None
) -> int:
    """max_batch_size: requested, or by default the export's max_tokens when its first dimension can batch
    (every input and output starts with the same symbolic dimension), else 0."""
    symbols = {t.first_dim for t in inputs + outputs}
    batchable = len(symbols) == 1 and None not in symbols
    if requested is not None:
        if requested > 0 and not batchable:
            raise UsageError(
                "this model cannot take Triton batching: its inputs and outputs do not all start with the same "
                "dynamic dimension; use --max-batch-size 0"
            )
        return requested
    if not batchable:
        return 0
    meta = {p.key: p.value for p in model.metadata_props}
    return int(meta.get(PREFIX + "max_tokens", "0"))


def _tensor_block(key: str, tensors: list[TensorSpec], batched: bool) -> str:
    entries = []
    for t in tensors:
        dims = t.dims[1:] if batched else t.dims
        entries.append(
            f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n    dims: [ {", ".join(map(str, dims))} ]\n  }}'
        )
    return f"{key} [\n" + ",\n".join(entries) + "\n]\n"


def _instance_group(count: int, kind: str, gpus: list[int] | None) -> str:
    if count < 1:
        raise UsageError(f"instances must be >= 1, got {count}")
    gpu_list = f"\n    gpus: [ {', '.join(map(str, gpus))} ]" if gpus and kind == "KIND_GPU" else ""
    return f"instance_group [\n  {{\n    count: {count}\n    kind: {kind}{gpu_list}\n  }}\n]\n"


def _parameters(values: dict[str, str]) -> str:
    return "".join(f'parameters {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}\n' for k, v in values.items())


def _batching(max_batch_size: int, queue_delay_us: int) -> str:
    if max_batch_size == 0:
        return ""
    return f"dynamic_batching {{\n  max_queue_delay_microseconds: {queue_delay_us}\n}}\n"


def tensorrt_config(
    name: str,
    model: onnx.ModelProto,
    *,
    instances: int = 1,
    gpus: list[int] | None = None,
    max_batch_size: int | None = None,
    queue_delay_us: int = 100,
) -> str:
    """config.pbtxt for an engine built from model (platform tensorrt_plan, instances on GPUs)."""
    inputs, outputs = graph_tensors(model)
    max_batch_size = batch_size(model, inputs, outputs, max_batch_size)
    batched = max_batch_size > 0
    return (
        f'name: "{name}"\nplatform: "tensorrt_plan"\nmax_batch_size: {max_batch_size}\n'
        + _tensor_block("input", inputs, batched)
        + _tensor_block("output", outputs, batched)
        + _instance_group(instances, "KIND_GPU", gpus)
        + _batching(max_batch_size, queue_delay_us)
        # Pinned host buffers for the copies in and out; the engine's own tactics were fixed at build time.
        + "optimization {\n  input_pinned_memory { enable: true }\n  output_pinned_memory { enable: true }\n}\n"
    )


def onnxruntime_config(
    name: str,
    model: onnx.ModelProto,
    *,
    kind: str = "gpu",
    instances: int = 1,
    gpus: list[int] | None = None,
    threads: int | None = None,
    max_batch_size: int | None = None,
    queue_delay_us: int = 100,
) -> str:
    """config.pbtxt for the ort export on Triton's onnxruntime backend (CUDA or CPU execution provider)."""
    if kind not in KINDS:
        raise UsageError(f"kind must be gpu or cpu, got {kind!r}")
    inputs, outputs = graph_tensors(model)
    max_batch_size = batch_size(model, inputs, outputs, max_batch_size)
    batched = max_batch_size > 0
    parameters = {}
    if threads:
        parameters = {"intra_op_thread_count": str(threads), "inter_op_thread_count": "1"}
    return (
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        + _tensor_block("input", inputs, batched)
        + _tensor_block("output", outputs, batched)
        + _instance_group(instances, KINDS[kind], gpus)
        + _batching(max_batch_size, queue_delay_us)
        # Level 1 (basic): ONNX Runtime's extended fusions are what the export already wrote by hand.
        + "optimization {\n  graph { level: 1 }\n}\n"
        + _parameters(parameters)
    )


def lm_config(
    name: str,
    *,
    runtime: str = "ort",
    instances: int = 1,
    threads: int = 1,
    max_active: int = 32,
    kind: str = "cpu",
    extra: dict[str, str] | None = None,
) -> str:
    """config.pbtxt for the decoupled decode service (Python backend)."""
    check_lm_runtime(runtime)
    if max_active < 1 or threads < 1:
        raise UsageError("max_active and threads must be >= 1")
    inputs = ",\n".join(
        f'  {{\n    name: "{n}"\n    data_type: {t}\n    dims: {d}\n    optional: {str(o).lower()}\n  }}'
        for n, t, d, o in LM_INPUTS
    )
    outputs = ",\n".join(f'  {{\n    name: "{n}"\n    data_type: {t}\n    dims: {d}\n  }}' for n, t, d in LM_OUTPUTS)
    params = {"checkpoint": "checkpoint", "runtime": runtime, "threads": str(threads), "max_active": str(max_active)}
    params.update(extra or {})
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        # Decoupled: any number of responses per request, so tokens stream as they are made.
        + "model_transaction_policy {\n  decoupled: true\n}\n"
        + f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"
        + _instance_group(instances, KINDS[kind], None)
        + _parameters(params)
    )


def validate_config(text: str, *, where: str = "config.pbtxt"):
    """Parse text against Triton's ModelConfig schema (the protobuf tritonclient ships); the message,
    or UsageError naming the first problem. MissingDependencyError without tritonclient."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise MissingDependencyError(
            "checking a Triton model config needs tritonclient: pip install 'tritonclient[grpc]'"
        ) from None
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise UsageError(f"{where} does not match Triton's model config schema: {exc}") from None
    if not config.platform and not config.backend:
        raise UsageError(f"{where} names neither a platform nor a backend")
    if not config.input or not config.output:
        raise UsageError(f"{where} has no inputs or no outputs")
    if config.max_batch_size == 0 and config.HasField("dynamic_batching"):
        raise UsageError(f"{where} asks for dynamic batching with max_batch_size 0")
    return config


# Writing -------------------------------------------------------------------------------


def _write_model(repo: Path, name: str, config: str, files: dict[str, Path], *, tree: dict[str, Path] | None = None):
    """REPO/<name>/ with config.pbtxt and 1/<files>, built beside it and renamed into place."""
    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"model name {name!r} must be a plain folder name")
    repo.mkdir(parents=True, exist_ok=True)
    staging = Path(temporary_folder(repo / name))
    try:
        (staging / "config.pbtxt").write_text(config)
        version = staging / "1"
        version.mkdir()
        for target, source in files.items():
            shutil.copy2(source, version / target)
        for target, source in (tree or {}).items():
            shutil.copytree(source, version / target)
        final = repo / name
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return repo / name


def write_tensorrt_model(
    repo: Path, engine: Path, onnx_path: Path, *, name: str, instances=1, gpus=None, max_batch_size=None
) -> Path:
    if not Path(engine).is_file():
        raise UsageError(f"no engine file at {engine}")
    model = load_model(onnx_path)
    config = tensorrt_config(name, model, instances=instances, gpus=gpus, max_batch_size=max_batch_size)
    return _write_model(Path(repo), name, config, {"model.plan": Path(engine)})


def write_onnxruntime_model(
    repo: Path, onnx_path: Path, *, name: str, kind="gpu", instances=1, gpus=None, threads=None, max_batch_size=None
) -> Path:
    onnx_path = Path(onnx_path)
    model = load_model(onnx_path)
    if has_plugin_nodes(model):
        raise UsageError(
            f"{onnx_path} is the plugin form (a DeaMoE node ONNX Runtime does not have); serve the ort export "
            "(`deamoe-trt export --form ort`) on ONNX Runtime, or build the plugin form into an engine"
        )
    config = onnxruntime_config(
        name, model, kind=kind, instances=instances, gpus=gpus, threads=threads, max_batch_size=max_batch_size
    )
    files = {"model.onnx": onnx_path}
    if data_path(onnx_path).is_file():  # external weights keep the file name the graph refers to
        files[data_path(onnx_path).name] = data_path(onnx_path)
    return _write_model(Path(repo), name, config, files)


MODEL_PY = '''"""Triton Python-backend entry of the deamoe-trt LM decode service (from `deamoe-trt triton-repo`)."""

import os
import sys

# deamoe_trt comes from the server's Python environment; a launcher may put a checkout first.
sys.path[:0] = [p for p in os.environ.get("DEAMOE_TRITON_SYS_PATH", "").split(os.pathsep) if p]

from deamoe_trt.integrations.triton.decode_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
'''


def write_lm_model(
    repo: Path,
    checkpoint: Path,
    *,
    name: str,
    runtime="ort",
    instances=1,
    threads=1,
    max_active=32,
    engine: Path | None = None,
    plugin: str | None = None,
) -> Path:
    from ...lm.checkpoint import load_lm

    checkpoint = Path(checkpoint)
    load_lm(checkpoint)  # a checkpoint that would fail in the server fails here, with its own message
    files, extra = {}, {}
    check_lm_runtime(runtime)
    if needs_engine(runtime):
        if engine is None:
            raise UsageError(f"the {runtime} runtime needs --engine (an engine from build_lm_engine)")
        files["model.engine"], extra["engine"] = Path(engine), "model.engine"
        if plugin:
            extra["plugin"] = plugin
    kind = "gpu" if "gpu" in runtimes.get(runtime).capabilities.needs else "cpu"
    config = lm_config(
        name, runtime=runtime, instances=instances, threads=threads, max_active=max_active, kind=kind, extra=extra
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_py = Path(tmp) / "model.py"
        model_py.write_text(MODEL_PY)
        checkpoint_files = {p.name: p for p in checkpoint.iterdir() if p.is_file()}
        staged = Path(tmp) / "checkpoint"
        staged.mkdir()
        for file_name, source in checkpoint_files.items():
            shutil.copy2(source, staged / file_name)
        return _write_model(Path(repo), name, config, {"model.py": model_py, **files}, tree={"checkpoint": staged})


def serve_command(repo: Path, *, plugins: list[str] | None = None) -> str:
    """The tritonserver command line for repo (in a Triton container: tritonserver is on PATH)."""
    parts = ["tritonserver", f"--model-repository={Path(repo).resolve()}"]
    if plugins:
        # The TensorRT backend dlopens these before it deserializes any engine (plugin creators register).
        parts.append(f'--backend-config=tensorrt,plugins="{";".join(plugins)}"')
    return " \\\n    ".join(parts)


def write_readme(repo: Path, *, plugins: list[str] | None = None) -> None:
    models = sorted(p.name for p in Path(repo).iterdir() if (p / "config.pbtxt").is_file())
    text = (
        "# Triton model repository (written by `deamoe-trt triton-repo`)\n\n"
        f"Models: {', '.join(models)}\n\nServe it (docs/serving.md of deamoe-trt has the details):\n\n"
        f"    {serve_command(repo, plugins=plugins)}\n"
    )
    atomic_write_text(Path(repo) / "README.md", text)
