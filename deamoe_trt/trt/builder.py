"""`deamoe-trt build`: an ONNX model to a TensorRT engine for one target device.

The decisions (target, token range, precision mode) are pure functions tested without
TensorRT; `build_engine` applies them through the TensorRT Python API, which differs
between 10.x and 11.x where noted.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .._io import atomic_path
from ..console import format_bytes
from ..dtypes import DTYPES
from ..errors import DeaMoEError, MissingDependencyError, UsageError
from ..fit import TARGET_MEMORY, MemoryNeed
from . import targets as tg
from .onnx_info import ModelFacts, model_facts, read_metadata
from .plugin import BUILD_HINT, PLUGIN_NAME, PluginChoice, load_plugin, resolve_plugin

PRECISIONS = ("fp32", "fp16", "bf16")
# ONNX TensorProto element types -> bytes (FLOAT, UINT8, INT8, INT32, INT64, FLOAT16, BFLOAT16).
DTYPE_BYTES = {1: 4, 2: 1, 3: 1, 6: 4, 7: 8, 10: 2, 16: 2}


# ---------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecisionPlan:
    """How the network is typed and which reduced-precision builder flags are set."""

    strongly_typed: bool
    flags: tuple[str, ...]  # trt.BuilderFlag names
    note: str | None = None


def precision_plan(
    trt_version: tuple[int, int], model_dtype: str | None, target: tg.TargetProfile, strongly_typed: bool | None
) -> PrecisionPlan:
    """The precision mode for a build.

    TensorRT 11 networks are always strongly typed: every tensor keeps the type the ONNX
    gives it, so the DeaMoE layer runs in the exported dtype. TensorRT 10 can also build
    weakly typed networks, where BuilderFlag.FP16/BF16 let it lower float32 layers.

    strongly_typed None (auto) on 10.x: strongly typed when the model already has a
    reduced dtype (or the target wants fp32): the plugin then runs exactly that dtype and
    no weight is recast. A float32 model for an fp16/bf16 target is built weakly typed with
    the target's flag, so TensorRT may run the layer in the target precision.
    """
    want = target.precision
    mismatch = (
        f"the model is {model_dtype} and the {target.name} target prefers {want}: the engine runs {model_dtype} "
        f"(export with --dtype {want} for a {want} engine)"
        if model_dtype and model_dtype != want
        else None
    )
    if trt_version >= (11, 0):
        if strongly_typed is False:
            raise UsageError("TensorRT 11 builds strongly typed networks only; drop --weakly-typed")
        return PrecisionPlan(True, (), mismatch)
    if strongly_typed is None:
        # Unknown dtype (a model from elsewhere): weakly typed, as TensorRT 10 builds by default.
        strongly_typed = model_dtype is not None and (model_dtype != "fp32" or want == "fp32")
    if strongly_typed:
        return PrecisionPlan(True, (), mismatch)
    flags = () if want == "fp32" else (want.upper(),)
    note = None
    if flags and model_dtype in (None, "fp32"):
        note = (
            f"weakly typed build with BuilderFlag.{flags[0]}: TensorRT picks float32 or {want} per layer; "
            f"export with --dtype {want} to pin the DeaMoE layer to {want}"
        )
    elif model_dtype and model_dtype != "fp32" and model_dtype != want:
        note = mismatch
    return PrecisionPlan(False, flags, note)


DTYPE_BY_TRT = {d.trt: d.name for d in DTYPES}


# ---------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------


class _Ticker:
    """Fallback progress: a line every `every` seconds while the builder works (no IProgressMonitor)."""

    def __init__(self, stream: TextIO, every: float = 15.0):
        self.stream, self.every = stream, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.stream.write(f"[build] still building ({time.perf_counter() - self.start:.0f}s)\n")
            self.stream.flush()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=1.0)


def _progress_monitor(trt, stream: TextIO):
    """An IProgressMonitor (TensorRT 10+) printing top-level phases and their steps, throttled."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc, valid-type]  # TensorRT's class, found at run time
        def __init__(self):
            base.__init__(self)
            self.start = time.perf_counter()
            self.depth: dict[str, int] = {}
            self.steps: dict[str, int] = {}
            self.last_print = 0.0
            self.cancel = False

        def _say(self, text: str) -> None:
            stream.write(f"[build {time.perf_counter() - self.start:6.1f}s] {text}\n")
            stream.flush()

        # TensorRT calls these from its build thread; an exception escaping here would only
        # be printed by the bindings, so every callback catches and asks to cancel instead.
        def phase_start(self, phase_name, parent_phase, num_steps):
            try:
                depth = self.depth.get(parent_phase, -1) + 1 if parent_phase else 0
                self.depth[phase_name] = depth
                self.steps[phase_name] = num_steps
                if depth <= 1:
                    self._say(f"{'  ' * depth}{phase_name} ({num_steps} step{'s' if num_steps != 1 else ''})")
            except BaseException:
                self.cancel = True

        def step_complete(self, phase_name, step):
            try:
                now = time.perf_counter()
                if self.depth.get(phase_name, 9) <= 1 and now - self.last_print >= 2.0:
                    self.last_print = now
                    depth = self.depth[phase_name]
                    self._say(f"{'  ' * depth}{phase_name}: {step + 1}/{self.steps.get(phase_name, '?')}")
            except BaseException:
                self.cancel = True
            return not self.cancel

        def phase_finish(self, phase_name):
            try:
                self.depth.pop(phase_name, None)
            except BaseException:
                self.cancel = True

    return Monitor()


# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------


@dataclass
class BuildOptions:
    model: Path
    output: Path
    target: str = "auto"
    max_tokens: int | None = None
    plugin: str | None = None  # a library path, "python", or None (search)
    timing_cache: str | None = None  # a path, "none", or None (per-target default)
    strongly_typed: bool | None = None  # None: decide (precision_plan); TensorRT 10 only
    workspace_mib: int | None = None  # override the target's memory-pool limit
    device_memory: int | None = None  # bytes; override the target's (deamoe_trt.fit.TARGET_MEMORY)
    verbose: bool = False
    gpu: tg.GpuInfo | None = None  # injected by tests; queried otherwise


@dataclass
class BuildResult:
    engine: Path
    target: str
    gpu: str
    compute_capability: str
    tensorrt: str
    plugin: str
    tokens: tuple[int, int, int]
    precision: str
    strongly_typed: bool
    engine_bytes: int
    seconds: float
    timing_cache: str | None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        mn, opt, mx = self.tokens
        return [
            f"wrote {self.engine} ({format_bytes(self.engine_bytes)}) in {self.seconds:.1f}s",
            f"  target {self.target} on {self.gpu} (compute capability {self.compute_capability}), "
            f"TensorRT {self.tensorrt}",
            f"  tokens min {mn} / opt {opt} / max {mx}; {self.precision}"
            f" ({'strongly' if self.strongly_typed else 'weakly'} typed); plugin: {self.plugin}",
            *([f"  timing cache: {self.timing_cache}"] if self.timing_cache else []),
            *(f"  note: {n}" for n in self.notes),
        ]


def check_request(options: BuildOptions) -> ModelFacts:
    """Everything that can be checked before TensorRT is imported: the files and the numbers."""
    model = Path(options.model)
    facts = model_facts(model)
    if not facts.has_graph:
        raise UsageError(f"{model} is not an ONNX model (no graph in it)")
    if facts.form == "ort":
        raise UsageError(
            f"{model} is the ort form (com.microsoft.MoE), which TensorRT cannot parse; "
            "export with --form plugin for TensorRT (or --form onnx for standard ops)"
        )
    output = Path(options.output)
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory; give the engine's file name")
    if output.resolve() == model.resolve():
        raise UsageError("-o would overwrite the ONNX model; give the engine another name")
    if options.target != "auto":
        tg.check_max_tokens(tg.get_target(options.target), options.max_tokens)
    if options.workspace_mib is not None and options.workspace_mib < 1:
        raise UsageError(f"--workspace must be >= 1 MiB, got {options.workspace_mib}")
    if options.plugin is not None:
        resolve_plugin(options.plugin)  # a missing path is a usage error, TensorRT or not
    if options.target != "auto":
        memory, shared = TARGET_MEMORY[options.target]
        check_memory(options, facts, tg.get_target(options.target), options.device_memory or memory, shared)
    return facts


