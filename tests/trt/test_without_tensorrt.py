"""On a machine without TensorRT (CI, this one): lazy imports, and commands that say so in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.trt import _tensorrt

pytestmark = pytest.mark.skipif(_tensorrt.has_tensorrt(), reason="TensorRT is installed here")


@pytest.mark.slow
def test_importing_the_package_does_not_import_tensorrt():
    code = (
        "import sys; import deamoe_trt.trt.builder, deamoe_trt.runtimes.tensorrt, deamoe_trt.trt.doctor, "
        "deamoe_trt.trt.qdp, deamoe_trt.trt.plugin, deamoe_trt.cli.build_cmd, deamoe_trt.cli.doctor_cmd; "
        "import deamoe_trt.cli.main as m; m.build_parser(); "
        "assert 'tensorrt' not in sys.modules, 'tensorrt imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_build_says_tensorrt_is_missing(tiny_fp16, tmp_path, capsys):
    code, _, err = _run(["build", str(tiny_fp16), "-o", str(tmp_path / "m.engine")], capsys)
    assert code == 1
    assert err.startswith("deamoe-trt build: error: TensorRT is not installed") and "pip install tensorrt" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "m.engine").exists()


def test_build_usage_errors_come_first(tiny_fp16, tmp_path, capsys):
    code, _, err = _run(["build", str(tiny_fp16), "--target", "orin-nano", "--max-tokens", "999", "-o", "x"], capsys)
    assert code == 2 and "limit of 256" in err
    with pytest.raises(SystemExit) as info:
        main(["build", str(tiny_fp16), "--target", "xavier", "-o", "x"])
    assert info.value.code == 2


def test_validate_engine_says_tensorrt_is_missing(tmp_path, capsys):
    from deamoe_trt import DeaMoEStack, get_preset

    DeaMoEStack.random(get_preset("tiny"), 1).save_pretrained(tmp_path / "ckpt")
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not really an engine")
    code, _, err = _run(["validate", str(engine), "--against", str(tmp_path / "ckpt")], capsys)
    assert code == 1 and "TensorRT is not installed" in err and "Traceback" not in err


def test_doctor_reports_and_exits_1(capsys):
    code, out, err = _run(["doctor"], capsys)
    assert code == 1 and not err
    assert "TensorRT" in out and "missing" in out and "what to do:" in out
    assert "pip install tensorrt" in out


def test_make_engine_runner_without_tensorrt(tmp_path):
    from deamoe_trt.errors import MissingDependencyError, UsageError
    from deamoe_trt.runtimes.tensorrt import make_engine_runner

    with pytest.raises(UsageError, match="no engine file"):
        make_engine_runner(tmp_path / "missing.engine")
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    with pytest.raises(MissingDependencyError, match="TensorRT is not installed"):
        make_engine_runner(engine)
