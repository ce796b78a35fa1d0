"""No import cycles between the modules of deamoe_trt.

The graph is read from the source with ast, not by importing it. Every import statement
counts wherever it stands: at module level, inside a function (a deferred import is still
a dependency, only a later one) and under `if TYPE_CHECKING:` (a type-only import still
ties the two modules' designs together). `from package import name` is an edge to the
submodule package.name when there is one, else to the package. A package is not counted as
a dependency of its own submodules: importing deamoe_trt.a.b runs deamoe_trt/a/__init__.py
first, but that is Python's loading order, not something b asks for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import deamoe_trt

PACKAGE = Path(deamoe_trt.__file__).resolve().parent


def module_files(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py under package."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        modules[".".join(parts)] = (path, is_package)
    return modules


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (see the docstring for what counts)."""
    modules = module_files(package)
    root = package.name

    def known(name: str) -> str | None:
        """name, or the innermost module of the package that contains it (an attribute import)."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if target == root or target.startswith(root + "."):
                    resolved = known(target)
                    if resolved is not None and resolved != name:
                        edges.add(resolved)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def describe(component: set[str], graph: dict[str, set[str]]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & component))}" for m in sorted(component))


def test_the_package_has_no_import_cycles():
    graph = import_graph(PACKAGE)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def test_the_graph_sees_real_imports():
    """An independent check of the reader on edges the package is known to have."""
    graph = import_graph(PACKAGE)
    assert len(graph) > 100  # every module, subpackages included
    assert "deamoe_trt.checkpoint" in graph["deamoe_trt.layer"]  # module level, `from .checkpoint import (...)`
    assert "deamoe_trt.lm.checkpoint" in graph["deamoe_trt.cli.info_cmd"]  # inside a function


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import thing\n",
            "pkg/sub/__init__.py": "",
            "pkg/b.py": "def thing():\n    from pkg.sub import c\n",
            "pkg/sub/c.py": "from ..a import x\n",
            "pkg/d.py": "import pkg.a\n",  # into the cycle, not part of it
        },
    )
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert cycles(graph) == [{"pkg.a", "pkg.b", "pkg.sub.c"}]


def test_a_type_checking_import_counts_and_a_package_is_not_its_childrens_dependency(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n",
            "pkg/b.py": "from . import a\n",
        },
    )
    graph = import_graph(package)
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [{"pkg.a", "pkg.b"}]
