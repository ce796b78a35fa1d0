"""The export stage's one entry: a checkpoint of any artifact (layer, stack of layers,
language model) to ONNX, as `deamoe-trt export` runs it.

export_checkpoint reads the checkpoint (deamoe_trt.lm.checkpoint.read), refuses in one line
an option that does not apply to what it read, and writes: a layer or stack through
build_model (export.model) with a recipe's settings under the options; a language model
through export_lm (export.lm), or with target "genai" as an ONNX Runtime GenAI folder.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from dataclasses import dataclass
from pathlib import Path

from .._io import check_not_input, check_replaceable, check_writable
from ..console import Progress, format_bytes
from ..errors import UsageError
from ..lm.checkpoint import ARTIFACTS, Checkpoint, read
from .save import EXTERNAL_DATA_THRESHOLD, data_path, save_model


@dataclass(frozen=True)
class ExportOptions:
    """What to write; None: not given (each artifact has its default)."""

    form: str | None = None  # plugin | ort | onnx (a language model: ort by default)
    dtype: str | None = None  # fp32 by default
    opset: int | None = None
    external_data_threshold: int | None = None
    # Layers and stacks only.
    layers: str | None = None  # "all" or "I,J,..."
    max_tokens: int | None = None
    recipe: str | Path | None = None
    # Language models only.
    twin: str | None = None  # deamoe (default) | expanded | vanilla
    target: str | None = None  # onnx (default) | genai
    force: bool = False  # replace a non-empty folder that is not the target's own output


# The options each artifact does not take, with what they are for.
_ONLY = {
    "layers": ("layer", "which of a layer checkpoint's layers to export"),
    "max_tokens": ("layer", "a layer export's largest tokens per step, for TensorRT"),
    "recipe": ("layer", "export recipes set a layer export's form, dtype, layers"),
    "twin": ("lm", "which of a language model's twins to export"),
    "target": ("lm", "a language model's onnx file or GenAI folder"),
}


# The targets that write a folder an outside engine loads, each a "module:function" named rather
# than imported (this stage imports no integration; pkgutil.resolve_name finds it when used):
# function(model, folder, form, dtype, opset, *, tokenizer, twin, force, note) -> the folder written,
# and the test of a folder that says it is that target's own output (which it may replace).
FOLDER_TARGETS = {"genai": "deamoe_trt.integrations.genai.export:export_genai"}
FOLDER_TESTS = {"genai": ("deamoe_trt.integrations.genai.export:is_genai_folder", "GenAI folder")}


@dataclass(frozen=True)
class Exported:
    path: Path
    checkpoint: Checkpoint
    description: str  # form, dtype, what, size

    def message(self) -> str:
        folder = "GenAI folder " if self.path.is_dir() else ""
        return f"wrote {folder}{self.path} ({self.description})"


def refuse_inapplicable(options: ExportOptions, checkpoint: Checkpoint) -> None:
    """A one-line UsageError for the first option given that checkpoint's artifact does not take."""
    kind = "lm" if checkpoint.artifact == "lm" else "layer"
    for name, (artifact, purpose) in _ONLY.items():
        if artifact != kind and getattr(options, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} does not apply to {checkpoint.path}, a {ARTIFACTS[checkpoint.artifact]} ({purpose}); drop it"
            )


def export_checkpoint(
    checkpoint: str | Path, output: str | Path, options: ExportOptions, *, progress: bool = False, note=None
) -> Exported:
    """Export the checkpoint in directory checkpoint to output (see the module docstring);
    progress: a progress line on stderr for a layer export; note(text): told of a folder replaced."""
    check_not_input(output, [checkpoint])  # before reading: the input stays whole
    found = read(checkpoint)
    refuse_inapplicable(options, found)
    if found.artifact == "lm":
        return _export_lm(found, Path(output), options, note)
    return _export_layers(found, Path(output), options, progress)


