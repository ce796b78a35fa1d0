"""The exported language model on TensorRT: an engine with a prefill and a decode profile, and a Decoder.

Engine: the plugin-form export (deamoe_trt.lm.onnx_export) parsed with the DeaMoE plugin
loaded, two optimisation profiles over the same weights:

    profile 0, prefill: input_ids [1, 1..C]   past_key_values.* [1, kv_heads, 0, head_dim]
    profile 1, decode:  input_ids [1, 1]      past_key_values.* [1, kv_heads, 1..C-1, head_dim]

C = max_position_embeddings. The prefill profile's past length is 0: TensorRT takes empty
tensors (a dimension of 0) as inputs, and the graph's Concat then returns the new keys.

Decoder: one execution context per profile, device buffers from torch.cuda; each layer's
cache lives in two buffers of the largest size, and a step reads past from one and writes
present to the other (the graph's present is past + new, contiguous), then they swap.

TensorRT, its Python bindings and a CUDA build of torch are imported lazily: this module
imports on any machine, and says in one line what is missing when used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..dtypes import BY_TRT
from ..errors import DeaMoEError, MissingDependencyError, UsageError
from .config import LMConfig
from .onnx_export import INPUT_IDS, LOGITS, past_names, present_names

PREFILL, DECODE = 0, 1


def lm_profiles(config: LMConfig, batch: int = 1) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """(min, opt, max) shapes of every input for the prefill and the decode profile."""
    c = config
    context = c.max_position_embeddings
    prefill = {INPUT_IDS: ((batch, 1), (batch, min(64, context)), (batch, context))}
    decode = {INPUT_IDS: ((batch, 1), (batch, 1), (batch, 1))}
    for i in range(c.num_layers):
        for name, (heads, width) in zip(past_names(i), c.cache_shapes(), strict=True):
            kv = (batch, heads)
            prefill[name] = ((*kv, 0, width),) * 3
            longest = c.cached_keys(i, context - 1)  # a sliding block's cache stops at its window
            decode[name] = ((*kv, 1, width), (*kv, min(context // 2, longest), width), (*kv, longest, width))
    return [prefill, decode]


def build_lm_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    config: LMConfig,
    *,
    plugin: str | None = None,
    fp16: bool = False,
    workspace_mib: int = 1024,
    verbose: bool = False,
) -> Path:
    """Parse the plugin-form export at onnx_path and write an engine with both profiles to engine_path."""
    from .._io import atomic_path
    from ..trt._tensorrt import import_tensorrt, make_logger
    from ..trt.plugin import load_plugin, resolve_plugin

    trt = import_tensorrt()
    choice = resolve_plugin(plugin)
    if choice.kind != "none":
        load_plugin(choice, trt)
    logger = make_logger(trt, verbose)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise DeaMoEError(f"TensorRT cannot parse {onnx_path}: {errors or 'no message'} (plugin: {choice.describe()})")
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if fp16:
        builder_config.set_flag(trt.BuilderFlag.FP16)
    for shapes in lm_profiles(config):
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in shapes.items():
            profile.set_shape(name, mn, opt, mx)
        builder_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise DeaMoEError("TensorRT could not build the language-model engine (its errors are above)")
    engine_path = Path(engine_path)
    with atomic_path(engine_path) as tmp:
        tmp.write_bytes(memoryview(serialized))
    return engine_path


class TrtDecoder:
    """Prefill + decode on a TensorRT engine made by build_lm_engine (batch 1)."""

    name = "tensorrt"

    def __init__(self, engine_path: str | Path, config: LMConfig, *, plugin: str | None = None):
        from ..trt._tensorrt import import_tensorrt
        from ..trt.runner import load_engine

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
        return self._run(list(ids), PREFILL)

    def step(self, token: int) -> np.ndarray:
        return self._run([token], DECODE)
