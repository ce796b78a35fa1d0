"""TensorRT as a runtime: a layer's plugin-form export built into an engine on this GPU, run
through polygraphy with the DeaMoE plugin loaded (deamoe_trt.trt); a language model's
plugin-form export built into a two-profile engine and decoded by TrtDecoder.

The one place deamoe-trt deserialises an engine (`load_engine`, and `make_engine_runner`,
polygraphy's runner over it): the plugin is registered first, since TensorRT looks its
creator up then.

TensorRT, polygraphy and a CUDA build of torch are imported when used: on a machine
without them `available()` says which is missing.
"""

from __future__ import annotations

import mmap
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..dtypes import BY_TRT
from ..errors import DeaMoEError, MissingDependencyError, UsageError, one_line
from ..lm.config import LMConfig
from ..trt.plugin import BUILD_HINT, PLUGIN_NAME, load_plugin, resolve_plugin
from .base import Capabilities, Decoder, DecoderPool, Prepared, RuntimeBase, as_numpy


def load_engine(path: str | Path, plugin_path: str | None = None):
    """(tensorrt module, the deserialised engine at path), the DeaMoE plugin registered first
    (plugin_path as for make_engine_runner); a one-line UsageError for a file this TensorRT
    cannot load. For code that drives the engine itself (execution contexts, device buffers)."""
    trt = _tensorrt_for(Path(path), plugin_path)
    return trt, _deserialize(trt, path)


def make_engine_runner(path: str | Path, plugin_path: str | None = None):
    """polygraphy's TrtRunner over the engine at path (deserialised when the runner activates).

    plugin_path: a plugin library, "python" for the QDP route, or None to use the library
    found in DEAMOE_TRT_PLUGIN / the build folders (an engine without DeaMoE layers needs
    none).
    """
    path = Path(path)
    trt = _tensorrt_for(path, plugin_path)
    from polygraphy.backend.trt import TrtRunner

    return TrtRunner(lambda: _deserialize(trt, path), name=f"tensorrt-{path.name}")


def _tensorrt_for(path: Path, plugin_path: str | None):
    """The tensorrt module, ready to deserialise the engine at path: the plugin it needs loaded."""
    from ..trt._tensorrt import import_tensorrt

    if path.is_dir() or not path.is_file():
        raise UsageError(f"no engine file at {path} (build one with `deamoe-trt build`)")
    trt = import_tensorrt()  # MissingDependencyError, one line, before polygraphy touches TensorRT
    choice = resolve_plugin(plugin_path)
    if choice.kind != "none":
        load_plugin(choice, trt)
    elif mentions_plugin(path):
        # Deserialisation would fail later with a less direct message.
        raise MissingDependencyError(f"{path} has DeaMoE layers but no plugin was found ({BUILD_HINT})")
    return trt


def _deserialize(trt: Any, path: str | Path):
    from ..trt._tensorrt import make_logger

    engine = trt.Runtime(make_logger(trt)).deserialize_cuda_engine(Path(path).read_bytes())
    if engine is None:
        raise UsageError(f"{path} is not a TensorRT engine this TensorRT ({trt.__version__}) can load")
    return engine


