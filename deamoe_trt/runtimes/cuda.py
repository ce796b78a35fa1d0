"""The DeaMoE CUDA kernels (deamoe_trt.cuda) as a runtime, on a GPU or, for checks of the flow
on any machine, on the CPU through the SIMT-emulated library (`CudaRuntime.emulated`; the
runtime "cuda-emulated": slow, for checks).

Language models decode on runtimes.cuda_decoder.CudaBatchDecoder: the whole model on one
device, the DeaMoE FFNs on the kernels, one CUDA graph per step (its docstring says which
parts run on PyTorch ops); `decoder` is its one-sequence case.

Besides the runtime interface it offers what a device check needs of the kernels: their
routing and router logits, programmatic launch, timing of each call (CUDA events on the
GPU, the wall clock under the emulator) and CUDA-graph capture.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import torch

from .base import DecoderPool, OneSequence, Prepared, RuntimeBase


class CudaRuntime(RuntimeBase):
    name = "cuda"
    label = "deamoe-trt CUDA kernels"

    def __init__(self, *, library: str | None = None, emulated: bool = False):
        if emulated:
            self.name, self.label = "cuda-emulated", "deamoe-trt CUDA kernels (SIMT emulator, CPU)"
        self.library = library  # a built library; None: deamoe_trt.cuda.load_library's search/build
        self.is_emulated = emulated
        self.device = torch.device("cpu" if emulated else "cuda")
        self._lib: ctypes.CDLL | None = None
        self.build_seconds = 0.0
        self.library_path = ""

    @classmethod
    def emulated(cls, library: str | None = None) -> CudaRuntime:
        """The kernels compiled for the CPU under the SIMT emulator (deamoe_trt.checks.emulated;
        needs a C++20 compiler and the CUDA headers), on CPU tensors: a check of a flow, not of the GPU."""
        return cls(library=library, emulated=True)

    def available(self) -> str | None:
        if self.is_emulated:
            return None
        if not torch.cuda.is_available():
            return "needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
        return None

    @property
    def lib(self) -> ctypes.CDLL:
        """The kernel library, loaded (and built when needed) at first use."""
        if self._lib is None:
            self.require()
            started = time.perf_counter()
            if self.is_emulated:
                from ..checks.emulated import cached_emulated_library
                from ..cuda import bind

                path = Path(self.library) if self.library else cached_emulated_library()
                self._lib = bind(ctypes.CDLL(str(path)))
                self.library_path = str(path)
            else:
                from ..cuda import load_library

                self._lib = load_library(self.library)
                self.library_path = self._lib._name
            self.build_seconds = time.perf_counter() - started
        return self._lib

    def load(self) -> ctypes.CDLL:
        """Loads (or builds) the library now, rather than in the first timed call."""
        return self.lib

    def _stream(self) -> int | None:
        return None if self.is_emulated else torch.cuda.current_stream().cuda_stream

    # -- the kernels --------------------------------------------------------------------

    def forward(self, layer, x: torch.Tensor) -> torch.Tensor:
        from ..cuda import forward_with

        return forward_with(self.lib, layer, x, self._stream())

    def route(self, layer, x: torch.Tensor):
        from ..cuda import route_with

        return route_with(self.lib, layer, x, self._stream())

    def router_logits(self, layer, x: torch.Tensor) -> torch.Tensor:
        from ..cuda import router_logits_with

        return router_logits_with(self.lib, layer, x, self._stream())

    def set_programmatic_launch(self, enabled: bool) -> bool:
        """Launch the forward kernels as programmatic dependents; returns the previous setting."""
        previous = bool(self.lib.deamoe_programmatic_launch())
        self.lib.deamoe_set_programmatic_launch(int(bool(enabled)))
        return previous

    # -- timing ---------------------------------------------------------------------------

    def sync(self) -> None:
        if not self.is_emulated:
            torch.cuda.synchronize()

    def time_each(self, run, count: int, before=None) -> list[float]:
        """Microseconds of run(i) for i < count (before(i) first, untimed): between two CUDA
        events on the GPU, by the wall clock under the emulator."""
        if self.is_emulated:
            times = []
            for i in range(count):
                if before is not None:
                    before(i)
                started = time.perf_counter()
                run(i)
                times.append(1e6 * (time.perf_counter() - started))
            return times
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        for i in range(count):
            if before is not None:
                before(i)
            starts[i].record()
            run(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [1e3 * s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    def graph(self, fn, static_input):
        """A replayable CUDA-graph capture of fn(static_input); None under the emulator."""
        if self.is_emulated:
            return None
        fn(static_input)  # warm: library loaded, allocator primed
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(static_input)
        return graph

    # -- the runtime interface --------------------------------------------------------------

    def prepare(self, module, *, dtype=None, device=None, threads=None, **options) -> Prepared:
        from ..layer import DeaMoEStack

        self.require()
        module = self.cast(module, dtype)
        target = torch.device(device) if device is not None else self.device
        module = module.to(target)
        layers = module.layers if isinstance(module, DeaMoEStack) else None
        self.load()

        def run(x, module=module):
            with torch.inference_mode():
                if layers is None:
                    return self.forward(module, x)
                for layer in layers:
                    x = x + self.forward(layer, x)
                return x

        return Prepared(
            self.name,
            run,
            to_input=lambda x: x.to(target),
            to_torch=lambda y: y.cpu(),
            info={"library": self.library_path, "device": str(target)},
        )

    def batch_decoder(self, model, *, max_sequences: int, threads=None, twin="deamoe", **options):
        """The whole model on this runtime's device for up to max_sequences sequences a step
        (runtimes.cuda_decoder.CudaBatchDecoder; options: max_context, graphs)."""
        from .cuda_decoder import CudaBatchDecoder

        self.require()
        return CudaBatchDecoder(self, model, max_sequences=max_sequences, twin=twin, **options)

    def decoder(self, model, *, threads=None, twin="deamoe", **options) -> OneSequence:
        return OneSequence(self.batch_decoder(model, max_sequences=1, twin=twin, **options))

    def decoder_pool(self, model, *, threads=None, size=1, twin="deamoe", **options) -> DecoderPool:
        """size one-sequence decoders, each with its own copy of the model on the device."""
        return DecoderPool(lambda: self.decoder(model, twin=twin, **options))


RUNTIME = CudaRuntime()
