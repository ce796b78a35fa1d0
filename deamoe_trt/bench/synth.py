"""A Hugging Face model directory with a real model's layout and random weights.

`python -m deamoe_trt.bench.synth --config olmoe-1b-7b -o DIR [--layers N]` writes what a
download of that model holds, without its weights: config.json, safetensors shards of at
most --shard-gb with the checkpoint's own tensor names, shapes and dtypes (gpt-oss: MXFP4
expert blocks and scales), model.safetensors.index.json and a word-level tokenizer.json
over the model's vocabulary. The config is a shipped one (deamoe_trt/bench/configs: the
public config.json of each model) or any config.json; --layers keeps the first N blocks.

Weights are Gaussian, per tensor scaled so that activations stay finite over any depth:
projections into a block at 1/sqrt(fan_in), projections back into the residual stream at
1/sqrt(fan_in * 2 * layers) (each block adds a small share of the stream's energy), norms
at 1, biases and sinks at 0.02. Each tensor is drawn from its own seeded generator and
written in row chunks, so memory stays at a chunk whatever the model's size, and the same
seed writes the same bytes.

Everything is checked before anything is written: the architecture is known, the disk has
room for every byte; the directory appears whole (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from ..console import format_bytes
from ..errors import UsageError, one_line
from ..importers.mxfp4 import BLOCK, E2M1, SCALE_BIAS
from ..safetensors_io import INDEX_FILE, StreamingWriter

CONFIGS = "configs"
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default max_shard_size, "5GB"
CHUNK_ELEMENTS = 1 << 24  # rows are drawn and written about 64 MB of float32 at a time
DTYPE_NAMES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
# Root mean square of a uniformly random E2M1 code's value (the sign does not matter).
_E2M1_RMS = math.sqrt(sum(v * v for v in E2M1) / len(E2M1))


@dataclass(frozen=True)
class Spec:
    """One tensor to write: name, shape, dtype and how it is drawn."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "normal", "ones", "small", "mxfp4_blocks", "mxfp4_scales"
    std: float = 0.0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


def shipped_configs() -> list[str]:
    folder = resources.files(__package__).joinpath(CONFIGS)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def read_config(config: str) -> dict[str, Any]:
    """A shipped config by name (e.g. olmoe-1b-7b) or a config.json path, without comments."""
    path = Path(config)
    if not path.is_file():
        if config not in shipped_configs():
            raise UsageError(f"no config {config}: give a config.json or one of {', '.join(shipped_configs())}")
        text = resources.files(__package__).joinpath(CONFIGS).joinpath(f"{config}.json").read_text()
    else:
        text = path.read_text()
    try:
        hf = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{config} is not valid JSON: {exc}") from None
    if not isinstance(hf, dict):
        raise UsageError(f"{config} is not a JSON object")
    return {k: v for k, v in hf.items() if not k.startswith("_")}


def with_layers(hf: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """The config with its first `layers` blocks (per-layer lists cut to match)."""
    if layers is None:
        return dict(hf)
    total = int(hf["num_hidden_layers"])
    if not 1 <= layers <= total:
        raise UsageError(f"--layers {layers} must be in [1, {total}] (the model's blocks)")
    out = dict(hf, num_hidden_layers=layers)
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:layers]
    if isinstance(out.get("mlp_only_layers"), list):
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if i < layers]
    return out


