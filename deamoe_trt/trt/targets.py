"""Build targets: what `deamoe-trt build --target NAME` means on each supported device.

A TensorRT engine is compiled for one GPU architecture and one TensorRT version, so each
target is a device family plus the build settings that suit it: the compute capabilities
it accepts, the precision it prefers, how much scratch memory TensorRT's builder may use,
the builder optimisation level, and the token range of the optimisation profile.

Everything here is plain data and pure functions (no TensorRT, no GPU), so the rules are
unit-tested on any machine; `builder.py` applies them on the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuInfo:
    """The GPU a build runs on, as device.query_gpu() finds it (or a test fakes it)."""

    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes; on Jetson this is the memory CPU and GPU share
    driver_version: int | None = None  # CUDA driver API version, e.g. 12060 for 12.6
    integrated: bool = False  # Jetson: GPU and CPU share DRAM
    source: str = "test"

    @property
    def sm(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def cc(self) -> str:
        major, minor = self.compute_capability
        return f"{major}.{minor}"


@dataclass(frozen=True)
class TargetProfile:
    """Build settings for one device family."""

    name: str
    description: str
    compute_capabilities: tuple[tuple[int, int], ...]
    precision: str  # fp16 | bf16 | fp32: what the device should run the layer in
    workspace_bytes: int  # TensorRT memory pool limit (MemoryPoolType.WORKSPACE)
    optimization_level: int  # builder_optimization_level, 0..5 (TensorRT's default is 3)
    opt_tokens: int  # the profile's opt point: a decoding step's tokens
    default_max_tokens: int
    max_tokens_limit: int  # the largest --max-tokens this target accepts
    min_tensorrt: tuple[int, int] = (10, 3)
    notes: str = ""

    def accepts(self, gpu: GpuInfo) -> bool:
        return tuple(gpu.compute_capability) in self.compute_capabilities

    @property
    def cc_text(self) -> str:
        return " or ".join(f"{a}.{b}" for a, b in self.compute_capabilities)


# The profiles. Precision: Ampere edge parts default to fp16 (JetPack's usual deployment
# dtype), Hopper and Blackwell to bf16 (the dtype DeepSeek/Qwen checkpoints ship in).
# Workspace is scratch for the DeaMoE kernels (routing and per-expert activations: a few
# MB per hundred tokens) and for TensorRT's tactics; it is sized to leave the weights room
# on the smallest device of the family.
TARGETS: dict[str, TargetProfile] = {
    "a40": TargetProfile(
        name="a40",
        description="NVIDIA A40 (Ampere, 48 GB)",
        compute_capabilities=((8, 6),),
        precision="fp16",
        workspace_bytes=2 * GiB,
        optimization_level=3,
        opt_tokens=4,
        default_max_tokens=64,
        max_tokens_limit=4096,
    ),
    "orin": TargetProfile(
        name="orin",
        description="Jetson AGX Orin / Orin NX 16 GB (JetPack 6: TensorRT 10.3, CUDA 12.6)",
        compute_capabilities=((8, 7),),
        precision="fp16",
        workspace_bytes=1 * GiB,
        optimization_level=3,
        opt_tokens=1,
        default_max_tokens=64,
        max_tokens_limit=1024,
        notes="CPU and GPU share DRAM: the workspace comes out of the memory the weights need.",
    ),
    "orin-nano": TargetProfile(
        name="orin-nano",
        description="Jetson Orin Nano / Orin NX 8 GB (JetPack 6: TensorRT 10.3, CUDA 12.6)",
        compute_capabilities=((8, 7),),
        precision="fp16",
        workspace_bytes=256 * MiB,
        optimization_level=2,
        opt_tokens=1,
        default_max_tokens=16,
        max_tokens_limit=256,
        notes="4-8 GB shared by CPU, GPU and the builder: small workspace, lower optimisation level "
        "(shorter, leaner builds), fewer tokens.",
    ),
    "thor": TargetProfile(
        name="thor",
        description="Jetson Thor (Blackwell; sm_110 with CUDA 13, sm_101 with CUDA 12.8/12.9)",
        # CUDA 13 renumbered Thor from 10.1 to 11.0; accept what the installed stack reports.
        compute_capabilities=((11, 0), (10, 1)),
        precision="bf16",
        workspace_bytes=2 * GiB,
        optimization_level=3,
        opt_tokens=4,
        default_max_tokens=64,
        max_tokens_limit=4096,
        notes="Build with the TensorRT and CUDA 13 of JetPack 7; the plugin needs sm_110 kernels.",
    ),
    "h100": TargetProfile(
        name="h100",
        description="NVIDIA H100 (Hopper, 80/94 GB)",
        compute_capabilities=((9, 0),),
        precision="bf16",
        workspace_bytes=4 * GiB,
        optimization_level=3,
        opt_tokens=4,
        default_max_tokens=64,
        max_tokens_limit=8192,
    ),
    "h200": TargetProfile(
        name="h200",
        description="NVIDIA H200 (Hopper, 141 GB)",
        compute_capabilities=((9, 0),),
        precision="bf16",
        workspace_bytes=4 * GiB,
        optimization_level=3,
        opt_tokens=4,
        default_max_tokens=64,
        max_tokens_limit=8192,
    ),
}

TARGET_CHOICES = (*TARGETS, "auto")

# Two profiles share a compute capability in each pair; auto tells them apart by memory.
_ORIN_NANO_MAX_MEMORY = 12 * GiB  # Orin Nano 4/8 GB and Orin NX 8 GB report under this
_H200_MIN_MEMORY = 120 * GiB  # H100 80/94 GB below, H200 141 GB above


def get_target(name: str) -> TargetProfile:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; choose one of: {', '.join(TARGET_CHOICES)}") from None


def target_for_gpu(gpu: GpuInfo) -> TargetProfile:
    """The profile `--target auto` picks for this GPU."""
    cc = tuple(gpu.compute_capability)
    if cc == (8, 7):
        return TARGETS["orin-nano" if gpu.total_memory < _ORIN_NANO_MAX_MEMORY else "orin"]
    if cc == (9, 0):
        return TARGETS["h200" if gpu.total_memory >= _H200_MIN_MEMORY else "h100"]
    for profile in TARGETS.values():
        if profile.accepts(gpu):
            return profile
    known = ", ".join(f"{p.name} ({p.cc_text})" for p in TARGETS.values())
    raise UsageError(
        f"no build target for {gpu.name} (compute capability {gpu.cc}); known targets: {known}. "
        "Pick the closest one only if its compute capability matches"
    )


def resolve_target(name: str, gpu: GpuInfo) -> TargetProfile:
    """The profile to build with on gpu: `auto` picks one, a named one must match the GPU.

    TensorRT engines only run on the architecture they were built on, and the builder
    tunes for the GPU it runs on, so a build for another device is refused rather than
    producing an engine that fails (or is slow) where it lands.
    """
    if name == "auto":
        return target_for_gpu(gpu)
    profile = get_target(name)
    if not profile.accepts(gpu):
        hint = ""
        with contextlib.suppress(UsageError):  # no profile fits this GPU: no hint
            hint = f", or --target {target_for_gpu(gpu).name} / auto for this GPU"
        raise UsageError(
            f"target {profile.name} is {profile.description}, compute capability {profile.cc_text}, but this GPU "
            f"is {gpu.name} with {gpu.cc}: TensorRT engines are not portable between GPU architectures; "
            f"build on the {profile.name} itself{hint}"
        )
    return profile


def check_max_tokens(profile: TargetProfile, max_tokens: int | None) -> int:
    """--max-tokens, defaulted and checked against the target's limit."""
    if max_tokens is None:
        return profile.default_max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"--max-tokens must be an integer >= 1, got {max_tokens!r}")
    if max_tokens > profile.max_tokens_limit:
        raise UsageError(
            f"--max-tokens {max_tokens} is above the {profile.name} target's limit of {profile.max_tokens_limit} "
            "(the workspace and activations grow with it); use a smaller value"
        )
    return max_tokens


