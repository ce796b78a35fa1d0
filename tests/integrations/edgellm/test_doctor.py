"""`deamoe-trt doctor`'s Edge-LLM line: the version where it is installed, missing where not."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from deamoe_trt.errors import MissingDependencyError
from deamoe_trt.integrations.edgellm import PYTHON_ENV, edgellm_python
from deamoe_trt.integrations.edgellm.environment import doctor_check
from deamoe_trt.trt.doctor import MISSING, OK, run_doctor


def test_doctor_reports_the_installed_edgellm_version():
    try:
        python = edgellm_python()
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    check = doctor_check()
    assert check.status == OK and check.detail.startswith("0.11.") and str(python) in check.detail


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_edgellm") is not None, reason="this Python has Edge-LLM")
def test_doctor_reports_edgellm_missing_from_the_python_it_is_pointed_at(monkeypatch):
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    check = doctor_check()
    assert check.status == MISSING and "tensorrt_edgellm" in check.detail and not check.blocking


def test_doctor_reports_edgellm_through_the_integrations_check():
    report = run_doctor()
    lines = [c for c in report.checks if c.name == "TensorRT Edge-LLM"]
    assert len(lines) == 1 and (lines[0].status, lines[0].detail) == (doctor_check().status, doctor_check().detail)


def test_an_edgellm_python_that_cannot_run_is_refused_in_one_line(tmp_path):
    from deamoe_trt.errors import UsageError

    python = tmp_path / "python"
    python.write_text("not a program\n")
    with pytest.raises(UsageError, match=r"Edge-LLM Python .*python is not executable"):
        edgellm_python(str(python))
