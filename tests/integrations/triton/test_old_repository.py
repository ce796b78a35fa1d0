"""A model repository written before the decode service moved to integrations/triton still loads."""

import importlib.util
import sys
import types

# The model.py `deamoe-trt triton-repo lm` of an earlier release wrote (its import line is what differs).
OLD_MODEL_PY = '''"""Triton Python-backend entry of the deamoe-trt LM decode service (from `deamoe-trt triton-repo`)."""

import os
import sys

# deamoe_trt comes from the server's Python environment; a launcher may put a checkout first.
sys.path[:0] = [p for p in os.environ.get("DEAMOE_TRITON_SYS_PATH", "").split(os.pathsep) if p]

from deamoe_trt.serving.decode_model import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
'''

DECODE_MODULES = (
    "deamoe_trt.serving",
    "deamoe_trt.serving.decode_model",
    "deamoe_trt.integrations.triton.decode_model",
)


def test_an_old_repositorys_model_py_gets_the_decode_service(tmp_path, monkeypatch):
    # Triton's Python-backend stub provides this module; the service reads one constant at import.
    stub = types.ModuleType("triton_python_backend_utils")
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    for name in DECODE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported afresh against the stub
    model_py = tmp_path / "model.py"
    model_py.write_text(OLD_MODEL_PY)
    spec = importlib.util.spec_from_file_location("old_repository_model", model_py)
    assert spec is not None and spec.loader is not None
    try:
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        service = importlib.import_module("deamoe_trt.integrations.triton.decode_model")
        assert old.TritonPythonModel is service.TritonPythonModel
    finally:
        for name in DECODE_MODULES:  # bound to the stub: later tests import the real ones
            sys.modules.pop(name, None)
