"""A quantized checkpoint in compressed-tensors' pack-quantized format, as llm-compressor writes
W4A16/W8A16, so vLLM serves it with its own quantized MoE and linear methods.

deamoe-trt's format (deamoe_trt.quant) and compressed-tensors' symmetric group-wise int format
mean the same weights: groups of `group_size` input columns with one scale per (row, group),
w = scale * (q - 2^(bits-1)), with compressed-tensors storing the unsigned code q (its signed
value plus the same offset) packed 32 / bits to an int32, the first column in the lowest bits.
Our bytes hold the same codes in the same order (int4: the even column in the low nibble), so
re-packing is a change of word size only: four bytes to one int32, little-endian. No weight
is re-quantized; the served weights are the checkpoint's bit for bit after dequantization
(tests/integrations/vllm/test_compressed.py checks this with compressed-tensors' own decompressor).

Names follow llm-compressor's per-module layout:
- each FFN group (department shared part j, expert private part e) as three projections,
  `layers.{i}.mlp.{departments|experts}.{g}.{gate_proj|up_proj|down_proj}.weight_packed`
  [rows, cols * bits / 32] int32, `.weight_scale` [rows, cols / group_size] in the checkpoint's
  dtype and `.weight_shape` [2] int64 ([rows, cols]): what vLLM's FusedMoE loads per expert;
- each quantized attention projection and a quantized head as `<prefix>.weight_packed/_scale/
  _shape` (vLLM's own linear layers load them);
- shared experts and dense MLPs keep deamoe-trt's names (`.qweight`, `.scales`): the vLLM
  model runs them with deamoe-trt's own modules, outside vLLM's quantized layers.

config.json's quantization_config targets every Linear (llm-compressor's default) and lists
the projections left in floating point under "ignore".
"""

from __future__ import annotations

import re

import torch

from ...errors import UsageError
from ...lm.config import LMConfig
from ...quant import QuantConfig

FORMAT = "pack-quantized"
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")
_GROUPED = re.compile(r"^(layers\.\d+\.mlp\.(?:departments|experts))\.(gate_up|down)\.(qweight|scales)$")
_LINEAR = re.compile(r"^(layers\.\d+\.self_attn\.\w+|lm_head)\.weight\.(qweight|scales)$")
_SERVED_GROUP = re.compile(r"^(layers\.\d+\.mlp\.(?:departments|experts))\.(\d+)\.(\w+_proj)\.(\w+)$")


def scheme(quant: QuantConfig) -> dict:
    """The config group's "weights" entry: compressed-tensors' QuantizationArgs as a dict."""
    return {
        "num_bits": quant.bits,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": quant.group_size,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
        "block_structure": None,
        "observer_kwargs": {},
    }


