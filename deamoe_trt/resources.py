"""What this process has used of the machine (its peak resident memory) and what the machine has."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far.

    Linux: VmHWM of /proc/self/status, the high-water mark of this process image. Not
    getrusage's ru_maxrss, which survives exec: a process started by a big parent reports
    the parent's peak (measured: 1.9 GB for an import whose own peak was 0.5 GB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def physical_memory_bytes() -> int:
    """This machine's memory (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def check_fits(nbytes: int | float, what: str) -> None:
    """A one-line UsageError, before anything is allocated, when `what` needs more bytes than
    this machine has: a count from a flag or a config that would only grow until the system
    kills the process."""
    from .errors import UsageError

    total = physical_memory_bytes()
    if total and nbytes > total:
        raise UsageError(
            f"{what} needs about {nbytes / 2**30:,.1f} GiB, more than this machine's {total / 2**30:,.1f} GiB"
        )
