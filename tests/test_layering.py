"""Which package of deamoe_trt may import which (CONTRIBUTING, "Layout rules").

Read from the same import graph as tests/test_import_graph.py (every import statement,
deferred and type-only ones included). The areas:

- core: the top-level modules (config, layer, routing, traffic, dtypes, errors, contract,
  checkpoints, safetensors I/O, presets, quant, inputs, ...). They import no package:
  every other part builds on them.
- lm/: the language model itself. It imports the core and nothing else.
- cpu/, cuda/: the kernels' bindings. They import the core, lm/ and each other, no stage.
- cli/: the commands. Nothing but cli/ imports it.
- integrations/: one subpackage per outside engine (vllm, triton, edgellm, genai, llamacpp).
  They import the core, lm/, the kernels and the stages; no stage imports them (only cli/ and
  the entry points do), so a piece a stage and an integration share lives in the stage. A
  stage may still name an integration's object lazily by a "module:attr" string (not an import).
- ALIASES: an old import path kept for one release (serving/, for Triton model repositories
  written before integrations/triton); it imports only its new home in integrations/.
- every other package is a stage (importers, train, convert, quantize, export, validation,
  trt, runtimes, bench, checks, and any new one).

The package's own __init__ (the public names, re-exported from the core, with `from_hf`
importing the importers when called) and __main__ (which runs cli/) are entry points, not
part of the core. An arrow that breaks a rule today and has not been moved yet is listed in
KNOWN with why; an entry that no longer exists fails, so the list only shrinks.
"""

from __future__ import annotations

from pathlib import Path

from test_import_graph import PACKAGE, import_graph, write

ENTRY_POINTS = frozenset({"deamoe_trt", "deamoe_trt.__main__"})
KERNELS = frozenset({"cpu", "cuda"})
INTEGRATIONS = "integrations"
# Old import paths kept for one release, each only re-exporting its new home in integrations/:
# serving/: Triton model repositories an earlier release wrote import deamoe_trt.serving.decode_model.
ALIASES = frozenset({"serving"})

# (importer, imported) module pairs that break a rule and are still to be moved, each with why.
KNOWN: set[tuple[str, str]] = set()


def area(module: str, package: Path) -> str:
    """'entry', 'core', or the name of the subpackage that holds module."""
    root = package.name
    if module == root or module == f"{root}.__main__":
        return "entry"
    parts = module.split(".")
    if len(parts) == 2 and (package / f"{parts[1]}.py").is_file():
        return "core"
    return parts[1]


def allowed(source: str, target: str) -> bool:
    """Whether a module of area source may import one of area target."""
    if target == "entry":
        return True  # the public names are the core's, re-exported
    if source == "entry" or source == target:
        return True
    if source == "core":
        return False
    if source == "lm":
        return target == "core"
    if source in KERNELS:
        return target in {"core", "lm"} | KERNELS
    if source in ALIASES:
        return target == INTEGRATIONS
    if target == INTEGRATIONS:
        return source == "cli"
    return target != "cli"


def violations(package: Path) -> set[tuple[str, str]]:
    graph = import_graph(package)
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if not allowed(area(module, package), area(target, package))
    }


def test_each_package_imports_only_what_its_layer_may():
    found = violations(PACKAGE) - KNOWN
    assert not found, "imports across the layers (see this file's docstring):\n" + "\n".join(
        f"{a} -> {b}" for a, b in sorted(found)
    )


def test_known_exceptions_still_exist():
    stale = KNOWN - violations(PACKAGE)
    assert not stale, "no longer imported, remove from KNOWN: " + ", ".join(f"{a} -> {b}" for a, b in sorted(stale))


def test_areas_are_read_from_the_layout():
    assert area("deamoe_trt", PACKAGE) == "entry"
    assert area("deamoe_trt.routing", PACKAGE) == "core"
    assert area("deamoe_trt.safetensors_io", PACKAGE) == "core"
    assert area("deamoe_trt.lm.checkpoint_format", PACKAGE) == "lm"
    assert area("deamoe_trt.runtimes.base", PACKAGE) == "runtimes"
    assert area("deamoe_trt.integrations.vllm.export", PACKAGE) == "integrations"


def test_a_core_module_importing_a_stage_and_a_stage_importing_cli_are_caught(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "from .config import C\n",
            "pkg/config.py": "def f():\n    from .importers.io import read\n",
            "pkg/importers/__init__.py": "",
            "pkg/importers/io.py": "from ..config import C\nfrom ..cli.args import x\n",
            "pkg/lm/__init__.py": "",
            "pkg/lm/model.py": "from ..config import C\nfrom ..cpu.step import s\n",
            "pkg/cpu/__init__.py": "",
            "pkg/cpu/step.py": "from ..lm import model\n",
            "pkg/cli/__init__.py": "",
            "pkg/cli/args.py": "from ..importers import io\n",
        },
    )
    assert violations(package) == {
        ("pkg.config", "pkg.importers.io"),
        ("pkg.importers.io", "pkg.cli.args"),
        ("pkg.lm.model", "pkg.cpu.step"),
    }


def test_a_stage_importing_an_integration_is_caught_and_the_reverse_is_not(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/config.py": "",
            "pkg/bench/__init__.py": "",
            "pkg/bench/tables.py": "from ..config import C\n",
            "pkg/bench/run.py": "def f():\n    from ..integrations.eng.bench import g\n",
            "pkg/integrations/__init__.py": "",
            "pkg/integrations/eng/__init__.py": "",
            "pkg/integrations/eng/bench.py": "from ...bench.tables import t\nfrom ...config import C\n",
            "pkg/cli/__init__.py": "",
            "pkg/cli/eng_cmd.py": "from ..integrations.eng.bench import g\n",
        },
    )
    assert violations(package) == {("pkg.bench.run", "pkg.integrations.eng.bench")}
