"""A language model's TensorRT engine: a prefill and a decode profile over one set of weights.

Engine: the plugin-form export (deamoe_trt.export.lm) parsed with the DeaMoE plugin
loaded, two optimisation profiles over the same weights:

    profile 0, prefill: input_ids [1, 1..C]   past_key_values.* [1, kv_heads, 0, head_dim]
    profile 1, decode:  input_ids [1, 1]      past_key_values.* [1, kv_heads, 1..C-1, head_dim]

C = max_position_embeddings. The prefill profile's past length is 0: TensorRT takes empty
tensors (a dimension of 0) as inputs, and the graph's Concat then returns the new keys.

deamoe_trt.runtimes.tensorrt decodes with such an engine.

TensorRT is imported lazily: this module
imports on any machine, and says in one line what is missing when used.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DeaMoEError
from ..export.lm import INPUT_IDS, past_names
from ..lm.config import LMConfig

PREFILL, DECODE = 0, 1


def lm_profiles(config: LMConfig, batch: int = 1) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """(min, opt, max) shapes of every input for the prefill and the decode profile."""
    c = config
    context = c.max_position_embeddings
    prefill: dict[str, tuple[tuple[int, ...], ...]] = {
        INPUT_IDS: ((batch, 1), (batch, min(64, context)), (batch, context))
    }
    decode: dict[str, tuple[tuple[int, ...], ...]] = {INPUT_IDS: ((batch, 1), (batch, 1), (batch, 1))}
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
    from ._tensorrt import import_tensorrt, make_logger
    from .builder import add_profiles, parser_errors, write_engine
    from .plugin import load_plugin, resolve_plugin

    trt = import_tensorrt()
    choice = resolve_plugin(plugin)
    if choice.kind != "none":
        load_plugin(choice, trt)
    logger = make_logger(trt, verbose)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(parser_errors(parser))
        raise DeaMoEError(f"TensorRT cannot parse {onnx_path}: {errors or 'no message'} (plugin: {choice.describe()})")
    builder_config = builder.create_builder_config()
    builder_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if fp16:
        builder_config.set_flag(trt.BuilderFlag.FP16)
    add_profiles(builder, builder_config, lm_profiles(config))
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise DeaMoEError("TensorRT could not build the language-model engine (its errors are above)")
    return write_engine(engine_path, serialized)
