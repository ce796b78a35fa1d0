"""The remote code of a saved DeaMoE model directory: the package's own modules, copied.

`from_pretrained(dir, trust_remote_code=True)` imports the modules config.json's auto_map
names from the directory and, through their relative imports (`from .name import ...`),
the other modules beside them. This module writes the source of deamoe_trt.hf.modeling,
deamoe_trt.hf.configuration and every module of the package they import (deferred imports
included, as transformers copies and checks those too) into one flat folder: each module
becomes deamoe_<dotted path with underscores>.py and each import of the package becomes a
relative import of its flat name. Nothing else changes, so the directory's model runs the
package's own code, routing and DeaMoE layer included, with only transformers and torch
installed.

transformers refuses a remote module that names a package which is not installed, deferred
imports included; the packages a copied module imports only for other features (ONNX
export, chat templates) are therefore put in a `try: ... except ImportError: raise`, which
transformers' check skips and which behaves as the bare import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "deamoe_trt"
ROOTS = ("deamoe_trt.hf.modeling", "deamoe_trt.hf.configuration")
AUTO_MAP = {
    "AutoConfig": "deamoe_hf_configuration.DeaMoEPretrainedConfig",
    "AutoModelForCausalLM": "deamoe_hf_modeling.DeaMoEForCausalLM",
}
# What the remote model needs installed: transformers and what transformers itself requires.
NEEDED = frozenset({"torch", "transformers", "numpy", "safetensors"})
_HEADER = (
    "# Copied by deamoe-trt {version} from {module} (deamoe_trt.hf.remote_code); edit the package, not this file.\n"
)


def flat_name(module: str) -> str:
    """deamoe_trt.lm.model -> deamoe_lm_model."""
    return "deamoe_" + module.removeprefix(PACKAGE + ".").replace(".", "_")


def _package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def _module_file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    base = _package_dir().joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom in module names."""
    if not node.level:
        return node.module or ""
    anchor = module.split(".")
    if _module_file(module) is not None and _module_file(module).name != "__init__.py":  # type: ignore[union-attr]
        anchor = anchor[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def _rewritten(module: str) -> tuple[str, set[str]]:
    """module's source with its package imports made flat and relative, and the package
    modules it imports."""
    path = _module_file(module)
    assert path is not None, module
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # first line, last line (1-based), replacement
    needs: set[str] = set()
    for node in ast.walk(ast.parse(source, str(path))):
        indent = " " * getattr(node, "col_offset", 0)
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                edits.append((node.lineno, node.end_lineno or node.lineno, _flat_import(target, node, indent, needs)))
            elif node.module and node.module.split(".")[0] not in NEEDED | _stdlib():
                edits.append(_guarded(node, lines, indent))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == PACKAGE:
                    raise RuntimeError(f"{path}:{node.lineno}: import {PACKAGE} relatively")
                if top not in NEEDED | _stdlib():
                    edits.append(_guarded(node, lines, indent))
                    break
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1 : last] = [text]
    from .. import __version__

    return _HEADER.format(version=__version__, module=module) + "".join(lines), needs


def _flat_import(target: str, node: ast.ImportFrom, indent: str, needs: set[str]) -> str:
    """A package import as imports of the flat modules; a submodule imported by name
    (`from . import dtypes`) is bound by name and imported once more in the form transformers
    looks for (`from .name import ...`), so that it copies the file."""
    text, names = "", []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if _module_file(sub) is not None:
            needs.add(sub)
            flat = flat_name(sub)
            text += f"{indent}from . import {flat} as {alias.asname or alias.name}\n"
            text += f"{indent}from .{flat} import __name__ as _{flat}_name\n"
        else:
            names.append(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}")
    if names:
        if _module_file(target) is None:
            raise RuntimeError(f"{node.lineno}: {target} is not a module of {PACKAGE}")
        needs.add(target)
        text = f"{indent}from .{flat_name(target)} import {', '.join(names)}\n" + text
    return text


def _guarded(node: ast.stmt, lines: list[str], indent: str) -> tuple[int, int, str]:
    last = node.end_lineno or node.lineno
    body = "".join(
        indent + "    " + line.lstrip() if i == 0 else "    " + line
        for i, line in enumerate(lines[node.lineno - 1 : last])
    )
    return node.lineno, last, f"{indent}try:\n{body}{indent}except ImportError:\n{indent}    raise\n"


def _stdlib() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names) | {"__future__"}


def remote_code() -> dict[str, str]:
    """{file name: source} of every module the directory carries."""
    files: dict[str, str] = {}
    todo, seen = list(ROOTS), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        text, needs = _rewritten(module)
        files[flat_name(module) + ".py"] = text
        todo.extend(sorted(needs - seen))
    return dict(sorted(files.items()))


def write_remote_code(directory: str | Path) -> dict[str, str]:
    """Write the remote code into directory; returns config.json's auto_map."""
    directory = Path(directory)
    for name, text in remote_code().items():
        (directory / name).write_text(text, encoding="utf-8")
    return dict(AUTO_MAP)
