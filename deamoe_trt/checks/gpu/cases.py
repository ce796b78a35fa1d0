"""The layers check-gpu runs: the presets, a gpt-oss-shaped layer, what each is checked and
timed at, and how they are made (drawn on the GPU when big; shrunken for --dry-run)."""

from __future__ import annotations

import torch

from ...config import DeaMoEConfig
from ...dtypes import BY_TORCH
from ...layer import DeaMoELayer
from ...presets import PRESETS
from ...quant import GROUP_SIZES, QuantConfig
from ...traffic import layer_bytes

# gpt-oss-20b's FFN in department form (d = 2880, 32 experts, top-4, every expert's width
# 2880 split into shared and private halves; FFN biases, the clamped SwiGLU, a router logit
# bias), with a shared expert gpt-oss does not have, so that every bias kind runs.
GPT_OSS_LAYER = DeaMoEConfig(
    hidden_size=2880,
    num_departments=4,
    experts_per_department=8,
    shared_intermediate_size=1440,
    private_intermediate_size=1440,
    top_k=4,
    top_departments=2,
    shared_expert_intermediate_size=512,
    ffn_bias=True,
    activation="swiglu_clamped",
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    router_logit_bias=True,
)
# What check-gpu can run: the presets and the extra layers above.
CASES = {**PRESETS, "gpt-oss-20b-style": GPT_OSS_LAYER}

# Token counts of the correctness checks: 1, around the kernels' tile sizes and past them.
CHECK_TOKENS = {
    "tiny": [1, 3, 16, 17, 40],
    "qwen3-30b-a3b-layer": [1, 5, 16, 33],
    "deepseek-v3-layer": [1, 4, 16, 20],
    "gpt-oss-20b-style": [1, 4, 16, 17],
}

# (preset, dtypes checked, dtype benchmarked or None, FFN weight bits: 0 float, 4, 8).
# Order: the tiny preset first (fast, catches gross errors), then the deepseek targets
# (bf16, then int4 against its int4 twin), then qwen3, then the other int4/int8 rows
# (bits > 0: the preset quantized; tiny int4 is not runnable, its f_p = 16 codes are
# 8-byte rows). Each layer is freed before the next is made.
PLAN: tuple[tuple[str, tuple[torch.dtype, ...], torch.dtype | None, int], ...] = (
    ("tiny", (torch.float32, torch.float16, torch.bfloat16), None, 0),
    ("deepseek-v3-layer", (torch.bfloat16,), torch.bfloat16, 0),
    ("deepseek-v3-layer", (torch.bfloat16,), torch.bfloat16, 4),
    ("qwen3-30b-a3b-layer", (torch.float32, torch.bfloat16), torch.bfloat16, 0),
    ("tiny", (torch.float32, torch.bfloat16), None, 8),
    ("deepseek-v3-layer", (torch.bfloat16,), torch.bfloat16, 8),
    ("qwen3-30b-a3b-layer", (torch.bfloat16,), None, 4),
    # gpt-oss's biases, clamped SwiGLU and logit bias: correctness, float and int4.
    ("gpt-oss-20b-style", (torch.bfloat16, torch.float16), None, 0),
    ("gpt-oss-20b-style", (torch.bfloat16,), None, 4),
)


def shrink(config: DeaMoEConfig, multiple: int = 8) -> DeaMoEConfig:
    """The preset's routing shape at a size the emulator runs in seconds (--dry-run); widths
    are multiples of `multiple` (32 for the int4/int8 rows: whole int4 vectors and groups)."""
    scale = 64 / config.hidden_size

    def width(value: int) -> int:
        return max(multiple, int(value * scale) // multiple * multiple) if value else 0

    return config.replace(
        hidden_size=64,
        shared_intermediate_size=width(config.shared_intermediate_size),
        private_intermediate_size=width(config.private_intermediate_size),
        shared_expert_intermediate_size=width(config.shared_expert_intermediate_size),
    )


def case_config(preset: str, bits: int, dry_run: bool) -> DeaMoEConfig:
    """The preset's config as checked: itself on a GPU; shrunken for --dry-run (widths
    multiples of 32 for the int4/int8 rows), except tiny, which already is."""
    if not dry_run or preset == "tiny":
        return CASES[preset]
    return shrink(CASES[preset], 32 if bits else 8)


@torch.no_grad()
def random_layer(config: DeaMoEConfig, dtype: torch.dtype, device: torch.device, seed: int) -> DeaMoELayer:
    """DeaMoELayer.random's distribution; big layers are drawn in place on the GPU (the 6.3 GB
    deepseek preset would take minutes through random()'s CPU float32 path)."""
    if device.type == "cpu" or layer_bytes(config, torch.float32) < 2 * 2**30:
        return DeaMoELayer.random(config, seed=seed, dtype=dtype).to(device)
    return DeaMoELayer.random(config, seed=seed, dtype=dtype, device=device, low_memory=True)


def kind(layer: DeaMoELayer) -> str:
    """The layer's dtype and, when quantized, its weight format: "bf16", "bf16-int4"."""
    name = BY_TORCH[layer.dtype].name
    return f"{name}-int{layer.quant.bits}" if layer.quant is not None else name


def group_size_for(config: DeaMoEConfig) -> int:
    """The largest group size dividing every quantized width (tiny: 16, the big presets: 128)."""
    widths = [config.hidden_size, config.shared_intermediate_size, config.private_intermediate_size,
              config.shared_expert_intermediate_size]  # fmt: skip
    return max(g for g in GROUP_SIZES if all(w % g == 0 for w in widths))


@torch.no_grad()
def quantized_layer(config: DeaMoEConfig, dtype: torch.dtype, device: torch.device, seed: int, bits: int):
    """random_layer's layer with its FFN weights quantized (round to nearest, on the device);
    the float layer is freed before returning."""
    layer = random_layer(config, dtype, device, seed)
    quantized = layer.quantized(QuantConfig(bits, group_size_for(config)))
    del layer
    free()
    return quantized


def free(*objects) -> None:
    for obj in objects:
        del obj
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