def mentions_plugin(path: Path) -> bool:
    """Whether the engine file names the DeaMoE plugin (a serialised plugin layer stores its name)."""
    with path.open("rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return data.find(PLUGIN_NAME.encode()) >= 0
        except ValueError:  # an empty file cannot be mapped
            return False


class TensorRTRuntime(RuntimeBase):
    name = "tensorrt"
    label = "TensorRT"
    capabilities = Capabilities(
        decoding=True,
        stacks=False,  # a stack of one layer only: the engine is built from one layer's export
        dtypes=(torch.float32, torch.float16),  # the layer's engine is fed numpy arrays, which have no bfloat16
        needs=frozenset({"gpu", "tensorrt"}),
        files=("checkpoint", "engine"),
    )

    def available(self) -> str | None:
        from ..trt import import_tensorrt

        try:
            import_tensorrt()
        except MissingDependencyError as exc:
            return one_line(exc)
        if not torch.cuda.is_available():
            return "needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
        return None

    def prepare(
        self,
        module,
        *,
        dtype=None,
        device=None,
        threads=None,
        plugin: str | None = None,
        max_tokens: int = 64,
        work_dir: str | Path | None = None,
        **options,
    ) -> Prepared:
        """Export (plugin form), build and load an engine for module; files go in work_dir
        (default: a temporary folder kept as long as the returned Prepared)."""
        from ..dtypes import of_torch
        from ..export import export
        from ..layer import DeaMoEStack
        from ..trt.builder import BuildOptions, build_engine

        self.require()
        module = self.cast(module, dtype)
        holder = None
        if work_dir is None:
            holder = tempfile.TemporaryDirectory(prefix="deamoe-trt-runtime-")
            work_dir = holder.name
        work = Path(work_dir)
        name = of_torch(module.dtype).name
        layer = module.layers[0] if isinstance(module, DeaMoEStack) and len(module.layers) == 1 else module
        onnx_path = export(layer, work / f"layer-{name}.onnx", "plugin", name, max_tokens=max_tokens)
        result = build_engine(
            BuildOptions(model=onnx_path, output=work / f"layer-{name}.engine", max_tokens=max_tokens, plugin=plugin)
        )
        prepared = self.load(result.engine, plugin=plugin)
        prepared.info.update(target=result.target, gpu=result.gpu)
        prepared.keep_alive = (prepared.keep_alive, holder)
        return prepared

    def load(self, path, *, threads=None, plugin: str | None = None, **options) -> Prepared:
        """A layer's engine (`deamoe-trt build`), activated; a checkpoint directory built into
        one as prepare() does."""
        if Path(path).is_dir():
            return super().load(path, threads=threads, plugin=plugin, **options)
        from ..export import INPUT_NAME, OUTPUT_NAME

        self.require()
        from polygraphy.backend.trt import TrtRunner

        _, engine = load_engine(path, plugin)
        np_dtype = BY_TRT[engine.get_tensor_dtype(INPUT_NAME).name].numpy
        runner = TrtRunner(engine, name=f"tensorrt-{Path(path).name}")
        runner.activate()

        def run(x: np.ndarray) -> np.ndarray:
            return runner.infer({INPUT_NAME: x})[OUTPUT_NAME]

        return Prepared(
            self.name,
            run,
            to_input=lambda x: np.ascontiguousarray(as_numpy(x).astype(np_dtype)),
            to_torch=lambda y: torch.from_numpy(np.asarray(y)),
            info={"engine": str(path)},
            keep_alive=runner,
        )

    def decoder(
        self,
        model,
        *,
        threads=None,
        twin="deamoe",
        plugin: str | None = None,
        engine: str | Path | None = None,
        work_dir: str | Path | None = None,
        **options,
    ) -> TrtDecoder:
        """A decoder on engine (made by deamoe_trt.trt.lm_engine.build_lm_engine for this model);
        without one, the twin's plugin-form export is built into such an engine in work_dir
        (default: a temporary folder kept as long as the decoder)."""
        from ..export.lm import export_lm
        from ..trt.lm_engine import build_lm_engine

        self.require()
        holder = None
        if engine is None:
            if work_dir is None:
                holder = tempfile.TemporaryDirectory(prefix="deamoe-trt-runtime-")
                work_dir = holder.name
            work = Path(work_dir)
            source = model.twin(twin)
            half = source.dtype == torch.float16
            onnx_path = export_lm(source, work / "model.onnx", "plugin", "fp16" if half else "fp32")
            engine = build_lm_engine(onnx_path, work / "model.engine", source.config, plugin=plugin, fp16=half)
        decoder = TrtDecoder(engine, model.config, plugin=plugin)
        decoder.keep_alive = holder
        return decoder

    def load_decoder(self, path, *, threads=None, config: LMConfig | None = None, **options) -> Decoder:
        """A decoder on the engine at path (build_lm_engine's) for the language model of config;
        a checkpoint directory built into such an engine as decoder() does."""
        if Path(path).is_dir():
            return super().load_decoder(path, threads=threads, **options)
        if config is None:
            raise UsageError(f"{path} is an engine: give the config of the language model it was built from")
        self.require()
        return TrtDecoder(path, config, plugin=options.get("plugin"))

    def decoder_pool(self, model, *, threads=None, size=1, plugin: str | None = None, **options) -> DecoderPool:
        """A fixed pool of size decoders on one engine: each holds device buffers for a whole context."""
        first = self.decoder(model, plugin=plugin, **options)
        pool = [first] + [TrtDecoder(first.engine_path, model.config, plugin=plugin) for _ in range(size - 1)]
        return DecoderPool(pool.pop, pool.append, keep_alive=first.keep_alive)


class TrtDecoder:
    """Prefill + decode on a TensorRT engine made by build_lm_engine (batch 1)."""

    name = "tensorrt"
    keep_alive: object = None  # the folder of an engine built for it

    def __init__(self, engine_path: str | Path, config: LMConfig, *, plugin: str | None = None):
        self.engine_path = Path(engine_path)
        from ..trt._tensorrt import import_tensorrt
        from ..trt.lm_engine import DECODE, PREFILL

        import_tensorrt()  # first: without TensorRT, say so before anything else
        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            raise MissingDependencyError("the TensorRT decoder needs torch for device buffers") from None
        if not torch.cuda.is_available():
            raise MissingDependencyError("the TensorRT decoder needs a CUDA GPU and a CUDA build of torch")
        self.torch, self.config = torch, config
        self.max_context = config.max_position_embeddings
        _, self.engine = load_engine(engine_path, plugin)
        if self.engine.num_optimization_profiles != 2:
            raise UsageError(
                f"{engine_path} has {self.engine.num_optimization_profiles} profiles; build it with build_lm_engine"
            )
        self.stream = torch.cuda.Stream()
        self.contexts = []
        for profile in (PREFILL, DECODE):
            context = self.engine.create_execution_context()
            context.set_optimization_profile_async(profile, self.stream.cuda_stream)
            self.contexts.append(context)
        from ..export.lm import past_names

        self.profiles = (PREFILL, DECODE)
        dtype = BY_TRT[self.engine.get_tensor_dtype(past_names(0)[0]).name].torch
        c, dev = config, "cuda"
        self.cache_shapes = c.cache_shapes()  # (heads, width) of the two tensors of a block
        shapes = [(1, heads, self.max_context, width) for heads, width in self.cache_shapes]
        self.buffers = [
            [torch.zeros(shapes[j % 2], dtype=dtype, device=dev) for j in range(2 * c.num_layers)] for _ in range(2)
        ]
        self.logits = torch.zeros((1, self.max_context, c.vocab_size), dtype=torch.float32, device=dev)
        self.ids = torch.zeros((1, self.max_context), dtype=torch.int64, device=dev)
        self.current, self.length = 0, 0

    def _run(self, ids: list[int], profile: int) -> np.ndarray:
        from ..export.lm import INPUT_IDS, LOGITS, past_names, present_names

        c, torch = self.config, self.torch
        context = self.contexts[profile]
        tokens, past = len(ids), self.length
        self.ids[0, :tokens] = torch.tensor(ids, dtype=torch.int64)
        reads, writes = self.buffers[self.current], self.buffers[1 - self.current]
        context.set_input_shape(INPUT_IDS, (1, tokens))
        context.set_tensor_address(INPUT_IDS, self.ids.data_ptr())
        for i in range(c.num_layers):
            for j, (past_name, present_name) in enumerate(zip(past_names(i), present_names(i), strict=True)):
                heads, width = self.cache_shapes[j]
                context.set_input_shape(past_name, (1, heads, c.cached_keys(i, past), width))
                context.set_tensor_address(past_name, reads[2 * i + j].data_ptr())
                context.set_tensor_address(present_name, writes[2 * i + j].data_ptr())
        context.set_tensor_address(LOGITS, self.logits.data_ptr())
        torch.cuda.current_stream().synchronize()
        if not context.execute_async_v3(self.stream.cuda_stream):
            raise DeaMoEError("TensorRT execution failed (see its errors above)")
        self.stream.synchronize()
        self.current, self.length = 1 - self.current, past + tokens
        # present is [1, kv, past + tokens, hd] (a sliding block's: its kept keys) packed at the
        # start of each buffer: the next step reads exactly that as its past.
        return self.logits.view(-1)[(tokens - 1) * c.vocab_size : tokens * c.vocab_size].cpu().numpy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.current, self.length = 0, 0
        return self._run(list(ids), self.profiles[0])

    def step(self, token: int) -> np.ndarray:
        return self._run([token], self.profiles[1])


RUNTIME = TensorRTRuntime()
