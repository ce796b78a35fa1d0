"""Run a real `tritonserver` on loopback: the binary and Python backend the nvidia-pytriton wheel ships.

The wheel (PyPI `nvidia-pytriton`) carries Triton Inference Server's C++ binary, its Python
backend and one Python-backend stub per CPython minor version, with the shared libraries they
need in `nvidia_pytriton.libs`. We use only those files, not pytriton's Python API: the server
runs a model repository written by `deamoe-trt triton-repo`, exactly as a Triton container would.

What a run needs, found here rather than guessed at launch time (`unavailable()` says which is missing):
- the binary and the stub for this interpreter's version (the stub embeds libpython, so the
  model code runs on the same CPython as this process);
- libpython as a shared library (pyenv and Debian's python3 have one; a static build does not);
- numpy 1.x for the model code: the stub's C++ (pybind11, Triton 24.10) reads numpy 1.x array
  descriptors, and with numpy 2 it misreads item sizes (inputs arrive garbled, outputs are
  rejected with "output tensor shape does not match size"). This project runs numpy 2, and
  the stub's embedded interpreter is isolated (it ignores PYTHONPATH), so the server gets a
  small venv of its own, `.venv/triton-python` (`setup_python_env`, run by scripts/setup.sh):
  numpy 1.26 and ml_dtypes 0.5 in its site-packages, then, through a .pth file, the project
  venv's site-packages for everything else (torch and ONNX Runtime, built against numpy 2's
  API, run on numpy 1.26 too). The stub finds that venv through PATH.

The server gets free loopback ports, a log file, and is stopped with SIGTERM then SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ...checkout import import_root
from ...errors import DeaMoEError, MissingDependencyError

INSTALL_HINT = "scripts/setup.sh installs it: pip install --no-deps nvidia-pytriton"
PYTHON_ENV_VAR = "DEAMOE_TRITON_PYTHON_ENV"  # the server's venv, if not <this venv>/triton-python
SYS_PATH_VAR = "DEAMOE_TRITON_SYS_PATH"  # folders the model code puts first on sys.path
SERVER_NUMPY = ("numpy<2", "ml_dtypes<=0.5.4")
# What tritonserver logs as errors on every start without a GPU: not the reason anything failed.
GPU_LESS_NOISE = ("NVML", "DCGM", "CudaDriverHelper", "CUDA driver version")


@dataclass(frozen=True)
class TritonDist:
    """Where the wheel's files are."""

    binary: Path
    python_backend: Path  # libtriton_python.so + triton_python_backend_utils.py
    stub: Path  # triton_python_backend_stub for this interpreter
    libs: Path  # nvidia_pytriton.libs
    libpython_dir: Path
    python_env: Path  # the venv the stub runs in (numpy 1.x; see the module docstring)


def python_env_path() -> Path:
    configured = os.environ.get(PYTHON_ENV_VAR)
    return Path(configured) if configured else Path(sys.prefix) / "triton-python"


def setup_python_env(folder: str | Path | None = None) -> Path:
    """Make the server's venv at folder (default python_env_path()): numpy 1.x first, then this venv.

    Installs with pip from the configured index; rerunning only refreshes it.
    """
    folder = Path(folder) if folder else python_env_path()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = folder / "lib" / version / "site-packages"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--upgrade"]
    subprocess.run([*pip, "--target", str(site_packages), *SERVER_NUMPY], check=True)
    own = sysconfig.get_path("purelib")
    # addsitedir (not a plain path line) so this venv's own .pth files (editable installs) apply too.
    (site_packages / "zz_deamoe_trt_project_env.pth").write_text(f"import site; site.addsitedir({own!r})\n")
    return folder


def server_python_env() -> Path:
    """The server's venv, checked; MissingDependencyError saying how to make it."""
    folder = python_env_path()
    numpy_dirs = sorted((folder / "lib").glob("python*/site-packages/numpy-1.*.dist-info"))
    if not (folder / "bin" / "python3").exists() or not numpy_dirs:
        raise MissingDependencyError(
            f"tritonserver's Python backend needs numpy 1.x and its own venv at {folder}, which is missing: "
            f"make it with `python -m deamoe_trt.integrations.triton.server --setup-python-env` (scripts/setup.sh does)"
        )
    return folder


