"""Peak memory of the streaming whole-model import on a synthetic sharded checkpoint.

`python -m deamoe_trt.bench.import_rss --gb 4.5 --dir /tmp/x` writes a random Qwen3-MoE
checkpoint in bf16 (qwen3-30b-a3b's layer shapes: d=2048, 128 experts of width 768, 32 q /
4 kv heads of 128), sharded like a Hugging Face download (about 1 GB per shard plus
model.safetensors.index.json), with as many layers as reach --gb; then runs
`deamoe-trt import-hf` on it in a fresh process and reports that process's peak RSS next
to the checkpoint's size. Writing the checkpoint holds one layer in memory at a time.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..console import format_bytes, format_table

D, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, WIDTH, VOCAB = 2048, 32, 4, 128, 128, 768, 32000


def _config(layers: int) -> dict:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": VOCAB,
        "hidden_size": D,
        "intermediate_size": 6144,
        "moe_intermediate_size": WIDTH,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def _layer(i: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    p = f"model.layers.{i}."
    t = {
        p + "input_layernorm.weight": torch.ones(D, dtype=torch.bfloat16),
        p + "post_attention_layernorm.weight": torch.ones(D, dtype=torch.bfloat16),
        p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, D),
        p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, D),
        p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, D),
        p + "self_attn.o_proj.weight": rand(D, HEADS * HEAD_DIM),
        p + "self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
        p + "self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
        p + "mlp.gate.weight": rand(EXPERTS, D),
    }
    for e in range(EXPERTS):
        t[p + f"mlp.experts.{e}.gate_proj.weight"] = rand(WIDTH, D)
        t[p + f"mlp.experts.{e}.up_proj.weight"] = rand(WIDTH, D)
        t[p + f"mlp.experts.{e}.down_proj.weight"] = rand(D, WIDTH)
    return t


def make_checkpoint(directory: Path, gb: float) -> int:
    """Write the synthetic checkpoint; returns its size in bytes."""
    attention = (2 * HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM) * D + 2 * D + 2 * HEAD_DIM
    layer_bytes = 2 * (attention + EXPERTS * D + EXPERTS * 3 * WIDTH * D)  # bf16
    layers = max(1, round(gb * 1e9 / layer_bytes))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(_config(layers), indent=2))
    gen = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    names = [f"model-{k + 1:05d}-of-{layers + 1:05d}.safetensors" for k in range(layers + 1)]
    total = 0
    for k, name in enumerate(names):  # one shard per layer, the first with the embeddings, the last with the head
        if k == 0:
            tensors = {"model.embed_tokens.weight": (torch.randn(VOCAB, D, generator=gen) * 0.02).to(torch.bfloat16)}
        else:
            tensors = _layer(k - 1, gen)
        if k == len(names) - 1:
            tensors["model.norm.weight"] = torch.ones(D, dtype=torch.bfloat16)
            tensors["lm_head.weight"] = (torch.randn(VOCAB, D, generator=gen) * 0.02).to(torch.bfloat16)
        save_file(tensors, str(directory / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += (directory / name).stat().st_size
        print(f"\r  wrote shard {k + 1}/{len(names)} ({format_bytes(total)})", end="", flush=True)
        del tensors
    print()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=4.5, help="checkpoint size to make (default 4.5 GB)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="deamoe-import-rss-"))
    try:
        print(f"making a synthetic sharded Qwen3-MoE checkpoint of {args.gb} GB in {root}/hf")
        size = make_checkpoint(root / "hf", args.gb)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "deamoe_trt", "import-hf", str(root / "hf"), "-o", str(root / "lm")],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        print(proc.stdout.replace("\r", "\n").strip())
        if proc.returncode:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        found = re.search(r"peak RSS ([\d.]+ \w+)\s*$", proc.stdout.strip())
        peak = found.group(1) if found else "?"
        written = (root / "lm" / "model.safetensors").stat().st_size
        print(
            format_table(
                ("checkpoint", "shards", "written", "import s", "peak RSS of the import"),
                [
                    (
                        format_bytes(size),
                        len(list((root / "hf").glob("*.safetensors"))),
                        format_bytes(written),
                        f"{seconds:.1f}",
                        peak,
                    )
                ],
                title="Streaming whole-model import (deamoe-trt import-hf)",
            )
        )
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
