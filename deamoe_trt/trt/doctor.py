"""`deamoe-trt doctor`: what this machine has for deploying DeaMoE with TensorRT, and what to do.

Each check is independent and never raises: a check that crashes reports "failed" with
the reason. Needed checks decide the exit code; optional ones only inform (building the
plugin needs nvcc and TensorRT's headers, running an engine does not).
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..console import format_table
from ..errors import DeaMoEError, MissingDependencyError, one_line
from . import targets as tg

OK, MISSING, FAILED, SKIPPED, INFO = "ok", "missing", "FAILED", "skipped", "info"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    needed: bool = True

    @property
    def blocking(self) -> bool:
        return self.needed and self.status in (MISSING, FAILED)


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.blocking for c in self.checks)

    def table(self) -> str:
        rows = [(c.name, _status_text(c), c.detail) for c in self.checks]
        lines = [format_table(("check", "status", "found"), rows, align="lll")]
        fixes = [c for c in self.checks if c.fix and c.status not in (OK, INFO)]
        if fixes:
            lines += ["", "what to do:"]
            lines += [f"- {c.name}: {c.fix}" for c in fixes]
        verdict = (
            "everything needed to build and run DeaMoE engines is here"
            if self.ok
            else "missing pieces above block building or running DeaMoE engines"
        )
        lines += ["", verdict]
        return "\n".join(lines)


def _status_text(check: Check) -> str:
    if check.needed or check.status in (OK, INFO, SKIPPED):
        return check.status
    return f"{check.status} (optional)"


def _guard(name: str, needed: bool, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except DeaMoEError as exc:
        return Check(name, FAILED, one_line(exc), needed=needed)
    except Exception as exc:
        return Check(name, FAILED, f"{type(exc).__name__}: {one_line(exc)}", needed=needed)


# Outside engines' lines, each a "module:function" returning a Check, named rather than imported
# (this stage imports no integration; pkgutil.resolve_name finds it when doctor runs).
ENGINE_CHECKS = {"TensorRT Edge-LLM": "deamoe_trt.integrations.edgellm.environment:doctor_check"}


def _engine_check(where: str) -> Check:
    check: Check = pkgutil.resolve_name(where)()  # resolved inside the guard: an import error is a failed line
    return check


# ---------------------------------------------------------------------------------------
# Individual checks
# ---------------------------------------------------------------------------------------


def check_gpu(query: Callable[[], tg.GpuInfo]) -> tuple[Check, tg.GpuInfo | None]:
    from .device import DRIVER_HINT, format_driver_version

    try:
        gpu = query()
    except MissingDependencyError as exc:
        detail = one_line(exc).replace(f" ({DRIVER_HINT})", "")
        return Check("GPU", MISSING, detail, DRIVER_HINT), None
    kind = ", integrated (Jetson)" if gpu.integrated else ""
    detail = (
        f"{gpu.name}, compute capability {gpu.cc} ({gpu.sm}), {gpu.total_memory / 2**30:.1f} GiB{kind}; "
        f"CUDA driver {format_driver_version(gpu.driver_version)}"
    )
    return Check("GPU", OK, detail), gpu


def check_target(gpu: tg.GpuInfo | None) -> Check:
    if gpu is None:
        return Check("build target", SKIPPED, "no GPU", needed=False)
    try:
        profile = tg.target_for_gpu(gpu)
    except DeaMoEError as exc:
        return Check("build target", MISSING, one_line(exc), "deamoe-trt has no target profile for this GPU (see docs)")
    return Check(
        "build target",
        OK,
        f"--target auto = {profile.name}: {profile.precision}, workspace {profile.workspace_bytes >> 20} MiB, "
        f"tokens up to {profile.max_tokens_limit}",
    )


def check_tensorrt() -> tuple[Check, object | None]:
    from ._tensorrt import INSTALL_HINT, import_tensorrt

    try:
        trt = import_tensorrt()
    except MissingDependencyError as exc:
        return Check("TensorRT", MISSING, one_line(exc).replace(f" ({INSTALL_HINT})", ""), INSTALL_HINT), None
    where = Path(getattr(trt, "__file__", "?")).parent
    return Check("TensorRT", OK, f"{trt.__version__} (Python bindings at {where})"), trt


def check_plugin_library(plugin_arg: str | None, trt) -> Check:
    from .plugin import BUILD_HINT, load_plugin, resolve_plugin

    name = "plugin library"
    choice = resolve_plugin(plugin_arg if plugin_arg != "python" else None)
    if choice.kind == "none":
        return Check(
            name, MISSING, f"not found (searched DEAMOE_TRT_PLUGIN and {len(choice.searched)} paths)", BUILD_HINT
        )
    if trt is None:
        return Check(name, SKIPPED, f"{choice.path} (not loaded: no TensorRT)", needed=False)
    load_plugin(choice, trt)
    return Check(name, OK, f"{choice.path}: loads, DeaMoE v1 creator registered")


def check_qdp(trt, needed: bool) -> Check:
    from ._tensorrt import tensorrt_version
    from .qdp import MIN_TENSORRT, register

    name = "Python plugin (QDP)"
    if trt is None:
        return Check(name, SKIPPED, "no TensorRT", needed=False)
    if tensorrt_version(trt) < MIN_TENSORRT:
        return Check(
            name,
            MISSING,
            f"TensorRT {trt.__version__} has no tensorrt.plugin (10.6+)",
            "use the C++ plugin library, or TensorRT 10.6+",
            needed=needed,
        )
    register()
    return Check(name, OK, "deamoe_trt::DeaMoE registered (--plugin python)", needed=needed)


def check_torch_cuda() -> Check:
    import torch

    if torch.cuda.is_available():
        return Check("torch CUDA", OK, f"torch {torch.__version__}, CUDA {torch.version.cuda}", needed=False)
    return Check(
        "torch CUDA",
        MISSING,
        f"torch {torch.__version__} without a CUDA device",
        "needed for --plugin python and the kernel self-test: a CUDA build of torch (JetPack: NVIDIA's wheel)",
        needed=False,
    )


def check_kernels(run_self_test: Callable[[], str] | None = None) -> Check:
    """The CUDA kernels against the PyTorch reference, through deamoe_trt.cuda, when it is usable."""
    name = "kernel self-test"
    try:
        cuda = importlib.import_module("deamoe_trt.cuda")
    except ImportError as exc:
        return Check(name, SKIPPED, f"deamoe_trt.cuda is not importable ({one_line(exc)})", needed=False)
    test = run_self_test or getattr(cuda, "self_test", None) or kernel_self_test
    try:
        detail = test()
    except MissingDependencyError as exc:  # no GPU, or the kernel library is not built: nothing to test
        return Check(name, SKIPPED, one_line(exc), needed=False)
    return Check(name, OK, str(detail))


# (atol, rtol) as deamoe_trt.validation's defaults: an element fails only beyond both.
_SELF_TEST_TOLERANCES = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2)}


def kernel_self_test() -> str:
    """The cuda runtime's forward against the PyTorch reference: tiny preset, fp32 and fp16, 1/4/16 tokens.

    The first call may build the kernel library for this GPU (a minute or two, once)."""
    import torch

    from .. import cuda, runtimes
    from ..inputs import random_hidden
    from ..layer import DeaMoELayer
    from ..presets import get_preset

    if not torch.cuda.is_available():
        raise cuda.CudaUnavailableError(f"torch {torch.__version__} sees no CUDA GPU")
    from ..runtimes.cuda import CudaRuntime

    kernels = runtimes.get("cuda")
    assert isinstance(kernels, CudaRuntime)  # forward: the kernels on one layer, this runtime's own call
    config = get_preset("tiny")
    worst = 0.0
    for dtype_name, (atol, rtol) in _SELF_TEST_TOLERANCES.items():
        dtype = getattr(torch, dtype_name)
        layer = DeaMoELayer.random(config, seed=0, dtype=dtype).to("cuda")
        for tokens in (1, 4, 16):
            x = random_hidden(tokens, config.hidden_size, seed=tokens, dtype=dtype).to("cuda")
            with torch.no_grad():
                want = layer(x).float()
                got = kernels.forward(layer, x).float()
            error = (got - want).abs()
            worst = max(worst, float(error.max()))
            if bool((error > atol + rtol * want.abs()).any()):
                raise DeaMoEError(
                    f"the kernels disagree with the reference: tiny preset, {dtype_name}, {tokens} token(s), "
                    f"max |error| {float(error.max()):.2e} (atol {atol:g}, rtol {rtol:g})"
                )
    return f"tiny preset, fp32 and fp16, 1/4/16 tokens: max |error| {worst:.1e} vs the PyTorch reference"


def check_nvcc() -> Check:
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).is_file()), None)
    if nvcc is None:
        return Check(
            "CUDA toolkit (nvcc)",
            MISSING,
            "nvcc not on PATH or in /usr/local/cuda/bin",
            "only to build the plugin: install the CUDA toolkit "
            "(JetPack has it: export PATH=/usr/local/cuda/bin:$PATH)",
            needed=False,
        )
    version = ""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
        match = re.search(r"release (\d+\.\d+)", out)
        version = f" (CUDA {match.group(1)})" if match else ""
    except (OSError, subprocess.SubprocessError):
        pass
    return Check("CUDA toolkit (nvcc)", OK, f"{nvcc}{version}", needed=False)


def tensorrt_header_dirs() -> list[Path]:
    """Where TensorRT headers usually are: TENSORRT_ROOT, then the system (JetPack, .deb installs)."""
    dirs = []
    root = os.environ.get("TENSORRT_ROOT")
    arch = f"{platform.machine()}-linux-gnu"
    if root:
        dirs += [Path(root) / "include", Path(root) / "include" / arch]
    dirs += [Path("/usr/include") / arch, Path("/usr/include"), Path("/usr/local/include")]
    return dirs


def check_tensorrt_headers() -> Check:
    for d in tensorrt_header_dirs():
        if (d / "NvInferRuntime.h").is_file():
            version = _header_version(d / "NvInferVersion.h")
            prefix = d.parent.parent if d.parent.name == "include" else d.parent
            return Check(
                "TensorRT headers",
                OK,
                f"{d} (TensorRT {version}); build with -DTENSORRT_ROOT={prefix}",
                needed=False,
            )
    return Check(
        "TensorRT headers",
        MISSING,
        "no NvInferRuntime.h in TENSORRT_ROOT or /usr/include",
        "only to build the C++ plugin: the TensorRT tarball/.deb dev package (JetPack: sudo apt install "
        "libnvinfer-dev), then export TENSORRT_ROOT; pip wheels ship no headers (use --plugin python there)",
        needed=False,
    )


def _header_version(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "?"
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define (?:NV_TENSORRT_{part}|TRT_{part}_ENTERPRISE) (\d+)", text)
        parts.append(match.group(1) if match else "?")
    return ".".join(parts)


# ---------------------------------------------------------------------------------------


def run_doctor(plugin: str | None = None, *, query_gpu: Callable[[], tg.GpuInfo] | None = None) -> DoctorReport:
    from .device import query_gpu as default_query

    report = DoctorReport()
    add = report.checks.append
    add(Check("Python", INFO, f"{platform.python_version()} on {platform.machine()} ({sys.platform})", needed=False))

    gpu = None
    holder: dict[str, object] = {}

    def gpu_check() -> Check:
        check, holder["gpu"] = check_gpu(query_gpu or default_query)
        return check

    add(_guard("GPU", True, gpu_check))
    gpu = holder.get("gpu")
    add(_guard("build target", True, lambda: check_target(gpu)))

    def trt_check() -> Check:
        check, holder["trt"] = check_tensorrt()
        return check

    add(_guard("TensorRT", True, trt_check))
    trt = holder.get("trt")

    # One working plugin route is needed: the library, or the Python route when asked for.
    want_python = plugin == "python"
    library = _guard("plugin library", not want_python, lambda: check_plugin_library(plugin, trt))
    qdp = _guard("Python plugin (QDP)", want_python, lambda: check_qdp(trt, want_python))
    if want_python:
        library.needed = False  # asked for the Python route: the library is a nice-to-have
    elif library.status != OK and qdp.status == OK:
        library.needed = False  # the Python route covers it; say so rather than fail
        library.fix += " (or deploy with --plugin python, which works here)"
    add(library)
    add(qdp)
    add(_guard("torch CUDA", False, check_torch_cuda))
    add(_guard("kernel self-test", True, check_kernels))
    add(_guard("CUDA toolkit (nvcc)", False, check_nvcc))
    add(_guard("TensorRT headers", False, check_tensorrt_headers))
    for name, where in ENGINE_CHECKS.items():
        add(_guard(name, False, functools.partial(_engine_check, where)))
    return report