# Per-step tensors besides a graph's inputs and outputs (routing, expert activations, attention
# scores) hold a few times theirs: an estimate, not TensorRT's own tactic choice.
ACTIVATION_FACTOR = 4


def build_need(options: BuildOptions, facts: ModelFacts, profile: tg.TargetProfile, shared: bool) -> MemoryNeed:
    """The memory building (and then running) the model on profile's device takes: the
    ONNX weights (external data included), activations of --max-tokens tokens, the workspace."""
    import onnx

    model = Path(options.model)
    proto = onnx.load(str(model), load_external_data=False)
    weights = model.stat().st_size
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    weights += sum((model.parent / loc).stat().st_size for loc in locations if (model.parent / loc).is_file())
    per_token = 0
    for value in (*proto.graph.input, *proto.graph.output):
        tensor = value.type.tensor_type
        static = [d.dim_value for d in tensor.shape.dim if d.HasField("dim_value")]
        size = DTYPE_BYTES.get(tensor.elem_type, 4)
        for n in static:
            size *= n
        per_token += size
    tokens = options.max_tokens or facts.max_tokens or profile.default_max_tokens
    workspace = (options.workspace_mib << 20) if options.workspace_mib else profile.workspace_bytes
    return MemoryNeed(weights, ACTIVATION_FACTOR * per_token * tokens, workspace, shared=shared)


def check_memory(
    options: BuildOptions, facts: ModelFacts, profile: tg.TargetProfile, memory: int, shared: bool
) -> None:
    """State the memory the build needs; a one-line UsageError when the device has less."""
    need = build_need(options, facts, profile, shared)
    print(f"[build] memory for {profile.name}: {need.text()}", file=sys.stderr)
    need.check(memory, f"target {profile.name} ({format_bytes(memory)}{', shared by CPU and GPU' if shared else ''})")


@dataclass
class _Plan:
    """What a build will do, decided before TensorRT sees the model."""

    facts: ModelFacts
    version: tuple[int, ...]
    gpu: tg.GpuInfo
    profile: tg.TargetProfile
    tokens: tuple[int, int, int]
    precision: PrecisionPlan
    plugin: PluginChoice
    plugin_text: str


def build_engine(options: BuildOptions, *, progress: TextIO | None = None) -> BuildResult:
    """Build options.model into options.output (atomically) on this machine's GPU: plan the
    build, parse the model, configure the builder, build, then write the engine and, beside
    it, the export's metadata (deamoe_trt.export.metadata.engine_info reads it back)."""
    from ._tensorrt import import_tensorrt, make_logger

    progress = progress or sys.stderr
    started = time.perf_counter()
    facts = check_request(options)
    trt = import_tensorrt()
    plan = _plan(trt, options, facts)
    progress.write(
        f"[build] {options.model} -> {options.output}: target {plan.profile.name} on {plan.gpu.name} "
        f"({plan.gpu.sm}), TensorRT {trt.__version__}, tokens {plan.tokens[0]}/{plan.tokens[1]}/{plan.tokens[2]}, "
        f"plugin {plan.plugin_text}\n"
    )
    logger = make_logger(trt, options.verbose)
    builder = trt.Builder(logger)
    network = _network(trt, builder, logger, options, plan)
    config, cache_path = _configure(trt, builder, network, options, plan, progress)
    serialized = _build(trt, builder, network, config, plan, progress)
    output = _write(options, serialized)
    if cache_path is not None:
        _save_timing_cache(config, cache_path, progress)

    inputs = network.num_inputs
    input_dtype = DTYPE_BY_TRT.get(getattr(network.get_input(0).dtype, "name", "")) if inputs else None
    precision = ", ".join([facts.dtype or input_dtype or "model dtype", *(f.lower() for f in plan.precision.flags)])
    return BuildResult(
        engine=output,
        target=plan.profile.name,
        gpu=plan.gpu.name,
        compute_capability=plan.gpu.cc,
        tensorrt=trt.__version__,
        plugin=plan.plugin_text,
        tokens=plan.tokens,
        precision=precision,
        strongly_typed=plan.precision.strongly_typed,
        engine_bytes=output.stat().st_size,
        seconds=time.perf_counter() - started,
        timing_cache=str(cache_path) if cache_path else None,
        notes=[plan.precision.note] if plan.precision.note else [],
    )


