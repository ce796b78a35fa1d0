"""The CPU kernel library's process-wide side: its thread pools, its allocator's buffers, the
int4 decoding mode, the ISA it was built for, and a read-bandwidth probe on its threads."""

from __future__ import annotations

import ctypes
import os

from ..errors import DeaMoEError, UsageError
from ._build import load


# Workers spin this long (microseconds) after a job before they sleep: short, so an idle pool
# leaves the cores to others. A layer call wakes them first thing (Pool.wake) and they then
# spin up to _WAKE_SPIN_US for its job, which bridges the routing computed in between.
def _env_us(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        raise UsageError(f"{name} must be a whole number of microseconds, got {os.environ[name]!r}") from None


_SPIN_US = _env_us("DEAMOE_TRT_CPU_SPIN_US", 50)
_WAKE_SPIN_US = _env_us("DEAMOE_TRT_CPU_WAKE_SPIN_US", 2000)


def default_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Pool:
    """The kernel's thread pool (the calling thread plus threads-1 workers)."""

    def __init__(self, threads: int, *, spin_us: int = _SPIN_US, wake_spin_us: int = _WAKE_SPIN_US):
        self.lib = load()
        self.threads = threads
        self.handle = self.lib.dm_pool_create(threads, spin_us, wake_spin_us)
        if not self.handle:
            raise DeaMoEError(f"could not start a CPU thread pool of {threads} threads")

    def wake(self) -> None:
        self.lib.dm_pool_wake(self.handle)

    def busy_wait(self, seconds: float) -> None:
        """Keep every thread of this pool busy for `seconds` (see dm_busy_wait)."""
        self.lib.dm_busy_wait(self.handle, int(seconds * 1e6))

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self.lib.dm_pool_destroy(handle)


_pools: dict[int, Pool] = {}


def pool(threads: int | None = None) -> Pool:
    """The process's pool of `threads` threads (default: all cores), created once."""
    threads = threads or default_threads()
    if threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    if threads not in _pools:
        _pools[threads] = Pool(threads)
    return _pools[threads]


INT4_MODES = ("convert", "subnormal")


def int4_mode(mode: str | None = None) -> str:
    """How the kernel turns int4 codes into floats (deamoe_cpu.cpp, Int4Mode): "subnormal"
    (AMD's default: the masked bits read as a subnormal float, one instruction fewer) or
    "convert" (an int->float conversion; the default elsewhere). Both are exact. Sets the
    process-wide mode when given; returns the mode in force."""
    if mode is not None and mode not in INT4_MODES:
        raise UsageError(f"int4 mode must be one of {', '.join(INT4_MODES)}, got {mode!r}")
    return INT4_MODES[load().dm_int4_mode(-1 if mode is None else INT4_MODES.index(mode))]


def amx_mode(on: bool | None = None) -> bool:
    """Whether the quantized loops take AMX tiles at several tokens (deamoe_cpu.cpp, "AMX"):
    on by default where the CPU, the build and the OS allow it. Sets the process-wide switch
    when given (on is refused quietly where AMX is unavailable); returns the mode in force."""
    return bool(load().dm_amx_mode(-1 if on is None else int(on)))


def amx_available() -> bool:
    """Whether this CPU, the kernel's build and the OS allow the AMX path."""
    return bool(load().dm_amx_available())


def simd() -> str:
    """The vector ISA the kernel was built for: 'avx512' or 'avx2'."""
    return load().dm_simd().decode()


class _Buffer:
    """Memory from the kernel's allocator (2 MiB aligned, transparent huge pages)."""

    def __init__(self, nbytes: int):
        self.lib = load()
        self.nbytes = nbytes
        self.ptr = self.lib.dm_alloc(max(nbytes, 1))
        if not self.ptr:
            raise DeaMoEError(f"out of memory: could not allocate {nbytes / 1e9:.2f} GB for the CPU path's weights")

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            self.lib.dm_free(ptr, max(self.nbytes, 1))


def stream_read(nbytes: int, passes: int, threads: int | None = None) -> list[float]:
    """Read bandwidth in bytes/s of `passes` reads of an nbytes buffer with the kernel's
    threads, each streaming one contiguous share (the access pattern of a MoE step)."""
    import time

    p = pool(threads)
    floats = max(nbytes // 4 // (64 * p.threads), 1) * 64 * p.threads
    buf = _Buffer(floats * 4)
    # Write every page first: untouched pages all map the one zero page, which reads from cache.
    ctypes.memset(buf.ptr, 1, floats * 4)
    p.lib.dm_stream_read(p.handle, buf.ptr, floats)  # warm-up: page tables, worker wake-up
    rates = []
    for _ in range(passes):
        p.wake()
        start = time.perf_counter()
        p.lib.dm_stream_read(p.handle, buf.ptr, floats)
        rates.append(floats * 4 / (time.perf_counter() - start))
    return rates
