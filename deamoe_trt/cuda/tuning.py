"""Per-GPU kernel variant tables: which kernel variant (deamoeKernels.h, forwardVariant) runs a
layer shape, dtype, weight format and token count fastest on a given GPU.

One JSON file per GPU model in deamoe_trt/cuda/tuned/ (as vLLM keeps its fused-MoE configs
per device), named after torch.cuda.get_device_name() with every run of characters other
than letters and digits made one underscore (`NVIDIA_H200.json`). `deamoe-trt check-gpu
--tune` times every variant on the GPU it runs on and writes that GPU's file; the Python
bindings read it at run time (`select`), and a GPU without a file, or a case its file does
not list, gets variant 0, the default kernels.

A file:

    {"device": "NVIDIA H200",
     "measured": {"date": ..., "commit": ..., "command": ..., ...},
     "entries": [{"shape": "d7168-e8x32-s1536-p512-x2048-k8", "preset": "deepseek-v3-layer",
                  "dtype": "bf16", "bits": 4, "tokens": 1, "variant": "staged-down",
                  "median_us": {"default": 127.3, "staged-down": 101.2}}, ...]}

Tokens are the kernels' tile capacity (1, 2, 4, 8, 16: the tile's token count rounded up to a
power of two); a count the file does not list takes the nearest one it lists for that case.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .._io import atomic_write_text
from ..config import DeaMoEConfig
from ..errors import UsageError

TABLE_DIR = Path(__file__).resolve().parent / "tuned"
DEFAULT_VARIANT = "default"
TILE_TOKENS = (1, 2, 4, 8, 16)  # the kernels' token tiles (deamoe_max_tile_tokens: 16)


def device_file_name(device_name: str) -> str:
    """'NVIDIA H200' -> 'NVIDIA_H200.json'."""
    stem = re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_")
    if not stem:
        raise UsageError(f"no table name can be made from the device name {device_name!r}")
    return stem + ".json"


def shape_key(config: DeaMoEConfig) -> str:
    """The sizes the kernels' speed depends on: d, departments x experts each, f_s, f_p, f_sh, k."""
    c = config
    return (
        f"d{c.hidden_size}-e{c.num_departments}x{c.experts_per_department}-s{c.shared_intermediate_size}"
        f"-p{c.private_intermediate_size}-x{c.shared_expert_intermediate_size}-k{c.top_k}"
    )


def tile_tokens(num_tokens: int) -> int:
    """The token tile the kernels run num_tokens in (the last tile of a batch above 16 aside)."""
    n = max(1, min(int(num_tokens), TILE_TOKENS[-1]))
    return next(t for t in TILE_TOKENS if t >= n)


Key = tuple[str, str, int]  # (shape, dtype, bits)


@dataclass(frozen=True)
class VariantTable:
    """One GPU's table: for each (shape, dtype, bits), the variant per measured token tile."""

    device: str
    by_case: dict[Key, dict[int, str]] = field(default_factory=dict)
    measured: dict = field(default_factory=dict)

    def variant(self, config: DeaMoEConfig, dtype: str, bits: int, num_tokens: int) -> str:
        """The variant for this case: the listed one at num_tokens' tile, else at the nearest
        listed tile (ties to the smaller), else the default."""
        tiles = self.by_case.get((shape_key(config), dtype, int(bits)))
        if not tiles:
            return DEFAULT_VARIANT
        tile = tile_tokens(num_tokens)
        nearest = min(tiles, key=lambda t: (abs(math.log2(t) - math.log2(tile)), t))
        return tiles[nearest]


