"""What the benchmark records about the machine it ran on, and how much memory it may use."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def available_memory() -> int:
    """Bytes the kernel says a new allocation can get without swapping: MemAvailable from
    /proc/meminfo, else free pages from sysconf (no psutil needed)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def total_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def versions() -> dict[str, str]:
    import numpy
    import torch

    from .. import __version__

    out = {
        "deamoe_trt": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
    }
    try:
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        out["onnxruntime"] = "not installed"
    try:
        import onnx

        out["onnx"] = onnx.__version__
    except ImportError:
        out["onnx"] = "not installed"
    return out


def machine_info(threads: int) -> dict:
    return {
        "cpu_model": cpu_model(),
        "cores": cores(),
        "threads": threads,
        "platform": platform.platform(),
        "memory_total_bytes": total_memory(),
        "memory_available_bytes": available_memory(),
        "load_average": load_average(),
        "versions": versions(),
    }
