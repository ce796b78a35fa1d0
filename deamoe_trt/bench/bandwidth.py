"""The machine's memory read bandwidth, measured by the benchmark itself: the roof."""

from __future__ import annotations

import statistics
import time

import numpy as np


def kernel_bandwidth(nbytes: int, passes: int, threads: int) -> dict:
    """Read bandwidth with the CPU kernel's threads, each streaming one contiguous share of a
    buffer much larger than the caches: the access pattern of a MoE step, without the math."""
    from ..cpu import simd, stream_read

    rates = stream_read(nbytes, passes, threads)
    return {
        "method": f"C++ streaming read ({simd()}), {threads} thread(s), one contiguous share each",
        "buffer_bytes": nbytes,
        "threads": threads,
        "passes_bytes_per_s": rates,
        "bytes_per_s": statistics.median(rates),
    }


def device_copy_bandwidth(nbytes: int, passes: int) -> dict:
    """Bytes/s of a device-to-device copy of nbytes on the current CUDA device, counting the
    read and the write (2 * nbytes per copy), between CUDA events: the roof of a GPU decode
    step, which streams its weights through the same memory."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")  # written: real pages
    dst = torch.empty_like(src)
    dst.copy_(src)  # the first copy pays for nothing the others do not
    rates = []
    for _ in range(passes):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        rates.append(2 * nbytes / (start.elapsed_time(end) / 1e3))
    del src, dst
    return {
        "method": "device-to-device copy (torch), read + write",
        "buffer_bytes": nbytes,
        "passes_bytes_per_s": rates,
        "bytes_per_s": statistics.median(rates),
    }


def numpy_bandwidth(nbytes: int, passes: int) -> dict:
    """numpy's sum over a float32 buffer: one thread, for reference."""
    buf = np.ones(max(nbytes // 4, 1), dtype=np.float32)
    buf.sum()
    rates = []
    for _ in range(passes):
        start = time.perf_counter()
        buf.sum()
        rates.append(buf.nbytes / (time.perf_counter() - start))
    return {
        "method": "numpy float32 sum, 1 thread",
        "buffer_bytes": int(buf.nbytes),
        "threads": 1,
        "passes_bytes_per_s": rates,
        "bytes_per_s": statistics.median(rates),
    }


class RoofProbe:
    """The roof, measured as the contenders run: each call streams `nbytes` with the CPU
    kernel's threads (as a layer call does: wake the workers, then read) and returns bytes/s.

    The timing loops call it once per step among the contenders, so it sees the machine as
    they do: on a shared host the read bandwidth a process gets drifts by tens of percent
    over minutes, and a roof measured once, apart, would not match the steps it judges.
    Successive calls read successive slices of a buffer eight times larger, never in cache."""

    SLICES = 8

    def __init__(self, nbytes: int, threads: int):
        import ctypes

        from ..cpu.runtime import _Buffer, pool

        self.pool = pool(threads)
        granule = 64 * 4 * self.pool.threads
        self.nbytes = max(nbytes // granule, 1) * granule
        self.buffer = _Buffer(self.nbytes * self.SLICES)
        ctypes.memset(self.buffer.ptr, 1, self.buffer.nbytes)  # real pages, not the shared zero page
        self.method = (
            f"C++ streaming read of {self.nbytes / 2**20:.0f} MiB with {self.pool.threads} thread(s), "
            "one contiguous share each, interleaved with the contenders"
        )

    def __call__(self, step: int) -> float:
        lib, handle = self.pool.lib, self.pool.handle
        address = self.buffer.ptr + (step % self.SLICES) * self.nbytes
        start = time.perf_counter()
        self.pool.wake()
        lib.dm_stream_read(handle, address, self.nbytes // 4)
        return self.nbytes / (time.perf_counter() - start)
