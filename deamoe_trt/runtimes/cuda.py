"""The DeaMoE CUDA kernels (deamoe_trt.cuda) as a runtime, on a GPU or, for checks of the flow
on any machine, on the CPU through the SIMT-emulated library (`CudaRuntime.emulated`; the
runtime "cuda-emulated": slow, for checks).

Language models decode on runtimes.cuda_decoder.CudaBatchDecoder: the whole model on one
device, the DeaMoE FFNs on the kernels, one CUDA graph per step (its docstring says which
parts run on PyTorch ops); `decoder` is its one-sequence case.

Besides the runtime interface it is the one Python call layer over the kernels (the QDP
plugin, doctor and the device checks call it): a layer's forward (any kernel variant), its
routing and router logits, the routing kernel on given logits, the workspace a forward
needs, programmatic launch, timing of each call (CUDA events on the GPU, the wall clock
under the emulator) and CUDA-graph capture. On a GPU each call checks that its tensors
share one CUDA device and runs on that device's current stream (no synchronisation).

    from deamoe_trt import runtimes
    cuda = runtimes.get("cuda")
    y = cuda.forward(layer, x)          # the whole layer, like layer(x)
    r = cuda.route(layer, x)            # a deamoe_trt.routing.Routing
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from pathlib import Path

import torch

from ..config import DeaMoEConfig
from ..errors import UsageError
from ..layer import DeaMoELayer
from ..routing import Routing
from .base import Capabilities, DecoderPool, OneSequence, Prepared, RuntimeBase


class CudaRuntime(RuntimeBase):
    name = "cuda"
    label = "deamoe-trt CUDA kernels"

    capabilities = Capabilities(decoding=True, batched=True, needs=frozenset({"gpu"}))

    def __init__(self, *, library: str | None = None, emulated: bool = False):
        if emulated:
            self.name, self.label = "cuda-emulated", "deamoe-trt CUDA kernels (SIMT emulator, CPU)"
            self.capabilities = Capabilities(decoding=True, batched=True, needs=frozenset({"compiler"}), emulated=True)
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

    def load_library(self) -> ctypes.CDLL:
        """Loads (or builds) the kernel library now, rather than in the first timed call."""
        return self.lib

    def _stream(self) -> int | None:
        return None if self.is_emulated else torch.cuda.current_stream().cuda_stream

    @contextlib.contextmanager
    def _on(self, *tensors: torch.Tensor | None):
        """Around one call: on a GPU, the tensors checked to share one CUDA device, which is
        made current; yields the stream to launch on (None under the emulator)."""
        if self.is_emulated:
            yield None
            return
        self.require()
        devices = {t.device for t in tensors if t is not None}
        for device in devices:
            if device.type != "cuda":
                raise UsageError(f"the CUDA kernels work on CUDA tensors; got a tensor on {device}")
        if len(devices) > 1:
            raise UsageError(f"all tensors must be on one GPU; got {', '.join(sorted(map(str, devices)))}")
        device = devices.pop() if devices else torch.device("cuda", torch.cuda.current_device())
        if device.index is None or device.index == torch.cuda.current_device():
            yield torch.cuda.current_stream(device).cuda_stream
            return
        with torch.cuda.device(device):
            yield torch.cuda.current_stream(device).cuda_stream

    # -- the kernels --------------------------------------------------------------------

    def forward(self, layer: DeaMoELayer, x: torch.Tensor, *, variant: int | str | None = None) -> torch.Tensor:
        """The layer's output for x [..., d] through the kernels (same shape and dtype).

        Computed in the layer's dtype with float32 accumulation; x of another dtype is cast
        to it first and the result cast back. A quantized layer (layer.quant) runs from its
        packed int4/int8 codes and scales, dequantized in registers. variant: a kernel
        variant's name or id (native/cuda/KERNELS.md, "Variants"); None runs the one this
        GPU's table (deamoe_trt.cuda.tuning) lists for the case, else the default.
        """
        from ..cuda import forward_with

        with self._on(x, layer.router.weight) as stream:
            return forward_with(self.lib, layer, x, stream, variant=variant)

    def route(self, layer: DeaMoELayer, x: torch.Tensor) -> Routing:
        """The kernels' routing decisions for x [..., d]: expert_ids, weights, department_ids
        and kept_departments from the routing kernel; scores softmax/sigmoid (PyTorch) of the
        kernels' router logits."""
        from ..cuda import route_with

        with self._on(x, layer.router.weight) as stream:
            return route_with(self.lib, layer, x, stream)

    def router_logits(self, layer: DeaMoELayer, x: torch.Tensor) -> torch.Tensor:
        """[T, N] float32 router logits z = x Wr^T (+ the layer's router.logit_bias) as the kernels compute them."""
        from ..cuda import router_logits_with

        with self._on(x, layer.router.weight) as stream:
            return router_logits_with(self.lib, layer, x, stream)

    def route_logits(
        self, config: DeaMoEConfig, logits: torch.Tensor, router_bias: torch.Tensor | None = None
    ) -> Routing:
        """The routing kernel (spec steps 1-5) on given logits [T, N]: the device twin of
        deamoe_trt.routing.route_logits."""
        from ..cuda._ops import route_logits_with

        with self._on(logits, router_bias) as stream:
            return route_logits_with(self.lib, config, logits, router_bias, stream)

    def workspace_size(self, config: DeaMoEConfig, max_tokens: int, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes of scratch memory one forward over up to max_tokens tokens needs."""
        from ..cuda._ops import workspace_bytes

        return workspace_bytes(self.lib, config, max_tokens, dtype)

    def set_programmatic_launch(self, enabled: bool) -> bool:
        """Launch the forward kernels as programmatic dependents (sm_90+; ignored before): hides
        the gaps between the forward's kernels, results identical either way. Process-wide, on
        by default (off when DEAMOE_PROGRAMMATIC_LAUNCH=0 at load). Returns the previous setting."""
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
        self.load_library()

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
