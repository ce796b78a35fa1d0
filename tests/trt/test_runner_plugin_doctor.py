"""Plugin resolution, the engine runner and doctor, with a fake TensorRT and fake GPUs."""

from __future__ import annotations

import pytest

from deamoe_trt.errors import MissingDependencyError, UsageError
from deamoe_trt.runtimes import tensorrt as runner
from deamoe_trt.trt import doctor, plugin
from deamoe_trt.trt.plugin import PluginChoice, resolve_plugin

from .conftest import AGX_ORIN, RTX_4090

# --- resolve_plugin -----------------------------------------------------------------------


def test_resolve_plugin(tmp_path, monkeypatch, no_plugin_search):
    assert resolve_plugin("python") == PluginChoice("python")
    lib = tmp_path / "libdeamoe_plugin.so"
    lib.write_bytes(b"x")
    assert resolve_plugin(str(lib)) == PluginChoice("library", lib.resolve())
    assert resolve_plugin(str(tmp_path)).path == lib.resolve()  # a folder holding the library
    with pytest.raises(UsageError, match="no such file"):
        resolve_plugin(str(tmp_path / "nope.so"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="folder without"):
        resolve_plugin(str(empty))
    nothing = resolve_plugin(None)
    assert nothing.kind == "none" and nothing.searched


def test_plugin_search_order(tmp_path, monkeypatch):
    lib = tmp_path / "custom.so"
    lib.write_bytes(b"x")
    monkeypatch.setenv(plugin.ENV_VAR, str(lib))
    assert resolve_plugin(None) == PluginChoice("library", lib, ())
    monkeypatch.delenv(plugin.ENV_VAR)
    monkeypatch.chdir(tmp_path)
    built = tmp_path / "build" / "plugins" / "libdeamoe_plugin.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(b"x")
    assert resolve_plugin(None).path == built.resolve()


def test_load_plugin_reuses_a_registered_creator(fake_trt, tmp_path):
    trt = fake_trt()
    trt.registry.creators[("DeaMoE", "1", "")] = object()
    lib = tmp_path / "libdeamoe_plugin.so"
    lib.write_bytes(b"not an ELF file")  # never dlopened: the creator is already there
    assert plugin.load_plugin(PluginChoice("library", lib), trt) == str(lib)


def test_load_plugin_reports_an_unloadable_library(fake_trt, tmp_path):
    trt = fake_trt()
    lib = tmp_path / "libdeamoe_plugin_broken.so"
    lib.write_bytes(b"not an ELF file")
    with pytest.raises(MissingDependencyError, match="does not load"):
        plugin.load_plugin(PluginChoice("library", lib), trt)
    with pytest.raises(MissingDependencyError, match="was not found"):
        plugin.load_plugin(PluginChoice("none"), trt)


def test_python_route_needs_tensorrt_10_6(fake_trt):
    from deamoe_trt.trt import qdp

    fake_trt("10.3.0")
    with pytest.raises(MissingDependencyError, match=r"needs TensorRT 10.6\+"):
        qdp.register()


# --- make_engine_runner -----------------------------------------------------------------------


def test_engine_runner(fake_trt, tmp_path, no_plugin_search):
    fake_trt()
    plain = tmp_path / "plain.engine"
    plain.write_bytes(b"engine without plugin layers")
    made = runner.make_engine_runner(plain)
    assert type(made).__name__ == "TrtRunner" and made.name == "tensorrt-plain.engine"
    with_layer = tmp_path / "moe.engine"
    with_layer.write_bytes(b"....DeaMoE....1....")
    with pytest.raises(MissingDependencyError, match="has DeaMoE layers but no plugin was found"):
        runner.make_engine_runner(with_layer)


def test_engine_runner_loads_the_plugin_first(fake_trt, tmp_path, monkeypatch):
    fake_trt()
    loaded = []
    monkeypatch.setattr(runner, "load_plugin", lambda choice, trt=None: loaded.append(choice))
    engine = tmp_path / "moe.engine"
    engine.write_bytes(b"DeaMoE")
    runner.make_engine_runner(engine, plugin_path="python")
    assert loaded == [PluginChoice("python")]


# --- doctor -----------------------------------------------------------------------------------


@pytest.fixture
def quiet_optional(monkeypatch):
    """Optional checks fixed, so the verdict depends on the needed ones only."""
    monkeypatch.setattr(doctor, "check_nvcc", lambda: doctor.Check("CUDA toolkit (nvcc)", "ok", "x", needed=False))
    monkeypatch.setattr(
        doctor, "check_tensorrt_headers", lambda: doctor.Check("TensorRT headers", "ok", "x", needed=False)
    )
    monkeypatch.setattr(doctor, "check_torch_cuda", lambda: doctor.Check("torch CUDA", "ok", "x", needed=False))
    monkeypatch.setattr(doctor, "check_kernels", lambda: doctor.Check("kernel self-test", "skipped", "x", needed=False))


def test_doctor_all_present(fake_trt, tmp_path, monkeypatch, quiet_optional):
    fake_trt("10.3.0")
    lib = tmp_path / "libdeamoe_plugin.so"
    lib.write_bytes(b"x")
    monkeypatch.setattr(plugin, "load_plugin", lambda choice, trt=None: str(choice.path))
    report = doctor.run_doctor(str(lib), query_gpu=lambda: AGX_ORIN)
    assert report.ok, report.table()
    table = report.table()
    assert "--target auto = orin" in table and "compute capability 8.7" in table and "CUDA driver 12.6" in table
    assert "everything needed" in table
    qdp_row = next(c for c in report.checks if c.name == "Python plugin (QDP)")
    assert qdp_row.status == "missing" and not qdp_row.needed  # 10.3 has no tensorrt.plugin: optional


def test_doctor_missing_pieces(fake_trt, no_plugin_search, quiet_optional):
    fake_trt("10.3.0")
    report = doctor.run_doctor(None, query_gpu=lambda: RTX_4090)
    assert not report.ok
    status = {c.name: c.status for c in report.checks}
    assert status["build target"] == "missing" and status["plugin library"] == "missing"
    assert "cmake -S plugins" in report.table()


def test_doctor_without_gpu(fake_trt, no_plugin_search, quiet_optional):
    fake_trt("10.3.0")

    def no_gpu():
        raise MissingDependencyError("no CUDA GPU found: nothing (install the NVIDIA driver, or JetPack on Jetson)")

    report = doctor.run_doctor(None, query_gpu=no_gpu)
    status = {c.name: c.status for c in report.checks}
    assert status["GPU"] == "missing" and status["build target"] == "skipped" and not report.ok


def test_doctor_python_route_covers_a_missing_library(fake_trt, no_plugin_search, quiet_optional, monkeypatch):
    from deamoe_trt.trt import qdp

    fake_trt("10.8.0")
    monkeypatch.setattr(qdp, "register", lambda: None)
    report = doctor.run_doctor(None, query_gpu=lambda: AGX_ORIN)
    assert report.ok, report.table()
    library = next(c for c in report.checks if c.name == "plugin library")
    assert library.status == "missing" and "--plugin python" in library.fix
    report = doctor.run_doctor("python", query_gpu=lambda: AGX_ORIN)
    assert report.ok


def test_doctor_never_raises(monkeypatch, quiet_optional, fake_trt):
    fake_trt()

    def broken():
        raise RuntimeError("driver exploded")

    report = doctor.run_doctor("/does/not/exist.so", query_gpu=broken)
    status = {c.name: (c.status, c.detail) for c in report.checks}
    assert status["GPU"][0] == "FAILED" and "driver exploded" in status["GPU"][1]
    assert status["plugin library"][0] == "FAILED" and "no such file" in status["plugin library"][1]