def _export_layers(found: Checkpoint, output: Path, options: ExportOptions, progress: bool) -> Exported:
    from .model import build_model

    check_writable(output)
    settings = _settings(options)
    steps = Progress(3, "export", enabled=progress)
    stack = found.stack()
    steps.update("checkpoint read")
    indices = list(settings.layers) if settings.layers is not None else list(range(len(stack.layers)))
    out_of_range = [i for i in indices if i >= len(stack.layers)]
    if out_of_range:
        raise UsageError(f"layer {out_of_range[0]} is out of range: {found.path} holds {len(stack.layers)} layer(s)")
    # One layer exports as the layer (y = layer(x)); several as the stack (x <- x + layer(x)).
    layers = [stack.layers[i] for i in indices]
    module = layers[0] if len(layers) == 1 else type(stack).from_layers(layers)
    model = build_model(
        module, settings.form, settings.dtype, settings.opset, max_tokens=settings.max_tokens, layer_indices=indices
    )
    steps.update("graph built")
    threshold = EXTERNAL_DATA_THRESHOLD if options.external_data_threshold is None else options.external_data_threshold
    path = save_model(model, output, external_data_threshold=threshold)
    steps.update("written")
    size, extra = path.stat().st_size, ""
    if data_path(path).exists():
        size += data_path(path).stat().st_size
        extra = f", weights in {data_path(path).name}"
    what = "1 layer" if len(indices) == 1 else f"{len(indices)} layers"
    return Exported(path, found, f"{settings.form} form, {settings.dtype}, {what}, {format_bytes(size)}{extra}")


def _settings(options: ExportOptions):
    """The recipe (if any) with the options put over it, checked."""
    from .recipe import Recipe, load_recipe, parse_layers

    recipe = load_recipe(options.recipe) if options.recipe else Recipe()
    layers = parse_layers(options.layers) if options.layers is not None else None
    settings = recipe.overridden(
        form=options.form, dtype=options.dtype, opset=options.opset, max_tokens=options.max_tokens, layers=layers
    )
    if options.layers == "all":  # overrides a recipe's list of layers
        settings = dataclasses.replace(settings, layers=None)
    if settings.form is None:
        raise UsageError("no form given: pass --form plugin|ort|onnx or a --recipe that sets form")
    return settings.overridden(dtype=settings.dtype or "fp32").check()


def _export_lm(found: Checkpoint, output: Path, options: ExportOptions, note=None) -> Exported:
    form, dtype, twin = options.form or "ort", options.dtype or "fp32", options.twin or "deamoe"
    if options.target in FOLDER_TARGETS:
        if options.external_data_threshold is not None:
            raise UsageError(
                f"--external-data-threshold places a single ONNX file's weights; not with --target {options.target}"
            )
        test, what = FOLDER_TESTS[options.target]
        check_replaceable(output, pkgutil.resolve_name(test), what, force=options.force)  # before loading
        loaded = found.lm()
        write_folder = pkgutil.resolve_name(FOLDER_TARGETS[options.target])
        folder = write_folder(
            loaded.model.twin(twin),
            output,
            form,
            dtype,
            options.opset,
            tokenizer=loaded.tokenizer,
            twin=twin,
            force=options.force,
            note=note,
        )
        size = sum(p.stat().st_size for p in folder.glob("*.onnx*"))  # the graph and its weights
        return Exported(folder, found, f"{twin}, {form} form, {dtype}, {format_bytes(size)}")
    from .lm import export_lm

    check_writable(output)
    loaded = found.lm()
    threshold = EXTERNAL_DATA_THRESHOLD if options.external_data_threshold is None else options.external_data_threshold
    path = export_lm(
        loaded.model.twin(twin),
        output,
        form,
        dtype,
        options.opset,
        tokenizer=loaded.tokenizer,
        twin=twin,
        external_data_threshold=threshold,
    )
    size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return Exported(path, found, f"{twin}, {form} form, {dtype}, {format_bytes(size)}")