def _plan(trt, options: BuildOptions, facts: ModelFacts) -> _Plan:
    """The target, token range, precision and plugin of the build; the plugin is loaded."""
    from ._tensorrt import tensorrt_version
    from .device import query_gpu

    version = tensorrt_version(trt)
    gpu = options.gpu or query_gpu()
    profile = tg.resolve_target(options.target, gpu)
    if options.target == "auto":  # the memory of the GPU found
        check_memory(options, facts, profile, options.device_memory or gpu.total_memory, gpu.integrated)
    if version < profile.min_tensorrt:
        raise MissingDependencyError(
            f"the {profile.name} target needs TensorRT {profile.min_tensorrt[0]}.{profile.min_tensorrt[1]}+, "
            f"this is {trt.__version__}"
        )
    max_tokens = tg.check_max_tokens(profile, options.max_tokens or facts.max_tokens)
    tokens = tg.token_range(profile, max_tokens)
    precision = precision_plan(version, facts.dtype, profile, options.strongly_typed)

    choice = resolve_plugin(options.plugin)
    plugin_text = "none (model without DeaMoE nodes)"
    if choice.kind != "none":
        plugin_text = load_plugin(choice, trt)
    elif facts.form == "plugin":
        raise MissingDependencyError(f"{options.model} has DeaMoE plugin nodes but no plugin was found ({BUILD_HINT})")
    return _Plan(facts, version, gpu, profile, tokens, precision, choice, plugin_text)


def _network(trt, builder, logger, options: BuildOptions, plan: _Plan):
    """The model parsed into a network (strongly typed where the plan says so)."""
    flags = 0
    if plan.precision.strongly_typed and plan.version < (11, 0):
        # 11.x: always strongly typed, the flag is deprecated and ignored, so it is not set.
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    _parse(trt, parser, options, plan.plugin)
    return network


def _configure(trt, builder, network, options: BuildOptions, plan: _Plan, progress: TextIO):
    """The builder config: workspace, optimisation level, precision flags, the token profile
    and the timing cache (returned with its path, None when disabled)."""
    inputs = [(network.get_input(i).name, tuple(network.get_input(i).shape)) for i in range(network.num_inputs)]
    shapes = tg.profile_shapes(inputs, plan.tokens)

    config = builder.create_builder_config()
    workspace = options.workspace_mib * tg.MiB if options.workspace_mib else plan.profile.workspace_bytes
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
    config.builder_optimization_level = plan.profile.optimization_level
    for name in plan.precision.flags:
        flag = getattr(trt.BuilderFlag, name, None)
        if flag is None:  # pragma: no cover - precision_plan only asks for flags on 10.x
            raise DeaMoEError(f"this TensorRT ({trt.__version__}) has no BuilderFlag.{name}")
        config.set_flag(flag)
    if shapes:
        add_profiles(builder, config, [shapes])

    cache_path = _timing_cache_path(options, plan.profile, plan.gpu, plan.version)
    if cache_path is not None:
        _load_timing_cache(config, cache_path, progress)
    return config, cache_path