def _dtype(hf: dict[str, Any]) -> torch.dtype:
    name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if name not in DTYPE_NAMES:
        raise UsageError(f"config dtype {name!r}: write one of {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[name]


def _need(hf: dict[str, Any], key: str) -> Any:
    if hf.get(key) is None:
        raise UsageError(f"the config lacks {key}, which a {hf.get('model_type')} model needs")
    return hf[key]


def tensor_specs(hf: dict[str, Any]) -> list[Spec]:
    """Every tensor of the checkpoint, in the order a download's shards hold them."""
    t = hf.get("model_type")
    if t not in _BLOCKS:
        raise UsageError(f"unknown architecture {t!r}; synthetic checkpoints of: {', '.join(sorted(_BLOCKS))}")
    dtype, d, vocab = _dtype(hf), int(_need(hf, "hidden_size")), int(_need(hf, "vocab_size"))
    layers = int(_need(hf, "num_hidden_layers"))
    out_std = 1.0 / math.sqrt(2 * layers)
    specs = [Spec("model.embed_tokens.weight", (vocab, d), dtype, "normal", 1.0)]
    for i in range(layers):
        specs += _BLOCKS[t](hf, i, f"model.layers.{i}.", d, dtype, out_std)
    specs.append(Spec("model.norm.weight", (d,), dtype, "ones"))
    if not hf.get("tie_word_embeddings", False):
        specs.append(Spec("lm_head.weight", (vocab, d), dtype, "normal", 1.0 / math.sqrt(d)))
    return specs


def _linear(name: str, out: int, inp: int, dtype: torch.dtype, scale: float = 1.0) -> Spec:
    return Spec(name, (out, inp), dtype, "normal", scale / math.sqrt(inp))


def _norms(p: str, d: int, dtype: torch.dtype) -> list[Spec]:
    return [
        Spec(p + "input_layernorm.weight", (d,), dtype, "ones"),
        Spec(p + "post_attention_layernorm.weight", (d,), dtype, "ones"),
    ]


def _attention(hf: dict[str, Any], p: str, d: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    """q/k/v/o projections with the family's biases and q/k norms."""
    t = hf["model_type"]
    heads = int(_need(hf, "num_attention_heads"))
    kv = int(hf.get("num_key_value_heads") or heads)
    hd = int(hf.get("head_dim") or d // heads)
    a = p + "self_attn."
    specs = [
        _linear(a + "q_proj.weight", heads * hd, d, dtype),
        _linear(a + "k_proj.weight", kv * hd, d, dtype),
        _linear(a + "v_proj.weight", kv * hd, d, dtype),
        _linear(a + "o_proj.weight", d, heads * hd, dtype, out_std),
    ]
    qkv_bias = bool(hf.get("qkv_bias", True)) if t == "qwen2_moe" else bool(hf.get("attention_bias", False))
    if qkv_bias:
        specs += [
            Spec(a + f"{x}_proj.bias", (n * hd,), dtype, "small") for x, n in (("q", heads), ("k", kv), ("v", kv))
        ]
    if t != "qwen2_moe" and hf.get("attention_bias", False):
        specs.append(Spec(a + "o_proj.bias", (d,), dtype, "small"))
    if t == "qwen3_moe":
        specs += [Spec(a + "q_norm.weight", (hd,), dtype, "ones"), Spec(a + "k_norm.weight", (hd,), dtype, "ones")]
    if t == "olmoe":
        specs += [
            Spec(a + "q_norm.weight", (heads * hd,), dtype, "ones"),
            Spec(a + "k_norm.weight", (kv * hd,), dtype, "ones"),
        ]
    if t == "gpt_oss":
        specs.append(Spec(a + "sinks", (heads,), dtype, "small"))
    return specs


def _mlp(prefix: str, d: int, width: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    return [
        _linear(prefix + "gate_proj.weight", width, d, dtype),
        _linear(prefix + "up_proj.weight", width, d, dtype),
        _linear(prefix + "down_proj.weight", d, width, dtype, out_std),
    ]


def _experts(prefix: str, n: int, d: int, width: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    return [s for e in range(n) for s in _mlp(f"{prefix}experts.{e}.", d, width, dtype, out_std)]


def _qwen_block(hf: dict[str, Any], i: int, p: str, d: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    specs = _attention(hf, p, d, dtype, out_std)
    n = int(hf.get("num_experts") or 0)
    step = int(hf.get("decoder_sparse_step") or 1)
    if i in (hf.get("mlp_only_layers") or []) or n <= 0 or (i + 1) % step:
        specs += _mlp(p + "mlp.", d, int(_need(hf, "intermediate_size")), dtype, out_std)
    else:
        m = p + "mlp."
        specs.append(_linear(m + "gate.weight", n, d, dtype))
        specs += _experts(m, n, d, int(_need(hf, "moe_intermediate_size")), dtype, out_std)
        shared = int(hf.get("shared_expert_intermediate_size") or 0) if hf["model_type"] == "qwen2_moe" else 0
        if shared:
            specs += _mlp(m + "shared_expert.", d, shared, dtype, out_std)
            specs.append(_linear(m + "shared_expert_gate.weight", 1, d, dtype))
    return specs + _norms(p, d, dtype)


def _olmoe_block(hf: dict[str, Any], i: int, p: str, d: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    n = int(_need(hf, "num_experts"))
    specs = [*_attention(hf, p, d, dtype, out_std), _linear(p + "mlp.gate.weight", n, d, dtype)]
    specs += _experts(p + "mlp.", n, d, int(_need(hf, "intermediate_size")), dtype, out_std)
    return specs + _norms(p, d, dtype)


def _deepseek_v2_block(hf: dict[str, Any], i: int, p: str, d: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    heads = int(_need(hf, "num_attention_heads"))
    nope, rope, v = (int(_need(hf, k)) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    kv_rank, q_rank = int(_need(hf, "kv_lora_rank")), hf.get("q_lora_rank")
    a = p + "self_attn."
    if q_rank:
        specs = [
            _linear(a + "q_a_proj.weight", int(q_rank), d, dtype),
            Spec(a + "q_a_layernorm.weight", (int(q_rank),), dtype, "ones"),
            _linear(a + "q_b_proj.weight", heads * (nope + rope), int(q_rank), dtype),
        ]
    else:
        specs = [_linear(a + "q_proj.weight", heads * (nope + rope), d, dtype)]
    specs += [
        _linear(a + "kv_a_proj_with_mqa.weight", kv_rank + rope, d, dtype),
        Spec(a + "kv_a_layernorm.weight", (kv_rank,), dtype, "ones"),
        _linear(a + "kv_b_proj.weight", heads * (nope + v), kv_rank, dtype),
        _linear(a + "o_proj.weight", d, heads * v, dtype, out_std),
    ]
    dense = i < int(hf.get("first_k_dense_replace") or 0) or i % int(hf.get("moe_layer_freq") or 1)
    if dense:
        specs += _mlp(p + "mlp.", d, int(_need(hf, "intermediate_size")), dtype, out_std)
    else:
        n, width = int(_need(hf, "n_routed_experts")), int(_need(hf, "moe_intermediate_size"))
        specs.append(_linear(p + "mlp.gate.weight", n, d, dtype))
        specs += _experts(p + "mlp.", n, d, width, dtype, out_std)
        shared = int(hf.get("n_shared_experts") or 0)
        if shared:
            specs += _mlp(p + "mlp.shared_experts.", d, width * shared, dtype, out_std)
    return specs + _norms(p, d, dtype)


def _gpt_oss_block(hf: dict[str, Any], i: int, p: str, d: int, dtype: torch.dtype, out_std: float) -> list[Spec]:
    n, f = int(_need(hf, "num_local_experts")), int(_need(hf, "intermediate_size"))
    m = p + "mlp."
    specs = _attention(hf, p, d, dtype, out_std)
    specs += [_linear(m + "router.weight", n, d, dtype), Spec(m + "router.bias", (n,), dtype, "small")]
    mxfp4 = (hf.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    for proj, rows, cols, scale in (("gate_up_proj", 2 * f, d, 1.0), ("down_proj", d, f, out_std)):
        name = f"{m}experts.{proj}"
        std = scale / math.sqrt(cols)
        if mxfp4:
            if cols % BLOCK:
                raise UsageError(f"{name}: MXFP4 needs a multiple of {BLOCK} columns, the config implies {cols}")
            specs += [
                Spec(name + "_blocks", (n, rows, cols // BLOCK, BLOCK // 2), torch.uint8, "mxfp4_blocks"),
                Spec(name + "_scales", (n, rows, cols // BLOCK), torch.uint8, "mxfp4_scales", std),
            ]
        else:  # transformers' own layout: x @ W, [E, in, out]
            specs.append(Spec(name, (n, cols, rows), dtype, "normal", std))
        specs.append(Spec(f"{name}_bias", (n, rows), dtype, "small"))
    return specs + _norms(p, d, dtype)


_BLOCKS = {
    "olmoe": _olmoe_block,
    "qwen2_moe": _qwen_block,
    "qwen3_moe": _qwen_block,
    "deepseek_v2": _deepseek_v2_block,
    "gpt_oss": _gpt_oss_block,
}


def shards(specs: list[Spec], max_bytes: int) -> list[list[Spec]]:
    """Tensors in order, a new shard whenever the next would pass max_bytes (as save_pretrained does)."""
    out: list[list[Spec]] = [[]]
    size = 0
    for spec in specs:
        if out[-1] and size + spec.nbytes > max_bytes:
            out.append([])
            size = 0
        out[-1].append(spec)
        size += spec.nbytes
    return out


def _chunks(spec: Spec, seed: int) -> Iterator[torch.Tensor]:
    """The tensor's values, a few rows at a time, from a generator of its own."""
    if spec.kind == "ones":
        yield torch.ones(spec.shape, dtype=spec.dtype)
        return
    gen = torch.Generator().manual_seed((zlib.crc32(spec.name.encode()) + 1_000_003 * seed) % 2**63)
    rows, row = spec.shape[0], math.prod(spec.shape[1:])
    step = max(1, CHUNK_ELEMENTS // max(row, 1))
    for start in range(0, rows, step):
        shape = (min(step, rows - start), *spec.shape[1:])
        if spec.kind == "mxfp4_blocks":  # two uniformly random E2M1 codes a byte
            yield torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
        elif spec.kind == "mxfp4_scales":  # 2^s * (codes' RMS) ~ std
            exponent = round(math.log2(spec.std / _E2M1_RMS))
            yield torch.full(shape, SCALE_BIAS + exponent, dtype=torch.uint8)
        else:
            std = 0.02 if spec.kind == "small" else spec.std
            yield (torch.randn(shape, generator=gen) * std).to(spec.dtype)


def tokenizer_json(vocab: int) -> dict[str, Any]:
    """A word-level tokenizer over the whole vocabulary: specials, then words w3, w4, ..."""
    words = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    words.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<unk>"},
    }


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that path (or its nearest existing parent) is on."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def synthesize(
    hf: dict[str, Any],
    output: str | Path,
    *,
    seed: int = 0,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
) -> dict[str, Any]:
    """Write the model directory; returns {"tensors", "bytes", "shards", "seconds"}."""
    output = Path(output)
    specs = tensor_specs(hf)
    groups = shards(specs, shard_bytes)
    total = sum(s.nbytes for s in specs)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(f"-o {output} exists and is not an empty directory")
    tokenizer = json.dumps(tokenizer_json(int(hf["vocab_size"])))
    need = total + len(tokenizer) + 2**20  # configs and index
    free = free_bytes(output.parent.resolve())
    if need > free:
        raise UsageError(
            f"{output.parent}: the checkpoint needs {need:,} bytes ({format_bytes(need)}), {free:,} are free"
        )
    staging = output.with_name(f".{output.name}.partial-{os.getpid()}")
    start = time.perf_counter()
    weight_map: dict[str, str] = {}
    try:
        staging.mkdir(parents=True)
        written = 0
        for k, group in enumerate(groups):
            file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
            schema = {s.name: (s.shape, s.dtype) for s in group}
            with (staging / file).open("wb") as f:
                writer = StreamingWriter(f, schema, metadata={"format": "pt"})
                for spec in group:
                    writer.begin(spec.name)
                    for piece in _chunks(spec, seed):
                        writer.append(piece)
                    weight_map[spec.name] = file
                    written += spec.nbytes
                    if progress:
                        print(f"\r  {file}  {format_bytes(written)} / {format_bytes(total)}", end="", file=sys.stderr)
                writer.close()
        if progress:
            print(file=sys.stderr)
        if len(groups) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        (staging / "tokenizer.json").write_text(tokenizer)
        (staging / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "</s>"}) + "\n"
        )
        (staging / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        if output.exists():
            output.rmdir()  # empty, checked above
        os.replace(staging, output)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {one_line(exc)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"tensors": len(specs), "bytes": total, "shards": len(groups), "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deamoe_trt.bench.synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help=f"a config.json or one of: {', '.join(shipped_configs())}")
    parser.add_argument("-o", "--output", required=True, help="model directory to write (must not exist)")
    parser.add_argument("--layers", type=int, metavar="N", help="keep the first N blocks (default: all)")
    parser.add_argument(
        "--shard-gb", type=float, default=DEFAULT_SHARD_BYTES / 1e9, help="max shard size, GB (default 5)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        hf = with_layers(read_config(args.config), args.layers)
        summary = synthesize(hf, args.output, seed=args.seed, shard_bytes=int(args.shard_gb * 1e9), progress=True)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        f"wrote {args.output}: {summary['tensors']} tensors, {format_bytes(summary['bytes'])} "
        f"in {summary['shards']} shard(s), {summary['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
