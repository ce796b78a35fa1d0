"""Everything is in pyproject.toml except this: a wheel carries the CUDA kernel sources.

deamoe_trt.cuda builds libdeamoe_kernels.so on first use from native/cuda/; an installed
(non-editable) package has no repository around it, so build_py copies the kernel sources
into deamoe_trt/cuda/_src/ (laid out like native/cuda/). Editable installs read native/cuda/
in place."""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCES = runpy.run_path(str(ROOT / "deamoe_trt" / "cuda" / "_sources.py"))


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        kernels = ROOT / "native" / "cuda"
        files = SOURCES["kernel_sources"](kernels)
        if not files:  # an sdist without native/cuda/ would otherwise make a wheel that cannot build
            raise RuntimeError(f"no CUDA kernel sources under {kernels}")
        target = Path(self.build_lib) / "deamoe_trt" / "cuda" / SOURCES["PACKAGED_DIR"]
        for file in files:
            destination = target / file.relative_to(kernels)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, destination)


setup(cmdclass={"build_py": BuildPyWithKernels})
