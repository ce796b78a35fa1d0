"""AWQ against round to nearest on the shipped tiny language model's trained DeaMoE layers.

Each block's DeaMoE FFN input (the post-attention RMSNorm's output) is captured on windows
of the training text (calibration) and of the held-out last 10% of *Persuasion* (held out,
never seen by the search). The model is quantized with round to nearest, with AWQ's
language-model path (deamoe_trt.quantize.lm.quantize_lm_awq, as `deamoe-trt quantize
--method awq` runs it: gate_up input scales folded into the RMSNorm, down scales, clipping)
from the calibration windows, and with AWQ's clipping search alone (no channel scaling); the
table gives, per bit width and group size, each block's relative output error on the
held-out inputs and the held-out perplexity of the whole model with every block quantized
so. Attention, embeddings and routers stay fp32 (AWQ's fold only multiplies norm weights and
router columns by powers of two, which computes the same float model).

--write DIR also writes the three FFN layers as one deamoe-trt checkpoint with its
calibration and held-out inputs, for the CLI:

    deamoe-trt quantize DIR/ffn -o DIR/ffn-awq --bits 4 --group-size 16 --method awq \\
        --calibration DIR/calibration.safetensors --eval DIR/held-out.safetensors

    python samples/python/awq_lm.py [--model DIR] [--windows N] [--write DIR]
"""

from __future__ import annotations

import argparse
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


def run(args) -> int:
    import torch

    from deamoe_trt.console import Progress, format_table
    from deamoe_trt.lm.checkpoint import load_lm
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.quantize.awq import quantize_awq
    from deamoe_trt.quantize.lm import calibration_windows, ffn_inputs, quantize_lm_awq
    from deamoe_trt.summary import layer_error
    from deamoe_trt.train.lm import TrainSettings, evaluate, shipped_text, split_text

    torch.set_num_threads(1)  # many small matmuls: one thread is faster than two on a busy machine
    loaded = load_lm(args.model)
    model = loaded.model
    settings = TrainSettings()
    train_ids, held_out_ids = split_text(shipped_text(), loaded.tokenizer, settings.val_fraction)
    calibration_ids = torch.cat(calibration_windows(train_ids, settings.seq_len, args.windows))
    calibration = ffn_inputs(model, calibration_windows(train_ids, settings.seq_len, args.windows))
    held_out = ffn_inputs(model, calibration_windows(held_out_ids, settings.seq_len, 16))
    blocks = model.moe_layers()
    fp32_loss = evaluate(model, held_out_ids, settings)
    variants = [QuantConfig(bits, gs) for bits in (4, 8) for gs in (16, 32)]
    bar = Progress(3 * len(variants), "awq_lm")
    rows = []
    for quant in variants:
        awq_quant = QuantConfig(quant.bits, quant.group_size, "awq")
        for method in ("rtn", "awq", "awq, clip only"):
            # Each quantized model comes from DeaMoELM.quantized, so its config says how it
            # is quantized (as `deamoe-trt quantize` writes it); the error is measured against
            # the float FFN it stands for, on the inputs that FFN receives.
            if method == "rtn":
                quantized, reference, scales = model.quantized(quant), model, {}
            elif method == "awq":  # the LM path: gate_up input scales, down scales, clipping
                result = quantize_lm_awq(model, awq_quant, calibration_ids, progress=False)
                quantized, reference, scales = result.model, result.folded, result.input_scales
            else:  # no channel scaling (alpha = 0), to show what the scales add to clipping
                ffns = {
                    i: quantize_awq(model.layers[i].mlp, awq_quant, calibration[i], alphas=(0.0,))[0] for i in blocks
                }
                quantized, reference, scales = model.quantized(awq_quant, ffns), model, {}
            errors = []
            for i in blocks:
                x = held_out[i] / scales[i].to(held_out[i].dtype) if i in scales else held_out[i]
                errors.append(layer_error(reference.layers[i].mlp, quantized.layers[i].mlp, x)[0])
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
    rows.append(("fp32", "-", "-", *("0" for _ in blocks), f"{fp32_loss:.4f}", f"{math.exp(fp32_loss):.4f}", "0"))
    print(
        format_table(
            (
                "bits",
                "group",
                "method",
                *(f"block {i} error" for i in blocks),
                "held-out loss",
                "perplexity",
                "loss vs fp32",
            ),
            rows,
            title=(
                f"tiny-lm FFNs: relative output error on {held_out[blocks[0]].shape[0]} held-out tokens per block "
                f"(calibration: {calibration[blocks[0]].shape[0]} training-text tokens); "
                "perplexity per byte, held-out text"
            ),
        )
    )
    if args.write:
        write(args.write, model, [calibration[i] for i in blocks], [held_out[i] for i in blocks])
    return 0


def write(directory, model, calibration, held_out) -> None:
    from pathlib import Path

    from safetensors.torch import save_file

    from deamoe_trt._io import atomic_path
    from deamoe_trt.layer import DeaMoEStack

    out = Path(directory)
    DeaMoEStack.from_layers([model.layers[i].mlp for i in model.moe_layers()]).save_pretrained(out / "ffn")
    for name, inputs in (("calibration", calibration), ("held-out", held_out)):
        with atomic_path(out / f"{name}.safetensors") as tmp:
            save_file({f"layers.{i}.hidden_states": x.contiguous() for i, x in enumerate(inputs)}, str(tmp))
    print(f"wrote {out / 'ffn'}, {out / 'calibration.safetensors'}, {out / 'held-out.safetensors'}")


if __name__ == "__main__":
    sys.exit(main())