def parse_table(data: object, source: str) -> VariantTable:
    """A table from its JSON; UsageError naming `source` and the problem when malformed."""

    def bad(what: str) -> UsageError:
        return UsageError(f"kernel variant table {source}: {what}")

    if not isinstance(data, dict) or not isinstance(data.get("device"), str):
        raise bad('expected an object with a "device" name')
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise bad('expected an "entries" list')
    by_case: dict[Key, dict[int, str]] = {}
    for i, entry in enumerate(entries):
        try:
            shape, dtype, bits = str(entry["shape"]), str(entry["dtype"]), int(entry["bits"])
            tokens, variant = int(entry["tokens"]), str(entry["variant"])
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"entry {i} needs shape, dtype, bits, tokens and variant ({exc})") from None
        if tokens not in TILE_TOKENS:
            raise bad(f"entry {i}: tokens must be one of {TILE_TOKENS}, got {tokens}")
        by_case.setdefault((shape, dtype, bits), {})[tokens] = variant
    measured = data.get("measured")
    return VariantTable(data["device"], by_case, measured if isinstance(measured, dict) else {})


@functools.lru_cache(maxsize=16)
def load_table(device_name: str, directory: str | None = None) -> VariantTable | None:
    """The table of the GPU called device_name in `directory` (default: the package's), or None."""
    path = Path(directory or TABLE_DIR) / device_file_name(device_name)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"kernel variant table {path}: not readable JSON ({exc})") from None
    return parse_table(data, str(path))


def select(
    device_name: str | None, config: DeaMoEConfig, dtype: str, bits: int, num_tokens: int, directory: str | None = None
) -> str:
    """The variant name for this case on the GPU called device_name (None, or no table: the default)."""
    table = load_table(device_name, directory) if device_name else None
    return table.variant(config, dtype, bits, num_tokens) if table else DEFAULT_VARIANT


# What each variant changes (native/cuda/KERNELS.md, "Variants"): a name is its parts joined by
# "+", staged-deep being staged-down+deep-loads. deep-loads changes float gate/up rows only and
# bit-dequant quantized rows only, so a variant with a part that does not apply to a weight
# format runs the same kernels there as the variant without it.
_PARTS = {"staged-deep": ("staged-down", "deep-loads")}
_FLOAT_ONLY = frozenset({"deep-loads"})
_QUANTIZED_ONLY = frozenset({"bit-dequant"})


def variant_parts(name: str) -> frozenset[str]:
    """'staged-deep+bit-dequant' -> {'staged-down', 'deep-loads', 'bit-dequant'}; 'default' -> {}."""
    parts: set[str] = set()
    for part in name.split("+"):
        if part != DEFAULT_VARIANT:
            parts.update(_PARTS.get(part, (part,)))
    return frozenset(parts)


def distinct_variants(names: Iterable[str], bits: int) -> list[str]:
    """The variants of `names` that run kernels of their own on weights of `bits` (0: float):
    those none of whose parts is inert for that format, in the given order (the tuner times these)."""
    inert = _QUANTIZED_ONLY if bits == 0 else _FLOAT_ONLY
    return [name for name in names if not variant_parts(name) & inert]


def fastest(median_us: dict[str, float], margin: float = 0.02) -> str:
    """The variant with the lowest median, but the default unless that one is faster than it by
    more than `margin` (a fraction): a difference within the timing noise changes nothing."""
    best = min(median_us, key=lambda name: (median_us[name], name != DEFAULT_VARIANT))
    default = median_us.get(DEFAULT_VARIANT)
    if default is not None and median_us[best] > default * (1.0 - margin):
        return DEFAULT_VARIANT
    return best


def table_json(device_name: str, entries: Iterable[dict], measured: dict) -> str:
    """The JSON text of a table (entries: dicts with shape, preset, dtype, bits, tokens, variant,
    median_us), checked by parse_table before it is returned."""
    data = {"device": device_name, "measured": measured, "entries": list(entries)}
    parse_table(data, device_name)
    return json.dumps(data, indent=1) + "\n"


def write_table(path: str | Path, device_name: str, entries: Iterable[dict], measured: dict) -> Path:
    """Writes a table to path (a temporary name, renamed)."""
    atomic_write_text(path, table_json(device_name, entries, measured))
    load_table.cache_clear()
    return Path(path)