def find_dist() -> TritonDist:
    """The tritonserver files for this interpreter; MissingDependencyError naming what is missing."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"no tritonserver here: the nvidia-pytriton wheel is not installed ({INSTALL_HINT})"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    dist = root / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    libpython = sysconfig.get_config_var("LDLIBRARY") or ""
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "")
    found = TritonDist(
        binary=dist / "bin" / "tritonserver",
        python_backend=dist / "backends" / "python",
        stub=dist / "python_backend_stubs" / version / "triton_python_backend_stub",
        libs=root.parent / "nvidia_pytriton.libs",
        libpython_dir=libdir,
        python_env=Path(),
    )
    if not found.binary.is_file():
        raise MissingDependencyError(f"the nvidia-pytriton wheel has no tritonserver binary at {found.binary}")
    if not found.stub.is_file():
        raise MissingDependencyError(f"the nvidia-pytriton wheel has no Python-backend stub for Python {version}")
    if not libpython.endswith(".so") and not (libdir / f"libpython{version}.so.1.0").is_file():
        raise MissingDependencyError(
            f"this Python ({sys.executable}) has no shared libpython{version}, which the Python-backend stub "
            "embeds; use a Python built with --enable-shared (pyenv's, Debian's)"
        )
    return dataclasses.replace(found, python_env=server_python_env())


def unavailable() -> str | None:
    """Why tritonserver cannot run here, or None when it can (for test skips and the CLI)."""
    try:
        find_dist()
    except MissingDependencyError as exc:
        return str(exc)
    if sys.platform != "linux":
        return f"tritonserver runs on Linux only, not {sys.platform}"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TritonServer:
    """One tritonserver process on 127.0.0.1 serving `repository`; a context manager.

    Ports are picked free at construction and kept across restart(), so clients can retry the
    same address. The log goes to `log_path` (read it with log()).
    """

    repository: Path
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    start_timeout_s: float = 120.0
    extra_args: tuple[str, ...] = ()
    workdir: Path | None = None
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.repository = Path(self.repository).resolve()
        self._tmp = None
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="deamoe-triton-")
            self.workdir = Path(self._tmp.name)
        self.log_path = self.workdir / "tritonserver.log"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def _backends(self, dist: TritonDist) -> Path:
        """Triton's --backend-directory: the Python backend with this interpreter's stub beside it."""
        backends = self.workdir / "backends"
        python = backends / "python"
        if not (python / "triton_python_backend_stub").is_file():
            python.mkdir(parents=True, exist_ok=True)
            for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
                shutil.copy2(dist.python_backend / name, python / name)
            shutil.copy2(dist.stub, python / "triton_python_backend_stub")
        return backends

    def _env(self, dist: TritonDist) -> dict[str, str]:
        env = os.environ.copy()
        libs = [str(dist.libs), str(dist.libpython_dir)]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
        # The stub's embedded interpreter finds its prefix (and so its venv) through PATH.
        env["PATH"] = os.pathsep.join([str(dist.python_env / "bin"), env.get("PATH", "")])
        # The model code imports deamoe_trt from wherever this process does (a checkout may not be installed).
        env[SYS_PATH_VAR] = str(import_root())
        return env

    def command(self, dist: TritonDist) -> list[str]:
        return [
            str(dist.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self._backends(dist)}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            # Metrics listen on all interfaces unless told otherwise; keep everything on loopback.
            "--metrics-address=127.0.0.1",
            "--exit-timeout-secs=5",
            "--log-verbose=0",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        dist = find_dist()
        if self.process is not None and self.process.poll() is None:
            raise DeaMoEError("tritonserver is already running")
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(dist),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(dist),
            cwd=self.workdir,
            start_new_session=True,  # its own process group: stop() ends the stubs with it
        )
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DeaMoEError(
                    f"tritonserver exited with code {self.process.returncode} while starting: {self.last_error()}"
                )
            if self.ready():
                return
            time.sleep(0.2)
        self.stop()
        raise DeaMoEError(f"tritonserver was not ready within {self.start_timeout_s:g} s: {self.last_error()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def stop(self, *, kill: bool = False, timeout_s: float = 15.0) -> None:
        """SIGTERM (graceful: in-flight requests get exit-timeout-secs) or SIGKILL, then reap."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)
        # The Python-backend stubs share the process group; make sure none outlives the server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def restart(self, *, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def last_error(self) -> str:
        """The server's last few error lines, less what every GPU-less start logs."""
        lines = [
            line
            for line in self.log().splitlines()
            if (line.startswith("E") or "error" in line.lower()) and not any(n in line for n in GPU_LESS_NOISE)
        ]
        return " | ".join(lines[-3:])[-600:] or f"no error in the log ({self.log_path})"

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Set up or check the tritonserver this project's tests run.")
    parser.add_argument("--setup-python-env", action="store_true", help="make the server's numpy-1.x venv")
    if parser.parse_args().setup_python_env:
        print(f"tritonserver Python env: {setup_python_env()}")
    reason = unavailable()
    print(f"tritonserver: {'not available: ' + reason if reason else 'available'}")
    sys.exit(1 if reason else 0)
