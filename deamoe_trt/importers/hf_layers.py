"""The MoE layers of a local Hugging Face model directory as a DeaMoE stack (`import-hf --layers-only`).

The model is built by transformers from the directory alone (local_files_only, no remote
code) and its weights are read from safetensors only: pickled weights (*.bin, *.pt) are
refused, never opened. The whole model is instantiated on the CPU, so this needs memory
for the whole model in its stored dtype; the MoE blocks are then imported with from_hf_model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import MissingDependencyError, UsageError, one_line
from ..layer import DeaMoEStack
from .hf import SUPPORTED_MODEL_TYPES, find_moe_blocks, from_hf_model
from .hf_directory import check_not_quantized, read_config_json, safetensors_files


def read_layers_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a local Hugging Face model directory, checked for a supported model_type."""
    config = read_config_json(model_dir)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UsageError(
            f"unsupported Hugging Face model_type {model_type!r} in {Path(model_dir) / 'config.json'}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    check_not_quantized(config, model_dir)
    return config


def load_moe_layers(
    model_dir: str | Path, *, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None
) -> DeaMoEStack:
    """The MoE layers of the model in model_dir (all, or the HF layer indices in layers).

    dtype: the stack's dtype; default the dtype the weights are stored in. The stack's
    ``source`` is {"hf_model_type", "hf_module", "layers"} (see from_hf_model).
    """
    read_layers_config(model_dir)
    safetensors_files(model_dir)
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError(
            "importing Hugging Face models needs transformers: pip install 'deamoe-trt[hf]'"
        ) from None

    path = str(Path(model_dir))
    try:
        hf_config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"transformers cannot read {path}/config.json: {one_line(exc, first=True)}") from None

    # Check the layer selection on an empty (meta) model before reading any weights.
    with torch.device("meta"):
        skeleton = transformers.AutoModel.from_config(hf_config, trust_remote_code=False)
    available = [index for index, _, _ in find_moe_blocks(skeleton)]
    del skeleton
    if not available:
        raise UsageError(f"{path} ({hf_config.model_type}) has no MoE layers: every layer is dense")
    if layers is not None:
        missing = [i for i in layers if i not in available]
        if missing:
            raise UsageError(
                f"layer {missing[0]} is not a MoE layer of {path} (dense or out of range); "
                f"its MoE layers are {', '.join(map(str, available))}"
            )

    _check_stored_weights(Path(model_dir), [f"layers.{i}." for i in (layers if layers is not None else available)])
    try:
        with _quiet(transformers):
            model, info = transformers.AutoModel.from_pretrained(
                path,
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=False,
                dtype=dtype if dtype is not None else "auto",
                output_loading_info=True,
            )
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        raise UsageError(f"transformers cannot load {path}: {one_line(exc, first=True)}") from None
    # transformers fills missing tensors with random values and only warns: refuse instead.
    blocks = [name for index, name, _ in find_moe_blocks(model) if layers is None or index in layers]
    missing = sorted(k for k in info.get("missing_keys", ()) if any(k.startswith(b + ".") for b in blocks))
    if missing:
        raise UsageError(
            f"{path} lacks {len(missing)} tensor(s) of its MoE layers, first {missing[0]}; "
            "refusing to import randomly initialised weights"
        )
    for name, tensor in model.state_dict().items():
        ours = any(name.startswith(b + ".") for b in blocks)
        if ours and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise UsageError(f"{name} holds NaN or infinite values; the model's weights are damaged")
    return from_hf_model(model, layers=layers, dtype=dtype)


def import_hf_layers(
    model_dir: str | Path,
    output: str | Path,
    *,
    layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    force: bool = False,
    note=None,
) -> DeaMoEStack:
    """`import-hf --layers-only`: the MoE layers of model_dir (all, or the HF layer indices
    `layers`) written as a layer checkpoint to output; the stack written. Bad input fails
    before anything heavy is imported or the output is touched."""
    from .._io import check_not_input, json_format_is, replaced_directory
    from ..checkpoint import FORMAT

    model_dir, output = Path(model_dir), Path(output)
    read_layers_config(model_dir)
    check_not_input(output, [model_dir])
    with replaced_directory(output, json_format_is(FORMAT), "layer checkpoint", force=force, note=note) as staging:
        stack = load_moe_layers(model_dir, layers=layers, dtype=dtype)
        stack.save_pretrained(staging)
    return stack


def _check_stored_weights(model_dir: Path, prefixes: list[str]) -> None:
    """What the whole-model import checks of the stored tensors, from their headers, before
    transformers reads them: every file whole, and the MoE layers' weights in a float dtype
    (transformers would cast an int32 expert to the model's dtype without a word)."""
    from safetensors import SafetensorError, safe_open

    from ..safetensors_io import ST_DTYPES, index_checkpoint

    index = index_checkpoint(model_dir)
    for file in sorted({info.file for info in index.values()}):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            reason = one_line(exc, first=True)
            raise UsageError(f"{file} is not a readable safetensors file (truncated or corrupt?): {reason}") from None
    for name, info in sorted(index.items()):
        inside = any(f".{prefix}" in f".{name}" for prefix in prefixes)
        if inside and info.dtype not in ST_DTYPES:
            raise UsageError(f"{name} is {info.dtype}; import float32, float16 or bfloat16 weights")


@contextlib.contextmanager
def _quiet(transformers) -> Iterator[None]:
    """No progress bars or load reports from transformers while loading; restored after."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
