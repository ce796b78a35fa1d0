"""What re-quantizing MXFP4 experts to int4 or int8 costs, on held-out text.

gpt-oss ships its experts as MXFP4 (deamoe_trt.importers.mxfp4); deamoe-trt's kernels run
int4/int8 with one scale per group of columns (docs/quantization.md), so `quantize` on an
imported gpt-oss rounds the MXFP4 values once more. This sample measures that second
rounding on the shipped tiny language model (trained, so its held-out loss means something):
every DeaMoE FFN weight is stored as MXFP4 (round to nearest) and decoded, as an imported
gpt-oss checkpoint would be; that model is then quantized to int4 and int8 by round to
nearest (group size 32, MXFP4's block) and all are measured on the held-out last 10% of
*Persuasion* (loss per byte, the windows `train-tiny` validates on), with the relative
weight error against the MXFP4 values and the share of next-byte argmaxes that stay the
MXFP4 model's.

    python samples/python/mxfp4_int4.py [--model DIR] [--group-size 32]
"""

from __future__ import annotations

import argparse
import math
import sys

import _common

FFN_WEIGHTS = ("gate_up", "down")


def as_mxfp4(model):
    """model with every DeaMoE FFN weight rounded through MXFP4 (biases and routers as they are)."""
    import torch

    from deamoe_trt.importers.mxfp4 import decode_mxfp4, encode_mxfp4

    state = {}
    for name, tensor in model.state_dict().items():
        if ".mlp." in name and name.rsplit(".", 1)[-1] in FFN_WEIGHTS:
            tensor = decode_mxfp4(*encode_mxfp4(tensor), torch.float32).to(tensor.dtype)
        state[name] = tensor
    twin = type(model)(model.config, dtype=model.dtype, device="meta")
    twin.load_state_dict(state, assign=True)
    twin.tie_weights()
    return twin.materialize_rope().eval()


def weight_error(model, reference) -> float:
    """||W - W_ref|| / ||W_ref|| over every DeaMoE FFN weight (model's dequantized)."""
    import torch

    from deamoe_trt.quant import dequantize

    num = den = 0.0
    for i in reference.moe_layers():
        for part in ("departments", "experts", "shared_experts"):
            ref, got = getattr(reference.layers[i].mlp, part), getattr(model.layers[i].mlp, part)
            if ref is None:
                continue
            for w in FFN_WEIGHTS:
                want = getattr(ref, w).detach().float()
                q = model.config.quantization
                if q is None:
                    have = getattr(got, w).detach().float()
                else:
                    packed = getattr(got, w)
                    have = dequantize(packed.qweight, packed.scales, q.bits, q.group_size, torch.float32)
                num += float((have - want).pow(2).sum())
                den += float(want.pow(2).sum())
    return math.sqrt(num / den)


def agreement(model, reference, tokenizer) -> float:
    """Share of held-out positions whose argmax next byte equals reference's."""
    import torch

    from deamoe_trt.train.lm import TrainSettings, shipped_text, split_text

    _, held_out = split_text(shipped_text(), tokenizer, TrainSettings().val_fraction)
    length = model.config.max_position_embeddings
    same = total = 0
    with torch.no_grad():
        for start in range(0, held_out.numel() - length, length):
            ids = held_out[start : start + length][None]
            a, b = model(ids).logits.argmax(-1), reference(ids).logits.argmax(-1)
            same += int((a == b).sum())
            total += a.numel()
    return same / total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(_common.DEFAULT_MODEL), help="tiny LM checkpoint directory")
    parser.add_argument("--group-size", type=int, default=32, help="int4/int8 columns per scale (default 32)")
    args = parser.parse_args()

    import torch

    from deamoe_trt.console import format_table
    from deamoe_trt.lm import load_lm
    from deamoe_trt.quant import QuantConfig
    from deamoe_trt.quantize.lm import held_out_loss, quantize_lm

    torch.set_num_threads(1)
    loaded = load_lm(args.model)
    fp32 = loaded.model.eval()
    mxfp4 = as_mxfp4(fp32)
    models = {
        "fp32 (as trained)": fp32,
        "MXFP4": mxfp4,
        f"int8 g{args.group_size} from MXFP4": quantize_lm(mxfp4, QuantConfig(8, args.group_size)),
        f"int4 g{args.group_size} from MXFP4": quantize_lm(mxfp4, QuantConfig(4, args.group_size)),
        f"int4 g{args.group_size} from fp32": quantize_lm(fp32, QuantConfig(4, args.group_size)),
    }
    rows = []
    for name, model in models.items():
        loss = held_out_loss(model, loaded.tokenizer)
        rows.append(
            (
                name,
                f"{loss:.4f}",
                f"{math.exp(loss):.3f}",
                f"{100 * weight_error(model, mxfp4):.2f}%",
                f"{100 * agreement(model, mxfp4, loaded.tokenizer):.2f}%",
            )
        )
    print(
        format_table(
            ("FFN weights", "held-out loss", "perplexity", "weight error vs MXFP4", "argmax = MXFP4"),
            rows,
            title="MXFP4 -> int4/int8 on the tiny LM's held-out text (per byte)",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_common.main_guard("mxfp4_int4.py", main))
