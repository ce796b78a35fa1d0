"""The shipped tiny language model with int8 and int4 FFN weights next to fp32: perplexity on
the held-out text and time per output token on ONNX Runtime.

Each block's DeaMoE FFN is quantized (deamoe_trt.quant, round to nearest, group size 32:
the widest that divides f_p = 32); attention, norms, embeddings and routers stay fp32.
Perplexity is per byte, exp(cross-entropy), on the held-out last 10% of *Persuasion* (the
windows `deamoe-trt train-tiny` validates on). TPOT: greedy decoding on ONNX Runtime CPU,
`ort` form (com.microsoft.MoE for fp32, com.microsoft.QMoE for int8/int4), one thread,
interleaved: each round decodes with every precision in turn.

    python samples/python/quantized_lm.py [--model DIR] [--new-tokens N] [--rounds R]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys

import _common


def quantized_model(model, quant):
    """A copy of model whose blocks' DeaMoE FFNs are quantized (quant None: the model itself)."""
    if quant is None:
        return model
    out = copy.deepcopy(model)
    for block in out.layers:
        block.mlp = block.mlp.quantized(quant)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(_common.DEFAULT_MODEL), help="tiny LM checkpoint directory")
    parser.add_argument("--prompt", default=_common.DEFAULT_PROMPT)
    parser.add_argument("--new-tokens", type=int, default=120, help="tokens to decode per run (default 120)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved decoding rounds (default 5)")
    parser.add_argument("--group-size", type=int, default=32, help="columns per scale (default 32)")
    args = parser.parse_args()
    return _common.main_guard("quantized_lm.py", lambda: run(args))


def run(args) -> int:
    import torch

    from deamoe_trt.lm.checkpoint import load_lm
    from deamoe_trt.lm.generate import generate, warm_up
    from deamoe_trt.lm.ort import OrtDecoder
    from deamoe_trt.lm.train import TrainSettings, evaluate, shipped_text, split_text
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.report import format_table

    torch.set_num_threads(1)
    loaded = load_lm(args.model)
    tokenizer = loaded.tokenizer
    settings = TrainSettings()
    _, held_out = split_text(shipped_text(), tokenizer, settings.val_fraction)
    prompt_ids = tokenizer.encode(args.prompt)
    variants = {
        "fp32": None,
        f"int8, group {args.group_size}": QuantConfig(8, args.group_size),
        f"int4, group {args.group_size}": QuantConfig(4, args.group_size),
    }
    models = {name: quantized_model(loaded.model, quant) for name, quant in variants.items()}
    loss = {name: evaluate(model, held_out, settings) for name, model in models.items()}
    ffn_bytes = {
        name: sum(t.numel() * t.element_size() for b in model.layers for t in b.mlp.state_dict().values())
        for name, model in models.items()
    }
    decoders = {name: OrtDecoder.from_model(model, threads=1, tokenizer=tokenizer) for name, model in models.items()}
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
