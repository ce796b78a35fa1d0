"""AWQ against round to nearest on the shipped tiny language model's trained DeaMoE layers.

Each block's DeaMoE FFN input (the post-attention RMSNorm's output) is captured on windows
of the training text (calibration) and of the held-out last 10% of *Persuasion* (held out,
never seen by the search). Each FFN is quantized with round to nearest, with AWQ
(deamoe_trt.awq) from the calibration inputs, and with AWQ's clipping search alone (no
channel scaling); the table gives, per bit width and group size, each block's relative
output error on the held-out inputs and the held-out perplexity of the whole model with
every block quantized so. Attention, norms, embeddings and routers stay fp32.

--write DIR also writes the three FFN layers as one deamoe-trt checkpoint with its
calibration and held-out inputs, for the CLI:

    deamoe-trt quantize DIR/ffn -o DIR/ffn-awq --bits 4 --group-size 16 --method awq \\
        --calibration DIR/calibration.safetensors --eval DIR/held-out.safetensors

    python samples/python/awq_lm.py [--model DIR] [--windows N] [--write DIR]
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

import _common


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(_common.DEFAULT_MODEL), help="tiny LM checkpoint directory")
    parser.add_argument("--windows", type=int, default=16, help="calibration windows of 128 bytes (default 16)")
    parser.add_argument("--write", metavar="DIR", help="also write the FFN checkpoint and its inputs here")
    args = parser.parse_args()
    return _common.main_guard("awq_lm.py", lambda: run(args))


def capture(model, windows) -> list:
    """Each block's DeaMoE FFN inputs [tokens, d] when the float model runs on windows [B, S]."""
    import torch

    captured = [[] for _ in model.layers]
    hooks = [
        block.post_attention_layernorm.register_forward_hook(
            lambda _m, _i, out, i=i: captured[i].append(out.detach().reshape(-1, out.shape[-1]))
        )
        for i, block in enumerate(model.layers)
    ]
    try:
        with torch.no_grad():
            for window in windows:
                model(window[None])
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(parts) for parts in captured]


def run(args) -> int:
    import torch

    from deamoe_trt.awq import ALPHAS, quantize_awq
    from deamoe_trt.lm.checkpoint import load_lm
    from deamoe_trt.lm.train import TrainSettings, evaluate, shipped_text, split_text
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.report import Progress, format_table
    from deamoe_trt.summary import layer_error

    torch.set_num_threads(1)  # many small matmuls: one thread is faster than two on a busy machine
    loaded = load_lm(args.model)
    model = loaded.model
    settings = TrainSettings()
    train_ids, held_out_ids = split_text(shipped_text(), loaded.tokenizer, settings.val_fraction)
    seq = settings.seq_len

    def evenly(ids, count):  # `count` windows spread evenly over ids, deterministic
        step = (len(ids) - seq) // count
        return [ids[i * step : i * step + seq] for i in range(count)]

    calibration = capture(model, evenly(train_ids, args.windows))
    held_out = capture(model, evenly(held_out_ids, 16))
    fp32_loss = evaluate(model, held_out_ids, settings)
    variants = [QuantConfig(bits, gs) for bits in (4, 8) for gs in (16, 32)]
    bar = Progress(3 * len(variants), "awq_lm")
    rows = []
    for quant in variants:
        for method in ("rtn", "awq", "awq, clip only"):
            quantized = copy.deepcopy(model)
            errors = []
            for i, block in enumerate(quantized.layers):
                layer = model.layers[i].mlp
                if method == "rtn":
                    block.mlp = layer.quantized(quant)
                else:  # clip only: no channel scaling (alpha = 0), to show what each half gives
                    alphas = (0.0,) if "clip" in method else ALPHAS
                    block.mlp, _ = quantize_awq(layer, quant, calibration[i], alphas=alphas)
                errors.append(layer_error(layer, block.mlp, held_out[i])[0])
            loss = evaluate(quantized, held_out_ids, settings)
            rows.append(
                (
                    f"int{quant.bits}",
                    quant.group_size,
                    method,
                    *(f"{e:.3e}" for e in errors),
                    f"{loss:.4f}",
                    f"{math.exp(loss):.4f}",
                    f"{loss - fp32_loss:+.4f}",
                )
            )
            bar.update(f"int{quant.bits} g{quant.group_size} {method}")
    rows.append(("fp32", "-", "-", *("0" for _ in model.layers), f"{fp32_loss:.4f}", f"{math.exp(fp32_loss):.4f}", "0"))
    print(
        format_table(
            (
                "bits",
                "group",
                "method",
                *(f"block {i} error" for i in range(len(model.layers))),
                "held-out loss",
                "perplexity",
                "loss vs fp32",
            ),
            rows,
            title=(
                f"tiny-lm FFNs: relative output error on {held_out[0].shape[0]} held-out tokens per block "
                f"(calibration: {calibration[0].shape[0]} training-text tokens); perplexity per byte, held-out text"
            ),
        )
    )
    if args.write:
        write(args.write, model, calibration, held_out)
    return 0


def write(directory, model, calibration, held_out) -> None:
    from pathlib import Path

    from safetensors.torch import save_file

    from deamoe_trt._io import atomic_path
    from deamoe_trt.layer import DeaMoEStack

    out = Path(directory)
    DeaMoEStack.from_layers([block.mlp for block in model.layers]).save_pretrained(out / "ffn")
    for name, inputs in (("calibration", calibration), ("held-out", held_out)):
        with atomic_path(out / f"{name}.safetensors") as tmp:
            save_file({f"layers.{i}.hidden_states": x.contiguous() for i, x in enumerate(inputs)}, str(tmp))
    print(f"wrote {out / 'ffn'}, {out / 'calibration.safetensors'}, {out / 'held-out.safetensors'}")


if __name__ == "__main__":
    sys.exit(main())
