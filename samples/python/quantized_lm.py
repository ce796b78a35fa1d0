"""The shipped tiny language model with int8 and int4 FFN weights next to fp32: perplexity on
the held-out text and time per output token on ONNX Runtime.

Each block's DeaMoE FFN is quantized (deamoe_trt.quantize.lm.quantize_lm, round to nearest,
group size 32: the widest that divides f_p = 32); attention, norms, embeddings and routers
stay fp32. Each quantized model is saved as a checkpoint (what `deamoe-trt quantize` writes)
and loaded back, and the loaded model is the one measured.
Perplexity is per byte, exp(cross-entropy), on the held-out last 10% of *Persuasion* (the
windows `deamoe-trt train-tiny` validates on). TPOT: greedy decoding on ONNX Runtime CPU,
`ort` form (com.microsoft.MoE for fp32, com.microsoft.QMoE for int8/int4), one thread,
interleaved: each round decodes with every precision in turn.

    python samples/python/quantized_lm.py [--model DIR] [--new-tokens N] [--rounds R] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import _common


def saved_and_reloaded(loaded, quant, out: Path):
    """loaded's model with its DeaMoE FFNs quantized, written as a checkpoint under out and
    read back (quant None: the model itself)."""
    from deamoe_trt.lm.checkpoint import load_lm, save_lm
    from deamoe_trt.quantize.lm import quantize_lm

    if quant is None:
        return loaded.model
    path = save_lm(quantize_lm(loaded.model, quant), out / f"tiny-lm-int{quant.bits}", tokenizer=loaded.tokenizer)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    print(f"saved int{quant.bits} checkpoint to {path} ({size / 1e6:.2f} MB) and loaded it back")
    return load_lm(path).model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(_common.DEFAULT_MODEL), help="tiny LM checkpoint directory")
    parser.add_argument("--prompt", default=_common.DEFAULT_PROMPT)
    parser.add_argument("--new-tokens", type=int, default=120, help="tokens to decode per run (default 120)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved decoding rounds (default 5)")
    parser.add_argument("--group-size", type=int, default=32, help="columns per scale (default 32)")
    parser.add_argument("--out", default=None, help="keep the quantized checkpoints here (default: a temporary folder)")
    args = parser.parse_args()
    return _common.main_guard("quantized_lm.py", lambda: run(args))


def run(args) -> int:
    if args.out is not None:
        return measure(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="quantized-lm-") as out:
        return measure(args, Path(out))


def measure(args, out: Path) -> int:
    import torch

    from deamoe_trt import runtimes
    from deamoe_trt.console import format_table
    from deamoe_trt.lm.checkpoint import load_lm
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.quantize.lm import held_out_loss
    from deamoe_trt.runtimes.decode import generate, warm_up

    torch.set_num_threads(1)
    loaded = load_lm(args.model)
    tokenizer = loaded.tokenizer
    prompt_ids = tokenizer.encode(args.prompt)
    variants = {
        "fp32": None,
        f"int8, group {args.group_size}": QuantConfig(8, args.group_size),
        f"int4, group {args.group_size}": QuantConfig(4, args.group_size),
    }
    models = {name: saved_and_reloaded(loaded, quant, out) for name, quant in variants.items()}
    loss = {name: held_out_loss(model, tokenizer) for name, model in models.items()}
    ffn_bytes = {
        name: sum(t.numel() * t.element_size() for b in model.layers for t in b.mlp.state_dict().values())
        for name, model in models.items()
    }
    ort = runtimes.get("ort")
    decoders = {name: ort.decoder(model, threads=1, tokenizer=tokenizer) for name, model in models.items()}
    reference = generate(decoders["fp32"], prompt_ids, args.new_tokens).new_ids
    steps: dict[str, list[float]] = {name: [] for name in decoders}
    texts = {}
    for decoder in decoders.values():
        warm_up(decoder, prompt_ids)
    for _ in range(args.rounds):
        for name, decoder in decoders.items():
            result = generate(decoder, prompt_ids, args.new_tokens, model=name)
            steps[name] += result.step_s
            texts[name] = result.new_ids
    rows = []
    fp32_tpot = statistics.median(steps["fp32"])
    for name in variants:
        tpot = statistics.median(steps[name])
        same = sum(a == b for a, b in zip(texts[name], reference, strict=False))
        rows.append(
            (
                name,
                f"{ffn_bytes[name] / 1e6:.2f} MB",
                f"{loss[name]:.4f}",
                f"{math.exp(loss[name]):.3f}",
                f"{tpot * 1e3:.3f}",
                f"{fp32_tpot / tpot:.2f}x",
                f"{same}/{len(reference)}",
            )
        )
    print(
        format_table(
            ("FFN weights", "FFN size", "held-out loss", "perplexity", "TPOT ms", "vs fp32", "greedy = fp32"),
            rows,
            title=(
                f"tiny-lm, ONNX Runtime CPU (ort form), 1 thread, {args.rounds} interleaved rounds of "
                f"{args.new_tokens} greedy tokens (TPOT: median step)"
            ),
        )
    )
    for name in variants:
        print(f"--- {name}: {args.prompt}{tokenizer.decode(texts[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
