"""runtimes/ is the one execution seam: nothing else opens a model to run it.

Read from the source with ast (not by importing it), over every module of deamoe_trt and the
Python samples. A module outside runtimes/ and integrations/ may not construct:

- an ONNX Runtime session (`InferenceSession(...)`): runtimes.onnxruntime.make_session is the
  one maker (the reference op for plugin nodes, external data, options in one place);
- a TensorRT engine or its runner (`Runtime(...)`, `.deserialize_cuda_engine(...)`,
  polygraphy's `TrtRunner`, `EngineFromBytes`): runtimes.tensorrt.load_engine and
  make_engine_runner are the loaders (the plugin registered first);
- a runtime's decoder or layer runner: any class whose name ends in "Decoder" defined in
  runtimes/ or cpu/, and the CPU kernel's CpuDeaMoE, CpuDeaMoEStack and NativeModel. Callers
  ask runtimes.get(name) for them (decoder, batch_decoder, prepare, load, load_decoder), so the
  registry's choices and capabilities hold for every run. Calling a class counts, and so does
  calling a class method on it (`OrtDecoder.from_model(...)`). The package that defines a
  class may build it (cpu/'s native step packs its own CpuDeaMoE FFNs).

Why: a run that opens its own session or engine skips the options, the plugin and the
refusals the runtime gives every other caller, and a decoder built by hand is invisible to the
commands that list what can decode. Tests are outside the rule: they check the classes
themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_graph import PACKAGE, module_files, write

SAMPLES = PACKAGE.parent / "samples" / "python"
SEAM = frozenset({"runtimes", "integrations"})
ENGINE_CALLS = frozenset({"InferenceSession", "Runtime", "deserialize_cuda_engine", "TrtRunner", "EngineFromBytes"})
KERNEL_RUNNERS = frozenset({"CpuDeaMoE", "CpuDeaMoEStack", "NativeModel"})
# (module, callee) pairs that break the rule and are still to be moved; entries must exist, so the list only shrinks.
KNOWN: set[tuple[str, str]] = set()


def area(module: str) -> str:
    """The package's subpackage (or top-level module) that holds module; "samples" for a sample."""
    parts = module.split(".")
    return parts[0] if parts[0] == "samples" or len(parts) == 1 else parts[1]


def runner_classes(package: Path) -> dict[str, str]:
    """Class name -> the area (runtimes, cpu) that defines it, for the decoders and layer runners."""
    found = {}
    for module, (path, _) in module_files(package).items():
        where = area(module)
        if where not in {"runtimes", "cpu"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Decoder") or node.name in KERNEL_RUNNERS):
                found[node.name] = where
    return found


def callee(call: ast.Call) -> tuple[str, str | None]:
    """(the called name, the name it is an attribute of): f() -> ("f", None), a.f() -> ("f", "a")."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id, None
    if isinstance(func, ast.Attribute):
        owner = func.value
        name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
        return func.attr, name
    return "", None


def constructions(package: Path, samples: Path | None = None) -> set[tuple[str, str]]:
    """(module, what it constructs) for every construction outside the seam (see the docstring)."""
    classes = runner_classes(package)
    files = {m: p for m, (p, _) in module_files(package).items()}
    if samples is not None:
        files.update({f"samples.{p.stem}": p for p in sorted(samples.glob("*.py"))})
    found = set()
    for module, path in files.items():
        where = area(module)
        if where in SEAM:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name, owner = callee(node)
            if name in ENGINE_CALLS:
                found.add((module, name))
            for cls in (name, owner):
                if cls in classes and classes[cls] != where:
                    found.add((module, cls))
    return found


def test_only_runtimes_and_integrations_construct_sessions_engines_and_decoders():
    found = constructions(PACKAGE, SAMPLES) - KNOWN
    assert not found, "run a model through deamoe_trt.runtimes (see this file's docstring):\n" + "\n".join(
        f"{module} constructs {name}" for module, name in sorted(found)
    )


def test_known_exceptions_still_exist():
    stale = KNOWN - constructions(PACKAGE, SAMPLES)
    assert not stale, "no longer constructed, remove from KNOWN: " + ", ".join(f"{a}: {b}" for a, b in sorted(stale))


def test_the_runner_classes_are_read_from_the_source():
    classes = runner_classes(PACKAGE)
    for name in ("TorchDecoder", "OrtDecoder", "TrtDecoder", "CpuDecoder", "CudaBatchDecoder", "SerialBatchDecoder"):
        assert classes[name] == "runtimes", name
    assert classes["CpuDeaMoE"] == classes["NativeDecoder"] == "cpu"


def test_a_session_an_engine_and_a_decoder_made_outside_the_seam_are_caught(tmp_path):
    package = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/runtimes/__init__.py": "",
            "pkg/runtimes/ort.py": (
                "import onnxruntime as ort\n"
                "class OrtDecoder:\n    @classmethod\n    def from_file(cls, p): ...\n"
                "def make(p):\n    return ort.InferenceSession(p), OrtDecoder()\n"
            ),
            "pkg/cpu/__init__.py": "",
            "pkg/cpu/layer.py": "class CpuDeaMoE: ...\ndef pack(l):\n    return CpuDeaMoE(l)\n",
            "pkg/integrations/__init__.py": "",
            "pkg/integrations/triton.py": "from ..runtimes.ort import OrtDecoder\nd = OrtDecoder()\n",
            "pkg/bench/__init__.py": "",
            "pkg/bench/run.py": (
                "import onnxruntime, tensorrt as trt\n"
                "from ..cpu import layer\nfrom ..runtimes.ort import OrtDecoder\n"
                "s = onnxruntime.InferenceSession('m.onnx')\n"
                "e = trt.Runtime(None).deserialize_cuda_engine(b'')\n"
                "d = OrtDecoder.from_file('m.onnx')\n"
                "f = layer.CpuDeaMoE(None)\n"
            ),
        },
    )
    samples = tmp_path / "samples"
    samples.mkdir()
    (samples / "sample.py").write_text("from pkg.runtimes.ort import OrtDecoder\nOrtDecoder()\n")
    assert constructions(package, samples) == {
        ("pkg.bench.run", "InferenceSession"),
        ("pkg.bench.run", "Runtime"),
        ("pkg.bench.run", "deserialize_cuda_engine"),
        ("pkg.bench.run", "OrtDecoder"),
        ("pkg.bench.run", "CpuDeaMoE"),
        ("samples.sample", "OrtDecoder"),
    }
