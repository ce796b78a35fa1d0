"""Export recipes: small TOML files naming how to export (form, dtype, opset, max_tokens, layers).

    # export-recipes/tiny-ort.toml
    description = "tiny preset on stock ONNX Runtime"
    form = "ort"            # plugin | ort | onnx
    dtype = "fp32"          # fp32 | fp16 | bf16 (bf16: plugin form only)
    opset = 17              # optional, default 17
    max_tokens = 64         # optional: largest tokens per step (TensorRT profile); recorded in the model
    layers = "all"          # optional: "all" or checkpoint layer indices, e.g. [0, 1]

Command-line flags override a recipe's values; a recipe names no checkpoint (any checkpoint
of a fitting shape can use it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..errors import UsageError
from .dtypes import get_dtype
from .graph import check_opset
from .layer_graph import check_form


@dataclass(frozen=True)
class Recipe:
    form: str | None = None
    dtype: str | None = None
    opset: int | None = None
    max_tokens: int | None = None
    layers: tuple[int, ...] | None = None  # None: every layer of the checkpoint
    description: str = ""

    def overridden(self, **flags: Any) -> Recipe:
        """This recipe with every flag that is not None put in its place."""
        return dataclasses.replace(self, **{k: v for k, v in flags.items() if v is not None})

    def check(self) -> Recipe:
        """Self, if every value set is one the exporter takes (UsageError naming the first that is not)."""
        if self.form is not None:
            check_form(self.form)
        if self.dtype is not None:
            get_dtype(self.dtype, self.form)
        if self.opset is not None:
            check_opset(self.opset)
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise UsageError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        return self


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no recipe at {path}")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"recipe {path} is not valid TOML: {exc}") from None
    known = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"recipe {path} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for key in ("form", "dtype", "description"):
        if key in data and not isinstance(data[key], str):
            raise UsageError(f"recipe {path}: {key} must be a string, got {data[key]!r}")
    for key in ("opset", "max_tokens"):
        if key in data and not _is_int(data[key]):
            raise UsageError(f"recipe {path}: {key} must be an integer, got {data[key]!r}")
    if "layers" in data:
        data["layers"] = parse_layers(data["layers"], where=f"recipe {path}")
    try:
        return Recipe(**data).check()
    except UsageError as exc:
        raise UsageError(f"recipe {path}: {exc}") from None


def parse_layers(value: Any, *, where: str = "--layers") -> tuple[int, ...] | None:
    """'all' -> None (every layer); [0, 2] or '0,2' -> (0, 2)."""
    if value == "all":
        return None
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f'{where}: layers must be "all" or indices like 0,1, got {value!r}') from None
    if not isinstance(value, list) or not value or not all(_is_int(i) and i >= 0 for i in value):
        raise UsageError(f'{where}: layers must be "all" or a non-empty list of indices >= 0, got {value!r}')
    if len(set(value)) != len(value):
        raise UsageError(f"{where}: layers repeat an index: {value!r}")
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
