"""The package reads nothing from the repository around it: what it runs ships inside it.

Read from the source with ast: a path built from `__file__` that climbs above deamoe_trt/
(`Path(__file__).parents[n]`, `.parent` chains), and a string that names the repository's
tests/ or samples/ as a path ("tests", "samples/models/...", not prose that mentions them),
in code, not in docstrings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import deamoe_trt

PACKAGE = Path(deamoe_trt.__file__).resolve().parent

REPOSITORY_PATH = re.compile(r"^(\./)?(tests|samples)(/|$)")


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def levels_up(node: ast.AST) -> int | None:
    """How many directories above the file's own a `Path(__file__)...` expression ends, or None
    if node is not one (`.parent` is one level, `.parents[n]` n + 1, `.resolve()` none)."""
    up = 0
    while True:
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            up, node = up + 1, node.value
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
        ):
            up, node = up + node.slice.value + 1, node.value.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve":
            node = node.func.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path":
            if len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__":
                return up
            return None
        else:
            return None


def docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def enclosing_names(tree: ast.Module) -> dict[int, str]:
    """id(node) -> the name of the top-level function, class or assignment target it sits in."""
    names: dict[int, str] = {}
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = top.name
        elif isinstance(top, ast.Assign) and isinstance(top.targets[0], ast.Name):
            name = top.targets[0].id
        elif isinstance(top, ast.AnnAssign) and isinstance(top.target, ast.Name):
            name = top.target.id
        else:
            name = "<module>"
        for node in ast.walk(top):
            names[id(node)] = name
    return names


def repository_paths(package: Path) -> list[tuple[str, str, int, str]]:
    """(module, enclosing name, line, what) of every reach outside the package."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        module = module_name(path, package)
        depth = len(path.relative_to(package).parts)  # `up` of the package's own directory
        skip = docstrings(tree)
        names = enclosing_names(tree)
        for node in ast.walk(tree):
            up = levels_up(node)
            if up is not None and up > depth:
                found.append((module, names.get(id(node), "?"), node.lineno, f"__file__ {up} levels up"))
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and REPOSITORY_PATH.match(node.value)
            ):
                found.append((module, names.get(id(node), "?"), node.lineno, repr(node.value)))
    return sorted(set(found))


def test_the_package_reads_no_repository_paths():
    """What only a checkout holds is found through deamoe_trt.checkout (an environment variable
    or the editable install's record), never by climbing from a module's own file."""
    found = repository_paths(PACKAGE)
    assert not found, "\n".join(f"{m}:{line} ({name}): {what}" for m, name, line, what in found)


def test_the_reader_flags_climbing_paths_and_repository_strings_only(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "m.py").write_text(
        '"""Docstrings may mention tests/ and samples/models."""\n'
        "from pathlib import Path\n"
        'INSIDE = Path(__file__).resolve().parents[1] / "data"\n'  # pkg/: inside
        'OUTSIDE = Path(__file__).resolve().parents[2] / "plugins"\n'  # above pkg/
        "ALSO_OUTSIDE = Path(__file__).parent.parent.parent\n"
        'def f():\n    return Path("samples/models/tiny-lm"), ROOT / "tests" / "x"\n'
        'HELP = "a checkpoint (e.g. one that tests/ writes)"\n'
    )
    found = {(name, what) for _, name, _, what in repository_paths(package)}
    assert found == {
        ("OUTSIDE", "__file__ 3 levels up"),
        ("ALSO_OUTSIDE", "__file__ 3 levels up"),
        ("f", "'samples/models/tiny-lm'"),
        ("f", "'tests'"),
    }