def _build(trt, builder, network, config, plan: _Plan, progress: TextIO):
    """The serialized engine, with progress while TensorRT works."""
    monitor = _progress_monitor(trt, progress)
    if monitor is not None:
        config.progress_monitor = monitor
        serialized = builder.build_serialized_network(network, config)
    else:
        with _Ticker(progress):
            serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        if monitor is not None and monitor.cancel:
            raise DeaMoEError("the build was cancelled")
        raise DeaMoEError(
            "TensorRT could not build the engine (its errors are above); for a DeaMoE layer, check that the "
            f"plugin library matches this TensorRT and GPU ({plan.gpu.sm}), or raise --workspace"
        )
    return serialized


def _write(options: BuildOptions, serialized) -> Path:
    """The engine, then the model's export metadata beside it (both atomically)."""
    from ..export.metadata import write_engine_metadata

    output = write_engine(options.output, serialized)
    write_engine_metadata(output, read_metadata(options.model))
    return output


def _parse(trt, parser, options: BuildOptions, choice: PluginChoice) -> None:
    model = Path(options.model)
    if choice.kind == "python":
        from .qdp import prepare_model_bytes

        data, count = prepare_model_bytes(model)
        if count == 0:
            raise UsageError(f"{model} has no DeaMoE node; --plugin python has nothing to do (drop it)")
        ok = parser.parse(data, str(model))
    else:
        ok = parser.parse_from_file(str(model))
    if ok:
        return
    errors = parser_errors(parser)
    first = errors[0] if errors else "no error message"
    if PLUGIN_NAME in first and "lugin" in first:
        raise MissingDependencyError(
            f"TensorRT found no usable {PLUGIN_NAME} plugin for {model}: {first} "
            f"(plugin: {choice.describe()}; {BUILD_HINT})"
        )
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise UsageError(f"TensorRT could not parse {model}: {first}{more}")


# The steps every engine build takes the same way (this one and trt.lm_engine's).


def add_profiles(builder, config, profiles: Sequence[Mapping[str, tuple[tuple[int, ...], ...]]]) -> None:
    """One optimisation profile per entry of profiles (input name -> (min, opt, max) shape),
    added in order, so that profile i of the engine is profiles[i]."""
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in shapes.items():
            profile.set_shape(name, mn, opt, mx)
        config.add_optimization_profile(profile)


def parser_errors(parser) -> list[str]:
    """The ONNX parser's errors, in its order."""
    return [str(parser.get_error(i)) for i in range(parser.num_errors)]


def write_engine(path: str | Path, serialized) -> Path:
    """The serialized engine written to path atomically (an older engine stays if this fails)."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(serialized))
    return path


def _timing_cache_path(options: BuildOptions, profile, gpu, version) -> Path | None:
    if options.timing_cache is not None and str(options.timing_cache).lower() == "none":
        return None
    if options.timing_cache:
        return Path(options.timing_cache).expanduser()
    return tg.default_timing_cache(profile, gpu, version)


def _load_timing_cache(config, path: Path, progress: TextIO) -> None:
    data = b""
    if path.is_file():
        data = path.read_bytes()
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, False):
        # From another GPU or TensorRT version: start a fresh one rather than fail.
        progress.write(f"[build] timing cache {path} does not match this GPU/TensorRT; starting a new one\n")
        config.set_timing_cache(config.create_timing_cache(b""), False)


def _save_timing_cache(config, path: Path, progress: TextIO) -> None:
    try:
        cache = config.get_timing_cache()
        if cache is None:
            return
        with atomic_path(path) as tmp:
            tmp.write_bytes(memoryview(cache.serialize()))
    except OSError as exc:  # the engine is written; a cache we cannot save is only slower next time
        progress.write(f"[build] could not save the timing cache to {path}: {exc}\n")