def token_range(profile: TargetProfile, max_tokens: int) -> tuple[int, int, int]:
    """(min, opt, max) tokens of the optimisation profile: 1, a decoding step, max_tokens."""
    return 1, min(profile.opt_tokens, max_tokens), max_tokens


def profile_shapes(
    inputs: Sequence[tuple[str, Sequence[int]]], tokens: tuple[int, int, int]
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """min/opt/max shapes for every network input with a dynamic dimension.

    inputs: (name, shape) with -1 for dynamic dimensions, as TensorRT reports them. The one
    dynamic dimension allowed is the token dimension (hidden_states' T, first); an input
    with another dynamic dimension cannot be given a decode-sized profile and is refused.
    """
    shapes = {}
    for name, shape in inputs:
        shape = tuple(int(d) for d in shape)
        dynamic = [i for i, d in enumerate(shape) if d < 0]
        if not dynamic:
            continue
        if dynamic != [0]:
            raise UsageError(
                f"input {name!r} has shape {list(shape)}: only its first (token) dimension may be dynamic; "
                "export the model with a fixed hidden size"
            )
        low, opt, high = tokens
        shapes[name] = ((low, *shape[1:]), (opt, *shape[1:]), (high, *shape[1:]))
    return shapes


def default_timing_cache(profile: TargetProfile, gpu: GpuInfo, trt_version: tuple[int, int]) -> Path:
    """Per target, architecture and TensorRT version: a timing cache is valid for no other."""
    from ..native import cache_dir

    base = cache_dir() / "timing"
    major, minor = trt_version
    return base / f"{profile.name}-{gpu.sm}-trt{major}.{minor}.cache"
