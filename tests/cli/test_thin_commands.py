"""cli/ holds no workflow: a command parses its flags and calls its stage, which writes.

Read from the source with ast (not by importing it). A module of deamoe_trt/cli may not call
what writes an output: the _io writers (replaced_directory, atomic_write_text, atomic_path),
a model's save_pretrained, or a path's write_text / write_bytes. Those calls belong to the
stage the command calls into (convert/workflow.py, quantize/run.py, export/run.py,
bench/run.py, runtimes/text_generation.py), where they can be called and tested without the
command line (CONTRIBUTING, "Layout rules").
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_graph import PACKAGE, write

WRITERS = frozenset(
    {"replaced_directory", "atomic_write_text", "atomic_path", "save_pretrained", "write_text", "write_bytes"}
)
# (module, writer) pairs still to be moved into their stage; entries must exist, so the list only shrinks.
KNOWN: set[tuple[str, str]] = set()


def writes(package: Path) -> set[tuple[str, str]]:
    """(cli module, writer it calls) for every call of a writer in package's cli/."""
    found = set()
    for path in sorted((package / "cli").glob("*.py")):
        module = f"{package.name}.cli.{path.stem}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in WRITERS:
                found.add((module, name))
    return found


def test_commands_leave_writing_to_their_stage():
    found = writes(PACKAGE) - KNOWN
    assert not found, "move the writing into the command's stage (see this file's docstring):\n" + "\n".join(
        f"{module} calls {name}" for module, name in sorted(found)
    )


def test_known_exceptions_still_exist():
    stale = KNOWN - writes(PACKAGE)
    assert not stale, "no longer called, remove from KNOWN: " + ", ".join(f"{m} -> {n}" for m, n in sorted(stale))


def test_a_command_that_writes_is_caught_and_one_that_calls_its_stage_is_not(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli/__init__.py": "",
            "pkg/cli/thick_cmd.py": (
                "def run(args):\n    with replaced_directory(args.o) as d:\n        m.save_pretrained(d)\n"
            ),
            "pkg/cli/thin_cmd.py": "def run(args):\n    from ..stage.run import go\n    return go(args.o)\n",
            "pkg/stage/run.py": "def go(o):\n    o.write_text('x')\n",
        },
    )
    assert writes(package) == {("pkg.cli.thick_cmd", "replaced_directory"), ("pkg.cli.thick_cmd", "save_pretrained")}