def float_linears(config: LMConfig) -> list[str]:
    """vLLM's Linear modules left in floating point: attention and head unless quantized_linears
    names them (dense MLPs are deamoe-trt's modules, which the config does not reach)."""
    parts = config.quantized_linears
    if config.is_mla:
        queries = ("q_a_proj", "q_b_proj") if config.q_lora_rank else ("q_proj",)
        projections = (*queries, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    else:
        projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    names = []
    for i in range(config.num_layers):
        if "attention" not in parts:
            names += [f"layers.{i}.self_attn.{p}" for p in projections]
    if "head" not in parts:
        names.append("lm_head")
    return names


def quantization_config(config: LMConfig) -> dict:
    """config.json's "quantization_config" for a quantized config (llm-compressor's keys)."""
    quant = config.quantization
    assert quant is not None
    return {
        "quant_method": "compressed-tensors",
        "format": FORMAT,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": scheme(quant),
                "input_activations": None,
                "output_activations": None,
                "format": FORMAT,
            }
        },
        "ignore": float_linears(config),
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def pack_int32(qweight: torch.Tensor) -> torch.Tensor:
    """deamoe-trt's code bytes [..., m] (uint8) -> compressed-tensors' int32 words [..., m / 4]:
    byte k of each four in bits 8k..8k+7 (the codes' column order, whatever the host's byte order)."""
    if qweight.shape[-1] % 4:
        raise UsageError(f"a quantized row of {qweight.shape[-1]} bytes does not fill whole 32-bit words")
    b = qweight.to(torch.int32).reshape(*qweight.shape[:-1], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def unpack_int32(packed: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' int32 words [..., n] -> deamoe-trt's code bytes [..., 4n] (uint8)."""
    parts = [((packed >> (8 * k)) & 0xFF).to(torch.uint8) for k in range(4)]
    return torch.stack(parts, dim=-1).flatten(-2)


def _module(prefix: str, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    rows, cols = qweight.shape[0], qweight.shape[1] * 8 // bits
    return {
        f"{prefix}.weight_packed": pack_int32(qweight).contiguous(),
        f"{prefix}.weight_scale": scales.contiguous(),
        f"{prefix}.weight_shape": torch.tensor([rows, cols], dtype=torch.int64),
    }


def compressed_state(state: dict[str, torch.Tensor], config: LMConfig) -> dict[str, torch.Tensor]:
    """A quantized checkpoint's stored tensors (deamoe_trt.lm.checkpoint.stored_state) under
    compressed-tensors' names and packing; see the module docstring. Float tensors unchanged."""
    quant = config.quantization
    assert quant is not None
    bits = quant.bits
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        grouped, linear = _GROUPED.match(name), _LINEAR.match(name)
        if grouped:
            prefix, kind, what = grouped.groups()
            if what == "scales":
                continue
            scales = state[f"{prefix}.{kind}.scales"]
            for g in range(tensor.shape[0]):
                if kind == "down":
                    out.update(_module(f"{prefix}.{g}.down_proj", tensor[g], scales[g], bits))
                    continue
                width = tensor.shape[1] // 2
                for half, proj in ((slice(0, width), "gate_proj"), (slice(width, None), "up_proj")):
                    out.update(_module(f"{prefix}.{g}.{proj}", tensor[g, half], scales[g, half], bits))
        elif linear:
            prefix, what = linear.groups()
            if what == "qweight":
                out.update(_module(prefix, tensor, state[f"{prefix}.weight.scales"], bits))
        else:
            out[name] = tensor
    return out


def is_served_group(name: str) -> bool:
    """Whether name is one FFN group's projection tensor in compressed-tensors' layout."""
    return _SERVED_GROUP.match(name) is not None


def checkpoint_state(tensors: dict[str, torch.Tensor], config: LMConfig) -> dict[str, torch.Tensor]:
    """compressed_state's inverse: a directory's tensors under deamoe-trt's checkpoint names
    (what deamoe_trt.checkpoint.check_tensors checks against the config). Unknown names pass
    through, so the check names them."""
    groups: dict[tuple[str, str], dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        served = _SERVED_GROUP.match(name)
        if served:
            prefix, g, proj, suffix = served.groups()
            groups.setdefault((prefix, proj), {}).setdefault(int(g), {})[suffix] = tensor
        elif name.endswith(".weight_packed") and _LINEAR.match(f"{name[: -len('_packed')]}.qweight"):
            prefix = name[: -len(".weight_packed")]
            out[f"{prefix}.weight.qweight"] = unpack_int32(tensor)
        elif name.endswith(".weight_scale") and _LINEAR.match(f"{name[: -len('_scale')]}.scales"):
            out[f"{name[: -len('.weight_scale')]}.weight.scales"] = tensor
        elif not (name.endswith(".weight_shape") and _LINEAR.match(f"{name[: -len('_shape')]}.qweight")):
            out[name] = tensor

    def stacked(prefix: str, proj: str, suffix: str) -> torch.Tensor:
        parts = groups.get((prefix, proj), {})
        if sorted(parts) != list(range(len(parts))) or any(suffix not in p for p in parts.values()):
            raise UsageError(f"model.safetensors: {prefix}.*.{proj}.{suffix} is missing for some group")
        return torch.stack([parts[g][suffix] for g in range(len(parts))])

    for prefix in sorted({p for p, _ in groups}):
        gate, up = (stacked(prefix, p, "weight_packed") for p in ("gate_proj", "up_proj"))
        out[f"{prefix}.gate_up.qweight"] = unpack_int32(torch.cat((gate, up), dim=1))
        gate_s, up_s = (stacked(prefix, p, "weight_scale") for p in ("gate_proj", "up_proj"))
        out[f"{prefix}.gate_up.scales"] = torch.cat((gate_s, up_s), dim=1)
        out[f"{prefix}.down.qweight"] = unpack_int32(stacked(prefix, "down_proj", "weight_packed"))
        out[f"{prefix}.down.scales"] = stacked(prefix, "down_proj", "weight_scale")
    return out
